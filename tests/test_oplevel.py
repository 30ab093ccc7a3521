"""Op-level plans (hf_ckpt.strategies.oplevel): exact gradients, measured memory within the budget, predicted recompute that
holds, plans that round-trip through JSON and models that pickle, and bad input named at the call."""

import copy
import io
import json
import pickle

import pytest
import torch

import hf_ckpt
from hf_ckpt.measure import measure_step
from hf_ckpt.meters.flops import count_flops
from hf_ckpt.measure.settings import parse_setting
from hf_ckpt.planning.menus.frontier import frontier
from hf_ckpt.planning.menus.oplevel import profile_ops
from hf_ckpt.strategies.oplevel import OpPolicy
from helpers import VOCAB, max_grad_diff, recomputed_in_step, tiny_gpt2, tiny_llama, train_step
from torch_capabilities import requires

pytestmark = requires("checkpoint.selective")

OPLEVEL = ("none", "selective", "full", "oplevel")


def _batch(seq: int = 32):
    ids = torch.randint(1, VOCAB, (2, seq), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(layers=4), _batch()


@pytest.fixture(scope="module")
def half_plan(llama):
    model, batch = llama
    return hf_ckpt.plan(model, batch, 0.5, strategies=OPLEVEL)


def _middle_policy_plan(model, batch):
    """A plan applying, on every block, an op-level policy that keeps some but not all of the FLOP-bearing ops."""
    (profile,) = profile_ops(model, batch)
    partial = [p for p in frontier(profile) if 0 < p.avoided_flops < profile.recompute_flops]
    middle = partial[len(partial) // 2]
    num_blocks = len(hf_ckpt.runtime.blocks.find_blocks(model))
    return hf_ckpt.CheckpointPlan(strategies=("oplevel:mid",) * num_blocks, policies={"mid": middle.saved})


def test_oplevel_policy_gradients_equal_no_checkpointing_exactly():
    model, batch = tiny_llama(layers=3), _batch(16)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, plan=_middle_policy_plan(model, batch))
    recomputed, grads = recomputed_in_step(model, batch)
    hf_ckpt.disable(model)
    assert recomputed == [0, 1, 2]
    assert max_grad_diff(reference, grads) <= 1e-6  # 0.0 on most releases; 4.57 rounds differently


def test_oplevel_policy_replays_dropout_like_full_checkpointing():
    """GPT-2 with dropout 0.1: the recompute replays the RNG; the gradients are those of full checkpointing, bit
    for bit (which differ from no checkpointing by float rounding in the order backward accumulates)."""
    model, batch = tiny_gpt2(layers=3), _batch(16)
    reference = train_step(model, batch)
    hf_ckpt.enable(model)
    full = train_step(model, batch)
    hf_ckpt.disable(model)
    hf_ckpt.enable(model, plan=_middle_policy_plan(model, batch))
    recomputed, grads = recomputed_in_step(model, batch)
    hf_ckpt.disable(model)
    assert recomputed == [0, 1, 2]
    assert max_grad_diff(full, grads) == 0.0
    assert max_grad_diff(reference, grads) <= 1e-6


def test_oplevel_plan_measured_memory_within_budget_and_predictions_hold(llama, half_plan):
    model, batch = llama
    none = measure_step(model, batch)
    hf_ckpt.enable(model, plan=half_plan)
    measured = measure_step(model, batch)
    hf_ckpt.disable(model)
    assert any(s.startswith("oplevel:") for s in half_plan.strategies), half_plan
    assert measured.retained_bytes <= half_plan.budget_bytes
    assert half_plan.budget_bytes == int(0.5 * half_plan.baseline_bytes)
    assert measured.retained_bytes == half_plan.predicted_bytes
    assert measured.flops - none.flops == half_plan.predicted_recompute_flops


def test_oplevel_plan_recomputes_less_than_the_block_level_plan(llama, half_plan):
    model, batch = llama
    block_plan = hf_ckpt.plan(model, batch, 0.5)
    assert half_plan.predicted_recompute_flops < block_plan.predicted_recompute_flops


def test_profile_counts_each_saved_op_as_avoided_recompute(llama):
    model, batch = llama
    (profile,) = profile_ops(model, batch)
    full = frontier(profile)[-1]
    num_blocks = len(hf_ckpt.runtime.blocks.find_blocks(model))
    none = measure_step(model, batch)
    flops = {}
    for name, saved in (("nothing", ()), ("everything", full.saved)):
        plan = hf_ckpt.CheckpointPlan(strategies=("oplevel:p",) * num_blocks, policies={"p": saved or ("aten.mm.default#999",)})
        hf_ckpt.enable(model, plan=plan)
        flops[name] = measure_step(model, batch).flops - none.flops
        hf_ckpt.disable(model)
    assert flops["nothing"] == num_blocks * profile.recompute_flops
    assert flops["everything"] == num_blocks * (profile.recompute_flops - full.avoided_flops) == 0


def _recompute_elements(model, batch, plan=None):
    """Elementwise output elements of one step, with ``plan`` applied (None: no checkpointing)."""
    if plan is not None:
        hf_ckpt.enable(model, plan=plan)
    try:
        with count_flops() as counted:
            train_step(model, batch)
    finally:
        hf_ckpt.disable(model)
    return counted.elementwise


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_elementwise_recompute_is_counted_per_op_and_saving_it_keeps_gradients_exact(build):
    """FLOP counts are blind to the norms/activations selective recompute reruns: the profile counts their
    output elements, the measured step agrees op by op, and a policy keeping elementwise outputs too (the
    frontier's last point) recomputes fewer of them with gradients equal to full checkpointing's."""
    model, batch = build(layers=2), {**_batch(16), "use_cache": False}  # no cache writes in the `none` step
    (profile,) = profile_ops(model, batch)
    num_blocks = 2
    none = _recompute_elements(model, batch)
    full = _recompute_elements(model, batch, hf_ckpt.CheckpointPlan(strategies=("full",) * num_blocks))
    assert profile.recompute_elementwise > 0
    assert full - none == num_blocks * profile.recompute_elementwise
    selective = _recompute_elements(model, batch, hf_ckpt.CheckpointPlan(strategies=("selective",) * num_blocks))
    assert selective - none == num_blocks * profile.selective_elementwise > 0  # selective is not free
    last = frontier(profile)[-1]
    assert last.avoided_elementwise > 0 and last.avoided_flops == profile.recompute_flops
    plan = hf_ckpt.CheckpointPlan(strategies=("oplevel:all",) * num_blocks, policies={"all": last.saved})
    kept = _recompute_elements(model, batch, plan)
    assert kept - none == num_blocks * (profile.recompute_elementwise - last.avoided_elementwise)
    assert kept - none < selective - none
    hf_ckpt.enable(model)
    reference = train_step(model, batch)
    hf_ckpt.disable(model)
    hf_ckpt.enable(model, plan=plan)
    recomputed, grads = recomputed_in_step(model, batch)
    hf_ckpt.disable(model)
    assert recomputed == [0, 1]
    assert max_grad_diff(reference, grads) <= 1e-6


def test_frontier_never_offers_ops_written_in_place_or_writing_in_place():
    """GPT-2's dropout (bernoulli_, div_ into its own buffer) must not be saved: code uses the mutated tensor."""
    model, batch = tiny_gpt2(layers=1), _batch(16)
    (profile,) = profile_ops(model, batch)
    unsafe = {op.key for op in profile.ops if op.written or op.mutates}
    assert any(key.startswith("aten.bernoulli_") for key in unsafe)
    offered = {key for point in frontier(profile) for key in point.saved}
    assert offered and not offered & unsafe


def test_frontier_thinning_keeps_the_ends_and_at_most_the_limit(llama):
    model, batch = llama
    (profile,) = profile_ops(model, batch)
    points = frontier(profile)
    thinned = frontier(profile, max_points=8)
    corners = len({point.avoided_flops for point in points})
    assert len(points) > 9 + corners and 2 <= len(thinned) <= 9 + corners
    assert thinned[0] == points[0] and thinned[-1] == points[-1]
    assert all(point in points for point in thinned)
    # every change of the kept matmuls stays on offer, at its smallest bytes
    for flops in {point.avoided_flops for point in points}:
        smallest = min((p for p in points if p.avoided_flops == flops), key=lambda p: p.bytes)
        assert smallest in thinned


def test_plan_json_round_trip_applies_the_same_policies(llama, half_plan, tmp_path):
    model, batch = llama
    data = json.loads(half_plan.to_json())
    used = {s.partition(":")[2] for s in half_plan.strategies if s.startswith("oplevel:")}
    assert set(data["policies"]) == used
    assert all(isinstance(key, str) and "#" in key for saved in data["policies"].values() for key in saved)
    assert hf_ckpt.CheckpointPlan.from_dict(data) == half_plan
    path = tmp_path / "plan.json"
    half_plan.save(path)
    hf_ckpt.enable(model, plan=str(path))
    loaded = measure_step(model, batch)
    hf_ckpt.disable(model)
    hf_ckpt.enable(model, plan=half_plan)
    direct = measure_step(model, batch)
    hf_ckpt.disable(model)
    assert (loaded.retained_bytes, loaded.flops) == (direct.retained_bytes, direct.flops)
    assert "oplevel:" in str(half_plan) and "keeps aten." in str(half_plan)


def test_model_with_oplevel_policy_pickles_and_deep_copies(llama, half_plan):
    model, batch = llama
    hf_ckpt.enable(model, plan=half_plan)
    try:
        reference = train_step(model, batch)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model)), torch.load(buffer, weights_only=False)]
        for clone in copies:
            assert hf_ckpt.checkpointed_layers(clone) == hf_ckpt.checkpointed_layers(model)
            assert max_grad_diff(reference, train_step(clone, batch)) == 0.0
    finally:
        hf_ckpt.disable(model)


