"""Op-level plans (hf_ckpt.oplevel): exact gradients, measured memory within the budget, predicted recompute that
holds, plans that round-trip through JSON and models that pickle, and bad input named at the call."""

import copy
import io
import json
import pickle

import pytest
import torch

import hf_ckpt
from hf_ckpt.measure import measure_step
from hf_ckpt.measure.settings import parse_setting
from hf_ckpt.oplevel import OpPolicy, frontier, profile_ops
from helpers import VOCAB, max_grad_diff, recomputed_in_step, tiny_gpt2, tiny_llama, train_step

pytestmark = pytest.mark.skipif(
    not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"),
    reason="op-level policies need torch's selective checkpointing (torch >= 2.4)",
)

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
    points = frontier(profile)
    middle = points[len(points) // 2]
    assert middle.saved and middle.avoided_flops < profile.recompute_flops
    num_blocks = len(hf_ckpt.blocks.find_blocks(model))
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
    num_blocks = len(hf_ckpt.blocks.find_blocks(model))
    none = measure_step(model, batch)
    flops = {}
    for name, saved in (("nothing", ()), ("everything", full.saved)):
        plan = hf_ckpt.CheckpointPlan(strategies=("oplevel:p",) * num_blocks, policies={"p": saved or ("aten.mm.default#999",)})
        hf_ckpt.enable(model, plan=plan)
        flops[name] = measure_step(model, batch).flops - none.flops
        hf_ckpt.disable(model)
    assert flops["nothing"] == num_blocks * profile.recompute_flops
    assert flops["everything"] == num_blocks * (profile.recompute_flops - full.avoided_flops) == 0


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
