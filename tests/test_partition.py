"""Partitioned blocks ("partition:<F>" plan strategies, hf_ckpt.strategies.partition.graph): each block's forward and
backward graphs split by torch's min-cut partitioner, run in eager mode. Gradients equal the model's own (dropout
replayed from the saved RNG state), the recompute is measured, memory falls with the budget, a call that cannot be
traced falls back to full checkpointing with one warning, and bad input is named at the call."""

import warnings

import pytest
import torch
from torch import nn

import hf_ckpt
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.measure import measure_step
from hf_ckpt.strategies.partition.graph import _traces, partition_unavailable, partitioned_checkpoint
from helpers import VOCAB, max_grad_diff, recomputed_in_step, tiny_gpt2, tiny_llama, tiny_t5, train_step

pytestmark = pytest.mark.skipif(partition_unavailable() is not None, reason=str(partition_unavailable()))


def _batch(seq: int = 16):
    ids = torch.randint(1, VOCAB, (2, seq), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def _partition_all(model, budget: float) -> hf_ckpt.CheckpointPlan:
    return hf_ckpt.CheckpointPlan((f"partition:{budget:g}",) * len(find_blocks(model)))


@pytest.mark.parametrize("budget", [0.0, 0.25, 0.5])
@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2, tiny_t5], ids=["llama", "gpt2-dropout", "t5-dropout"])
def test_partitioned_blocks_give_the_gradients_of_no_checkpointing_and_are_measured_recomputed(build, budget):
    """At every budget, dropout included: torch.compile's partitioner draws masks afresh where its budget makes it
    recompute a random op (pytorch/pytorch#190758); a partitioned block replays the forward's."""
    model, batch = build(), _batch()
    reference = train_step(model, batch)
    hf_ckpt.enable(model, plan=_partition_all(model, budget))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first-step probe sees the recompute: no "not recomputed" warning
        recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == list(range(len(find_blocks(model))))
    assert hf_ckpt.checkpointed_layers(model) == recomputed
    hf_ckpt.disable(model)
    assert max_grad_diff(reference, grads) <= 1e-6


def test_memory_falls_and_recompute_rises_as_the_partition_budget_falls():
    model, batch = tiny_llama(layers=2), _batch(64)
    none = measure_step(model, batch)
    measured = {}
    for budget in (1.0, 0.5, 0.0):
        hf_ckpt.enable(model, plan=_partition_all(model, budget))
        measured[budget] = measure_step(model, batch)
        hf_ckpt.disable(model)
    assert none.retained_bytes > measured[1.0].retained_bytes >= measured[0.5].retained_bytes > measured[0.0].retained_bytes
    assert none.flops <= measured[1.0].flops <= measured[0.5].flops < measured[0.0].flops


def test_a_trace_is_made_once_per_call_signature():
    model = tiny_llama(layers=2)
    hf_ckpt.enable(model, plan=_partition_all(model, 0.5))
    train_step(model, _batch(16))
    train_step(model, _batch(16))
    block = find_blocks(model)[0].module
    assert len(_traces[block]) == 1
    train_step(model, _batch(24))
    assert len(_traces[block]) == 2
    hf_ckpt.disable(model)


def test_without_grad_the_block_runs_as_it_is():
    model, batch = tiny_llama(layers=2), _batch()
    with torch.no_grad():
        expected = model(**batch).logits
    hf_ckpt.enable(model, plan=_partition_all(model, 0.5))
    with torch.no_grad():
        got = model(**batch).logits
    hf_ckpt.disable(model)
    assert torch.equal(expected, got)
    assert all(not _traces.get(b.module) for b in find_blocks(model))


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x, scale):
        return self.linear(x) * scale.factor


class _Scale:
    factor = 3.0


def test_a_call_that_cannot_be_traced_is_checkpointed_in_full_with_one_warning():
    module, x = _Scaled(), torch.randn(2, 4, requires_grad=True)
    expected = module(x, _Scale())
    with pytest.warns(hf_ckpt.HfCkptWarning) as caught:
        got = partitioned_checkpoint(module.__call__, x, _Scale(), budget=0.5)
        partitioned_checkpoint(module.__call__, x, _Scale(), budget=0.5)
    assert [str(w.message) for w in caught] == [
        "partition: _Scaled is checkpointed in full instead of partitioned: an argument of type _Scale is neither a "
        "tensor nor a plain constant."
    ]
    assert torch.equal(expected, got)
    got.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.autograd.grad(expected.sum(), x)[0])


