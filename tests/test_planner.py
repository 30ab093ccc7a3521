"""``hf_ckpt.plan``: fits the budget (measured), at no more recompute than every_n_layers, predictions that hold."""

import re
import warnings

import pytest
import torch

import hf_ckpt
from hf_ckpt.measure import measure_step
from hf_ckpt.runtime.util.units import format_bytes
from hf_ckpt.planning.planner import profile_blocks, solve
from helpers import VOCAB, tiny_llama
from test_head import needs_loss_function


@pytest.fixture(scope="module")
def workload():
    model = tiny_llama(layers=6)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (2, 32), generator=generator)
    return model, {"input_ids": ids, "labels": ids}


def _measured(model, batch, **options):
    hf_ckpt.disable(model)
    if options:
        hf_ckpt.enable(model, **options)
    result = measure_step(model, batch)
    hf_ckpt.disable(model)
    return result


@pytest.fixture(scope="module")
def every_n(workload):
    """Measured (retained bytes, extra FLOPs) of every_n_layers = 1..6, and the no-checkpointing measurement."""
    model, batch = workload
    none = _measured(model, batch)
    costs = {}
    for n in range(1, 7):
        m = _measured(model, batch, every_n_layers=n)
        costs[n] = (m.retained_bytes, m.flops - none.flops)
    return none, costs


def _cheapest_fitting(costs, budget_bytes):
    fitting = [flops for retained, flops in costs.values() if retained <= budget_bytes]
    assert fitting, "full checkpointing always fits these budgets"
    return min(fitting)


@pytest.fixture(scope="module")
def plans(workload):
    model, batch = workload
    return {fraction: hf_ckpt.plan(model, batch, fraction) for fraction in (0.25, 0.5, 0.75)}


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_plan_fits_the_budget_at_no_more_recompute_than_every_n_layers(workload, every_n, plans, fraction):
    model, batch = workload
    none, costs = every_n
    plan = plans[fraction]
    measured = _measured(model, batch, plan=plan)

    assert measured.retained_bytes <= plan.budget_bytes == int(fraction * plan.baseline_bytes)
    assert abs(plan.predicted_bytes - measured.retained_bytes) <= 0.10 * measured.retained_bytes
    assert plan.baseline_bytes == none.retained_bytes
    assert plan.predicted_recompute_flops == measured.flops - none.flops
    assert plan.predicted_recompute_flops <= _cheapest_fitting(costs, plan.budget_bytes)


def test_plan_is_strictly_cheaper_than_every_n_layers_somewhere(every_n, plans):
    _, costs = every_n
    assert any(p.predicted_recompute_flops < _cheapest_fitting(costs, p.budget_bytes) for p in plans.values())


def test_plan_leaves_the_model_as_found(workload):
    model, batch = workload
    hf_ckpt.enable(model, every_n_layers=3)
    model.eval()
    rng = torch.get_rng_state()
    grads = [p.grad for p in model.parameters()]
    hf_ckpt.plan(model, batch, 0.5)
    assert hf_ckpt.checkpointed_layers(model) == [0, 3]
    assert not model.training
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert torch.equal(torch.get_rng_state(), rng)
    hf_ckpt.disable(model)


def test_enable_with_budget_plans_and_applies(workload):
    model, batch = workload
    hf_ckpt.enable(model, budget=0.5, sample_inputs=batch)
    measured = measure_step(model, batch)
    hf_ckpt.disable(model)
    baseline = _measured(model, batch).retained_bytes
    assert measured.retained_bytes <= 0.5 * baseline


def test_budget_in_bytes_and_an_impossible_budget(workload):
    model, batch = workload
    profile = profile_blocks(model, batch)
    assert solve(profile, profile.baseline_bytes) == ("none",) * 6
    smallest = profile.base_bytes + sum(min(v[i] for v in profile.retained.values()) for i in range(6))
    assert profile.predicted_bytes(solve(profile, smallest)) <= smallest
    with pytest.raises(ValueError, match=re.escape("no plan fits a budget of")) as raised:
        solve(profile, smallest - 1)
    message = str(raised.value)  # what the budget would have to be, and with which per-block strategies
    assert f"{smallest / 2**20:.2f} MiB" in message and "none, selective, full" in message