def test_bad_input_names_the_argument(llama):
    model, batch = llama
    with pytest.raises(TypeError, match="saved must be a list"):
        OpPolicy("aten.mm.default#0")
    with pytest.raises(ValueError, match=r"saved must hold op occurrences.*'mm'"):
        OpPolicy(["mm"])
    with pytest.raises(ValueError, match=r"oplevel:<name>.*policies.*'oplevel:missing'"):
        hf_ckpt.CheckpointPlan(strategies=("oplevel:missing",))
    with pytest.raises(ValueError, match="policies keys"):
        hf_ckpt.CheckpointPlan(strategies=("none",), policies={"a:b": ["aten.mm.default#0"]})
    with pytest.raises(ValueError, match=r"strategies.*none, selective, full, oplevel"):  # argument, accepted values
        hf_ckpt.plan(model, batch, 0.5, strategies=("none", "op-level"))
    with pytest.raises(TypeError, match="sample_inputs must be a mapping"):
        profile_ops(model, [batch])
    with pytest.raises(ValueError, match=r"got oplevel:2"):
        parse_setting("oplevel:2")
    with pytest.raises(ValueError, match=r"activation_memory_budget.* got compile:half"):
        parse_setting("compile:half")


def test_bench_rows_of_compile_show_the_compiled_figures():
    """`hf-ckpt bench` runs compile:F eagerly under its dispatch modes; the row must show what the compiled graphs
    saved and counted (the setting's own figures), not the eager step's, and no peak it did not measure."""
    from hf_ckpt.measure.bench import run_benchmark
    from hf_ckpt.measure.report import format_table, rows
    from hf_ckpt.measure.settings import Setting

    model, batch = tiny_llama(layers=2), _batch(16)
    own = {"saved_bytes": 12345, "graph_flops": 6789}
    fake = Setting("compile:0.5", "stands for compile:0.5", apply=lambda m: None, remove=lambda m: None,
                    details=own)
    report = run_benchmark(model, batch, ["none", fake], repeat=1, warmup=0)
    row = {r["setting"]: r for r in rows(report)}["compile:0.5"]
    none = report["none"].measurement
    assert (row["retained_bytes"], row["flops"], row["peak_bytes"]) == (12345, 6789, None)
    assert none.retained_bytes != 12345 and none.flops != 6789
    line = next(line for line in format_table(report).splitlines() if line.startswith("| compile:0.5"))
    assert "0.01" in line and " - " in line  # 12345 B in MiB; the peak not measured


def test_a_policy_keeping_nothing_is_plain_checkpointing():
    """No selective machinery for an empty policy: same memory, FLOPs, recomputed blocks and gradients as full."""
    model, batch = tiny_llama(layers=2), _batch(16)
    measured = {}
    for name, plan in (("full", hf_ckpt.CheckpointPlan(strategies=("full", "full"))),
                       ("empty", hf_ckpt.CheckpointPlan(strategies=("oplevel:e",) * 2, policies={"e": []}))):
        hf_ckpt.enable(model, plan=plan)
        step = measure_step(model, batch)
        measured[name] = (step.retained_bytes, step.flops, step.recomputed_blocks, train_step(model, batch))
        hf_ckpt.disable(model)
    assert measured["empty"][:3] == measured["full"][:3]
    assert measured["empty"][2] == [0, 1]
    assert max_grad_diff(measured["full"][3], measured["empty"][3]) == 0.0