def test_bad_partition_strategies_and_combinations_are_named_at_the_call():
    with pytest.raises(ValueError) as error:
        hf_ckpt.CheckpointPlan(("partition:1.5",))
    assert str(error.value) == (
        "the budget of plan strategy 'partition:1.5' ('partition:<F>' or 'partition:<F>:norms') must be a number "
        "in [0, 1] (the partitioner's activation_memory_budget); got 1.5"
    )
    with pytest.raises(ValueError, match=r"'partition:0.5:norm' \('partition:<F>' or 'partition:<F>:norms'\) .*got '0.5:norm'"):
        hf_ckpt.CheckpointPlan(("partition:0.5:norm",))
    with pytest.raises(ValueError, match=r"must be a number in \[0, 1\].*got 'half'"):
        hf_ckpt.CheckpointPlan(("partition:half",))
    assert hf_ckpt.CheckpointPlan(("partition:0.50", "partition:1", "partition:.5:norms")).strategies == (
        "partition:0.5", "partition:1", "partition:0.5:norms")
    model = tiny_llama(layers=2)
    plan = _partition_all(model, 0.5)
    for options, named in (({"use_reentrant": True}, "use_reentrant=True"), ({"offload": True}, "offload=True")):
        with pytest.raises(ValueError) as error:
            hf_ckpt.enable(model, plan=plan, **options)
        assert str(error.value) == (
            f"a plan with 'partition:<F>' blocks cannot be combined with {named}: a partitioned block runs its own "
            "forward and backward graphs, not torch.utils.checkpoint. Drop them, or make the plan without partitions."
        )
        assert "_hf_ckpt_state" not in model.__dict__  # a call that raises changes nothing
        assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    with pytest.raises(ValueError) as error:
        hf_ckpt.plan(model, _batch(), 0.5, strategies=("none", "partitions"))
    assert str(error.value) == (
        "strategies must be a non-empty subset of none, selective, full, oplevel, partition, outside; got ['none', 'partitions']"
    )


@pytest.mark.slow
def test_the_planner_may_partition_blocks_and_its_plan_holds_when_measured(tmp_path):
    model, batch = tiny_gpt2(layers=2), _batch(64)
    none = measure_step(model, batch)
    plan = hf_ckpt.plan(model, batch, 0.3, strategies=("none", "full", "partition"))
    assert all(s == "none" or s == "full" or s.startswith("partition:") for s in plan.strategies), plan
    assert any(s.startswith("partition:") for s in plan.strategies), plan
    plan.save(tmp_path / "plan.json")
    hf_ckpt.enable(model, plan=str(tmp_path / "plan.json"))
    measured = measure_step(model, batch)
    hf_ckpt.disable(model)
    assert measured.retained_bytes <= plan.budget_bytes == int(0.3 * plan.baseline_bytes)
    assert measured.retained_bytes == plan.predicted_bytes
    assert measured.flops - none.flops == plan.predicted_recompute_flops
    full = hf_ckpt.plan(model, batch, 0.3, strategies=("none", "full"))
    assert plan.predicted_recompute_flops <= full.predicted_recompute_flops


def test_a_partitioned_block_keeps_its_hooks_on_a_stack_that_hands_over_call():
    """Stacks (transformers < 4.52) hand ``layer.__call__`` over: its hooks run once per call, around the graphs."""
    module, x = nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    calls = []
    module.register_forward_hook(lambda m, a, o: calls.append(tuple(o.shape)))
    out = partitioned_checkpoint(module.__call__, x, budget=0.0)
    assert calls == [(2, 4)]
    assert "forward" not in vars(module)
    assert torch.allclose(out, torch.nn.functional.linear(x, module.weight, module.bias))
    out.sum().backward()
    assert torch.allclose(module.weight.grad, torch.ones(2, 4).T @ x.detach())


@pytest.mark.slow
def test_the_graphplan_bench_setting_plans_with_partitions_among_the_options():
    from hf_ckpt.measure.settings import parse_setting

    model, batch = tiny_gpt2(layers=2), _batch(64)
    setting = parse_setting("graphplan:0.3")
    assert setting.name == "graphplan:0.3"
    setting.prepare(model, batch)
    assert any(s.startswith("partition:") for s in setting.details["strategies"]), setting.details
    none = measure_step(model, batch)
    setting.apply(model)
    measured = measure_step(model, batch)
    setting.remove(model)
    assert measured.retained_bytes <= setting.details["budget_bytes"] == int(0.3 * none.retained_bytes)


def test_a_trace_keeps_neither_its_module_nor_its_weights_alive():
    import gc
    import weakref

    model, batch = tiny_llama(layers=2), _batch()
    hf_ckpt.enable(model, plan=_partition_all(model, 0.5))
    train_step(model, batch)
    block = weakref.ref(find_blocks(model)[0].module)
    assert len(_traces[block()]) == 1
    weight = weakref.ref(model.model.layers[0].mlp.up_proj.weight)
    del model, batch
    gc.collect()
    assert block() is None and weight() is None


def test_a_call_that_failed_to_trace_is_not_traced_again(monkeypatch):
    import hf_ckpt.strategies.partition.graph as partition

    attempts = []

    def failing(*args, **kwargs):
        attempts.append(1)
        raise partition._Untraceable("tracing it failed (DataDependentOutputException: aten._local_scalar_dense)")

    monkeypatch.setattr(partition, "_trace", failing)
    module, x = nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    with pytest.warns(hf_ckpt.HfCkptWarning, match="Linear is checkpointed in full instead of partitioned: tracing it"):
        for _ in range(3):
            partitioned_checkpoint(module.__call__, x, budget=0.5).sum().backward()
    assert attempts == [1]