@pytest.mark.parametrize(
    "budget, error, named",
    [  # the argument, the accepted forms, the offending value
        (0.0, ValueError, ("budget", "(0, 1]", "0.0")),
        (1.5, ValueError, ("budget", "(0, 1]", "1.5")),
        (-5, ValueError, ("budget", "positive", "-5")),
        ("150%", ValueError, ("budget", "(0, 1]", "50%", "40GiB")),
        ("2 parsecs", ValueError, ("budget", "'2 parsecs'", "40GiB")),
        (True, TypeError, ("budget", "(0, 1]", "True")),
    ],
)
def test_bad_budget(workload, budget, error, named):
    model, batch = workload
    with pytest.raises(error) as raised:
        hf_ckpt.plan(model, batch, budget)
    missing = [part for part in named if part not in str(raised.value)]
    assert not missing, f"{missing} not in: {raised.value}"


def test_bad_strategies(workload):
    model, batch = workload
    with pytest.raises(ValueError, match=re.escape("none, selective, full, oplevel, partition, outside; got ['half']")):  # accepted, got
        hf_ckpt.plan(model, batch, 0.5, strategies=["half"])


def test_a_model_that_cannot_run_selective_is_planned_without_it():
    """A block that writes into a saved output makes selective unusable: the planner says why and does without."""
    from helpers import LegacyBlock, LegacyConfig, LegacyFuncModel

    class InPlaceBlock(LegacyBlock):
        def forward(self, hidden_states):
            scores = self.up(self.norm(hidden_states))
            scores += 1.0
            return hidden_states + self.down(torch.tanh(scores))

    torch.manual_seed(0)  # blocks large enough that checkpointing one saves more than its RNG state (5 KB)
    model = LegacyFuncModel(LegacyConfig(hidden_size=64))
    model.layers = torch.nn.ModuleList(InPlaceBlock(model.config.hidden_size) for _ in range(4))
    ids = torch.randint(1, model.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids.clone()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = profile_blocks(model, batch)
        plan = hf_ckpt.plan(model, batch, 0.5)
    assert set(profile.retained) == {"none", "full"}
    assert "aten.addmm.default" in profile.unusable["selective"]  # the reason names the op
    assert "selective" not in plan.strategies


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_under_the_callers_autocast_steps_and_plans_are_measured_as_a_training_loop_runs_them():
    """``with torch.autocast(...): hf_ckpt.plan(...)``: each profiled forward casts the weights anew and frees the
    casts backward does not keep, as a loop entering autocast around each forward (accelerate) does; measured
    retained bytes equal that loop's, and the plan's prediction equals its measured step."""
    from hf_ckpt.measure.workload import build_workload

    work = build_workload("llama", batch=2, seq=128, layers=4, hidden=64)
    model, batch = work.model, dict(work.batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plan = hf_ckpt.plan(model, batch, 0.5)
        inside = {strategy: _measured(model, batch, **options).retained_bytes
                  for strategy, options in (("none", {}), ("full", {"strategy": "full"}))}
    forward = model.forward
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(forward)  # as accelerate wraps it
    try:
        loop = {strategy: _measured(model, batch, **options).retained_bytes
                for strategy, options in (("none", {}), ("full", {"strategy": "full"}))}
        planned = _measured(model, batch, plan=plan).retained_bytes
    finally:
        model.forward = forward
    assert inside == loop
    assert plan.predicted_bytes == planned <= plan.budget_bytes
    assert plan.baseline_bytes == loop["none"] != hf_ckpt.plan(model, batch, 0.5).baseline_bytes  # not float32's


# --- the LM head, chunked when blocks alone cannot fit --------------------------------------------------------------

HEAD_VOCAB, HEAD_HIDDEN = 32_000, 64  # a vocabulary 500 times the width: the head's logits dominate


@pytest.fixture(scope="module")
def head_workload():
    import transformers

    config = transformers.LlamaConfig(hidden_size=HEAD_HIDDEN, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, vocab_size=HEAD_VOCAB,
                                      max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, HEAD_VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
    profile = profile_blocks(model, {"input_ids": ids, "labels": ids})
    smallest = profile.base_bytes + sum(min(v[i] for v in profile.retained.values()) for i in range(2))
    return model, {"input_ids": ids, "labels": ids}, smallest, profile.baseline_bytes


def _blocks_alone(smallest: int, baseline: int) -> str:
    """The planner's figure for the smallest memory blocks alone reach, as its error prints it (measured here: the
    figures differ between transformers releases)."""
    return re.escape(f"full is {format_bytes(smallest)} ({100 * smallest / baseline:.1f}%)")


def _gradients(model, batch):
    model.zero_grad(set_to_none=True)
    output = model(**batch)
    output.loss.backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters()}


@needs_loss_function
def test_plan_chunks_the_head_when_no_plan_of_the_blocks_fits(head_workload):
    model, batch, smallest, _ = head_workload
    plan = hf_ckpt.plan(model, batch, smallest - 1)
    # the default chunk: 128 tokens' logits vs hidden states (1 token) rises to the floor, the sequence (64)
    assert plan.head_chunk_size == 64
    assert plan.strategies == ("none", "none")  # the head's logits were the memory: no block needs checkpointing
    assert plan.predicted_bytes <= plan.budget_bytes == smallest - 1
    plain = _measured(model, batch)
    planned = _measured(model, batch, plan=plan)
    assert planned.retained_bytes == plan.predicted_bytes  # measured by the same tracker, on the same batch
    assert planned.flops - plain.flops == plan.predicted_recompute_flops > 0  # the head's projection, recomputed
    assert "head in chunks of 64 tokens" in plan.summary()


@needs_loss_function
def test_plan_leaves_the_head_whole_when_the_blocks_fit(head_workload):
    model, batch, smallest, _ = head_workload
    plan = hf_ckpt.plan(model, batch, smallest + 2**16)  # blocks interact by a few bytes: a little room
    assert plan.head_chunk_size is None and plan.strategies == ("full", "full")
    assert plan.predicted_recompute_flops == sum(plan.block_recompute_flops["full"])  # no head's FLOPs added


@needs_loss_function
def test_no_plan_even_with_the_chunked_head_says_both_figures(head_workload):
    model, batch, smallest, baseline = head_workload
    with pytest.raises(ValueError) as raised:
        hf_ckpt.plan(model, batch, 1000)
    assert re.fullmatch(re.escape(f"no plan fits a budget of 0.00 MiB (0.0% of the {format_bytes(baseline)} retained "
                                  "without checkpointing): the smallest activation memory reachable with none, "
                                  "selective, ") + _blocks_alone(smallest, baseline) +
                        r"; with the head in chunks of 64 tokens \(head_chunk_size\), the smallest is 0\.\d\d MiB",
                        str(raised.value)), str(raised.value)


@needs_loss_function
def test_a_loss_fn_keeps_the_head_whole(head_workload):
    """A ``loss_fn`` may read the logits, which the chunked head does not return: no plan then, as before."""
    model, batch, smallest, baseline = head_workload
    with pytest.raises(ValueError, match=r"^no plan fits a budget of .* " + _blocks_alone(smallest, baseline) + "$"):
        hf_ckpt.plan(model, batch, smallest - 1, loss_fn=lambda output: output.loss)


@needs_loss_function
def test_enable_with_a_budget_only_the_chunked_head_meets_trains_with_equal_gradients(head_workload):
    model, batch, smallest, _ = head_workload
    hf_ckpt.disable(model)
    reference, expected = _gradients(model, batch)
    hf_ckpt.enable(model, budget=smallest - 1, sample_inputs=batch)
    try:
        assert hf_ckpt.checkpointed_layers(model) == []
        output, grads = _gradients(model, batch)
        retained = measure_step(model, batch).retained_bytes
    finally:
        hf_ckpt.disable(model)
    assert output.get("logits") is None  # the head ran in chunks
    assert torch.allclose(output.loss, reference.loss, rtol=1e-6, atol=0)
    assert all(torch.allclose(grads[name], expected[name], rtol=1e-5, atol=1e-7) for name in expected)
    assert retained <= smallest - 1


def _solver_calls_outside(package) -> list[str]:
    """``file:line`` of each call of the solver (``solve_menu``, ``solve``) in ``package`` outside ``hf_ckpt/solver``."""
    import ast

    found = []
    for path in sorted(package.rglob("*.py")):
        if path.parent.name == "solver":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("solve", "solve_menu"):
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return found


def test_every_planner_solves_verifies_and_records_through_the_one_planning_path(monkeypatch):
    """``hf_ckpt.plan`` (block strategies, op-level, partition, outside), ``plan_for``, a budget planned at the first
    batch: each solves its menu in :func:`hf_ckpt.solver.verified.verified_plan` (the one solver, looked up there)
    and its plan is the one record's. ``max_seq`` makes no plan of the solver's: it compares whole-model rows
    (``full``, the head and MLP chunked, offloaded), with no choice per block (the slow test below). No module calls
    the solver elsewhere."""
    import functools
    from pathlib import Path

    from hf_ckpt.estimation import plan_for
    from hf_ckpt.planning.menus import oplevel
    from hf_ckpt.runtime.plans import model_signature
    from hf_ckpt.solver import verified
    from hf_ckpt.strategies import kinds, strategy_class

    assert _solver_calls_outside(Path(hf_ckpt.__file__).parent) == []
    solves, records = [], []
    solve_menu, record = verified.solve_menu, verified.PlanRecord.plan

    def counted_solve(*args, **kwargs):
        solves.append(len(args[0]))  # the menu's rows
        return solve_menu(*args, **kwargs)

    def counted_record(self, *args, **kwargs):
        records.append(record(self, *args, **kwargs))
        return records[-1]

    monkeypatch.setattr(verified, "solve_menu", counted_solve)
    monkeypatch.setattr(verified.PlanRecord, "plan", counted_record)
    # two partition budgets, not eleven: the path is the test's, not the partitions (tests/test_partition.py)
    monkeypatch.setattr(oplevel, "partition_options", functools.partial(oplevel.partition_options, budgets=(1.0, 0.0)))
    ids = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    model = tiny_llama(layers=2)
    finer = [s for s in ("oplevel", "partition", "outside") if s not in kinds() or strategy_class(s).unavailable() is None]
    for strategies in [("none", "selective", "full")] + [("none", "full", s) for s in finer]:
        solves.clear()
        made = hf_ckpt.plan(model, batch, 0.5, strategies=strategies)
        assert solves and made is records[-1] and made.made_for == model_signature(model), strategies
        assert set(solves) == {2 + (strategies[-1] == "outside")}  # a row per block, and one for outside
    solves.clear()
    made = plan_for(model.config, batch_size=2, seq_len=16, budget=0.5)
    assert solves == [2] and made is records[-1] and made.made_for == {}
    solves.clear()
    hf_ckpt.enable(model, budget="50%")
    try:
        model(**batch).loss.backward()
    finally:
        hf_ckpt.disable(model)
    assert solves == [2] and records[-1].strategies  # planned at the first batch, from the estimate


@pytest.mark.slow
def test_max_seq_makes_no_plan_of_the_solvers(monkeypatch):
    """``max_seq`` compares whole-model rows of the estimate (``full``, the head and MLP chunked, offloaded): it has
    no choice per block to solve, and calls neither the solver nor the planning path."""
    from hf_ckpt.estimation import max_seq
    from hf_ckpt.solver import knapsack, verified

    calls = []
    for module, name in ((verified, "solve_menu"), (knapsack, "solve_menu"), (verified.PlanRecord, "plan")):
        monkeypatch.setattr(module, name, lambda *args, _name=name, **kwargs: calls.append(_name))
    found = max_seq(tiny_llama(layers=2).config, device_memory="64MiB", dtype="float32", device="cpu", granularity=64)
    assert calls == [] and found.plan in found.lengths
