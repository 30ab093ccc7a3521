"""The chunked head (``head_chunk_size``) in the estimate, in plans and budgets, and in ``hf-ckpt estimate``.

What users rely on: the estimate shows the row ``full+head:<chunk>`` (less memory, more FLOPs than ``full``); a plan
chunks the head exactly when nothing fits without it, and carries the chunk to ``enable``; a budget applies it to
the model; a model that refuses the chunked head gets no such row, the reason said.
"""

from __future__ import annotations

import dataclasses

import re

import pytest
import torch
import transformers

import hf_ckpt
from hf_ckpt import CheckpointPlan
from hf_ckpt import cli
from hf_ckpt.runtime import head as _head
from hf_ckpt.estimation import estimate, plan_from_estimate, profile_of
from hf_ckpt.estimation._estimate import head_chunk_for
from hf_ckpt.measure import measure_step
from test_head import HAS_LOSS_FUNCTION, needs_loss_function

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

BATCH, SEQ, HIDDEN, VOCAB = 2, 64, 64, 2048  # a vocabulary 32 times the width: the head dominates


def _config(**overrides):
    options = dict(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   num_hidden_layers=4, vocab_size=VOCAB, max_position_embeddings=128)
    return transformers.LlamaConfig(**{**options, **overrides})


def _estimate(config=None, **kwargs):
    options = dict(batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", strategies=("none", "full", "selective"))
    return estimate(config or _config(), **{**options, **kwargs})


@pytest.fixture(scope="module")
def made():
    return _estimate(optimizer="adamw_torch_fused")  # a step without temporaries: the backward binds, not the step


def _smallest(made, chunked: bool) -> int:
    """The least activation memory a plan reaches, with or without the chunked head."""
    profile = profile_of(made, chunked)
    return profile.base_bytes + sum(min(r[i] for r in profile.retained.values()) for i in range(made.num_blocks))


def test_the_chunk_chosen_holds_about_as_many_logits_as_hidden_states_but_no_fewer_than_128_tokens():
    assert head_chunk_for(4 * 4096, 4096, 128_256, 4096) == 512  # ceil(128256 / 4096) = 32; 16384 / 32 = 512
    assert head_chunk_for(100, 64, 64) == 100  # never more than the step's tokens
    assert head_chunk_for(4 * 1000, 64, 6400, 1000) == 128  # 4000 / 100 = 40, up to 64: below the floor of 128
    assert head_chunk_for(4 * 100, 64, 6400, 100) == 100  # the floor is the sequence where shorter than 128
    assert head_chunk_for(4 * 1000, 8, 6400, 1000) == 128  # 4000 / 800 = 5 -> 8 tokens: the floor's 128
    assert _head.default_chunk_size(4 * 1000, 1000, 64, 6400, floor=False) == 64  # the memory rule alone


def test_the_estimate_and_the_planners_share_the_rule():
    config = _config()
    assert _head.default_chunk_of(config, BATCH, SEQ) == head_chunk_for(BATCH * SEQ, HIDDEN, VOCAB, SEQ) == 64
    assert _head.default_chunk_of(config, 1, 16) == 16  # one short sequence: all its tokens in one chunk


@needs_loss_function
def test_the_row_full_plus_chunked_head(made):
    chunk = head_chunk_for(BATCH * SEQ, HIDDEN, VOCAB, SEQ)
    name = f"full+head:{chunk}"
    assert made.head_chunk_size == chunk
    assert made.activation_bytes[name] < made.activation_bytes["full"]
    assert made.peak_bytes[name] < made.peak_bytes["full"]
    assert made.step_flops[name] - made.step_flops["full"] == made.head_recompute_flops > 0
    assert name in made.table()


@needs_loss_function
def test_a_given_chunk_is_estimated():
    made = _estimate(head_chunk_size=16, strategies=("none", "full"))
    assert made.head_chunk_size == 16 and "full+head:16" in made.activation_bytes


def test_a_bad_chunk_is_refused_at_the_call():
    with pytest.raises(ValueError, match=r"^head_chunk_size must be a positive int; got 0$"):
        _estimate(head_chunk_size=0)


@needs_loss_function
def test_a_plan_chunks_the_head_only_when_nothing_fits_without(made):
    chunked_fits = (made.held_above_bytes[f"head:{made.head_chunk_size}"] + _smallest(made, True)
                    + made.held_above_bytes[""] + _smallest(made, False)) // 2
    plan = plan_from_estimate(made, chunked_fits, whole_step=True)
    assert plan.head_chunk_size == made.head_chunk_size
    assert plan.predicted_bytes <= plan.budget_bytes
    roomy = made.peak_bytes["full"] + 1
    assert plan_from_estimate(made, roomy, whole_step=True).head_chunk_size is None


@needs_loss_function
def test_a_loop_that_keeps_the_outputs_is_not_planned_with_the_chunked_head():
    made = _estimate(keep_outputs=True)
    budget = (_smallest(made, True) + _smallest(made, False)) // 2
    with pytest.raises(ValueError, match="no plan fits"):
        plan_from_estimate(made, budget)


@needs_loss_function
def test_a_plan_carries_the_chunk_to_enable(tmp_path):
    path = tmp_path / "plan.json"
    CheckpointPlan(("full",) * 4, head_chunk_size=8).save(path)
    loaded = CheckpointPlan.load(path)
    assert loaded.head_chunk_size == 8 and "head in chunks of 8 tokens" in loaded.summary()
    model = transformers.LlamaForCausalLM(_config()).train()
    hf_ckpt.enable(model, plan=str(path))
    ids = torch.randint(0, VOCAB, (BATCH, 16))
    assert model(input_ids=ids, labels=ids).get("logits") is None
    with pytest.raises(ValueError, match=r"^head_chunk_size must be a positive int or None; got 0$"):
        CheckpointPlan(("full",) * 4, head_chunk_size=0)


@needs_loss_function
def test_a_budget_that_only_the_chunked_head_meets_applies_it(made):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    reference = model(input_ids=ids, labels=ids).loss.detach()
    budget = (_smallest(made, True) + _smallest(made, False)) // 2
    hf_ckpt.enable(model, budget=budget)
    output = model(input_ids=ids, labels=ids)
    output.loss.backward()
    assert output.get("logits") is None  # planned at this first batch: the head runs in chunks
    assert torch.allclose(output.loss, reference, rtol=1e-5)


@pytest.mark.skipif(not HAS_LOSS_FUNCTION, reason="no PreTrainedModel.loss_function")
def test_a_model_that_refuses_the_chunked_head_gets_the_reason_instead_of_the_row():
    config = transformers.Gemma2Config(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, num_hidden_layers=2, vocab_size=VOCAB)
    made = _estimate(config, strategies=("none", "full"))
    name = f"full+head:{head_chunk_for(BATCH * SEQ, HIDDEN, VOCAB, SEQ)}"
    assert made.head_chunk_size is None and name not in made.activation_bytes
    assert made.unusable[name].startswith("head_chunk_size cannot apply to Gemma2ForCausalLM: its forward does not")


def test_the_command_names_its_option_in_errors(tmp_path, capsys):
    _config().save_pretrained(tmp_path)
    code = cli.main(["estimate", str(tmp_path / "config.json"), "--batch", "1", "--seq", "8",
                     "--head-chunk-size", "0"])
    assert code == 2
    assert capsys.readouterr().err == "hf-ckpt estimate: error: --head-chunk-size must be a positive int; got 0\n"


@pytest.mark.slow
@needs_loss_function
def test_llama_3_8b_on_80_gib_fits_with_blocks_and_the_chunked_head(tmp_path, capsys):
    """The guide's example: batch 8 x seq 4096, bf16, AdamW on one 80 GiB device; nothing fits without."""
    transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128_256, max_position_embeddings=8192,
                             rope_theta=500_000.0).save_pretrained(tmp_path)
    code = cli.main(["estimate", str(tmp_path / "config.json"), "--batch", "8", "--seq", "4096",
                     "--device-memory", "80GiB", "--plan-json", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "device memory 80.00 GiB: full+head:1024 fits" in out
    assert "head in chunks of 1024 tokens" in out.split("cheapest plan that fits:")[1].splitlines()[0]
    assert CheckpointPlan.load(tmp_path / "plan.json").head_chunk_size == 1024


@pytest.mark.slow
@needs_loss_function
@pytest.mark.filterwarnings("ignore")
def test_measured_memory_drops_by_what_the_estimate_predicts(made):
    """A CPU step with every block checkpointed, then with the head chunked too: the retained bytes and the peak
    drop by the estimate's figures (within 3 %), the FLOPs rise by the head's recompute."""
    name = f"full+head:{made.head_chunk_size}"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    steps = {}
    for setting, options in (("full", {}), (name, {"head_chunk_size": made.head_chunk_size})):
        hf_ckpt.enable(model, **options)
        steps[setting] = measure_step(model, {"input_ids": ids, "labels": ids})
        hf_ckpt.disable(model)
    peak_drop = steps["full"].peak_bytes - steps[name].peak_bytes
    retained_drop = steps["full"].retained_bytes - steps[name].retained_bytes
    assert peak_drop == pytest.approx(made.peak_bytes["full"] - made.peak_bytes[name], rel=0.03)
    assert retained_drop == pytest.approx(made.activation_bytes["full"] - made.activation_bytes[name], rel=0.03)
    assert steps[name].flops - steps["full"].flops == pytest.approx(made.head_recompute_flops, rel=0.01)


@needs_loss_function
@pytest.mark.parametrize("chunked_short", [False, True], ids=["whole-short", "default-chunk-short-smaller-fits"])
def test_auto_chunks_the_head_when_nothing_fits_without(chunked_short):
    """``budget="auto"``: free memory less the headroom and what the step still allocates (its transients among
    them) leaves one byte too few for any plan with the head whole (or, ``chunked_short``, even with it in the
    default chunks, whose transients at 64 tokens are no smaller than the whole head's): the plan takes the default
    chunk, or else the memory rule's smaller one, whose smaller transients the budget gives back to its plan."""
    from hf_ckpt.budget import forms as _budget, from_estimate as _from_estimate
    from hf_ckpt.runtime.state import get_state

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).train()
    made = _from_estimate.estimate_for(model, (BATCH, SEQ), ("none", "full", "selective"))[0]
    assert (made.head_chunk_size, made.head_smaller_chunk_size) == (64, 4)  # 128 / 32 = 4 tokens; the floor: 64
    assert max(made.head_smaller_transient_bytes.values()) < max(made.transient_bytes.values())
    total = 8 * 2**30
    still = made.held_above_bytes[""] - made.parameters_bytes
    auto = _smallest(made, True) - 1 if chunked_short else _smallest(made, False) - 1
    previous = _budget.set_free_memory_source(lambda device: (_budget.headroom(total) + still + auto, total))
    try:
        hf_ckpt.enable(model, budget="auto")
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
        output = model(input_ids=ids, labels=ids)
        output.loss.backward()
    finally:
        _budget.set_free_memory_source(previous)
    assert get_state(model).budget.auto_bytes == auto
    assert get_state(model).config.head_chunk_size == (4 if chunked_short else 64)
    assert output.get("logits") is None


@needs_loss_function
def test_a_whole_step_budget_falls_back_to_the_smaller_chunk_only_when_it_needs_it(made):
    """Device memory one byte short of the default chunk's plan: the smaller chunk's transients make it fit."""
    at_default = made.held_above_bytes["head:64"] + _smallest(made, True)
    assert at_default < made.held_above_bytes[""] + _smallest(made, False)  # the head whole does not fit
    assert plan_from_estimate(made, at_default, whole_step=True).head_chunk_size == 64
    smaller = plan_from_estimate(made, at_default - 1, whole_step=True)
    assert smaller.head_chunk_size == 4
    room = at_default - 1 - made.held_above_bytes["head:4"]
    assert smaller.predicted_bytes <= smaller.budget_bytes == room
    assert smaller.predicted_bytes == profile_of(made, 4).predicted_bytes(smaller.strategies)
    assert smaller.predicted_recompute_flops == (profile_of(made, 4).predicted_recompute_flops(smaller.strategies)
                                                 + made.head_smaller_recompute_flops)


@needs_loss_function
@pytest.mark.filterwarnings("ignore")
def test_estimate_check_measures_the_chunked_head_row(tmp_path, capsys):
    """``hf-ckpt estimate --check``: the row ``full+head:<chunk>`` of the tiny copy (hidden 64, vocab 256, batch 2 x
    seq 32: the chunk's floor, the sequence, 32 tokens) measured against its prediction like every other row."""
    _config().save_pretrained(tmp_path)
    code = cli.main(["estimate", str(tmp_path / "config.json"), "--batch", "1", "--seq", "8", "--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("  full+head:"))
    assert row.startswith("  full+head:32 retained ") and row.endswith("  ok"), row
    measured, predicted = (float(x) for x in re.search(r"retained ([\d.]+) MiB, predicted ([\d.]+) MiB", row).groups())
    assert measured < float(re.search(r"  full +retained ([\d.]+) MiB", out).group(1))  # below full's: the head's saving
    assert abs(predicted - measured) <= 0.03 * measured
    assert out.rstrip().endswith("check passed")


@pytest.mark.filterwarnings("ignore")
def test_estimate_check_names_why_a_model_has_no_chunked_head_row(tmp_path, capsys):
    """A causal LM that refuses the chunked head (Gemma-2 soft-caps its logits; on releases without
    ``loss_function`` every causal LM computes its loss inline): the row is not measured, the reason said."""
    transformers.Gemma2Config(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, num_hidden_layers=6, vocab_size=VOCAB).save_pretrained(tmp_path)
    code = cli.main(["estimate", str(tmp_path / "config.json"), "--batch", "1", "--seq", "8", "--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("  full+head:"))
    reason = "its forward does not hand" if HAS_LOSS_FUNCTION else "it computes its loss its own way"
    assert row.startswith(f"  full+head:32 not estimated: head_chunk_size cannot apply to Gemma2ForCausalLM: {reason}"), row


@needs_loss_function
def test_no_plan_even_with_either_chunk_is_the_error_without_it(made):
    """A whole-step budget short even of the smaller chunk's plan: the error is the unchunked one, raised."""
    short = made.held_above_bytes["head:4"] + _smallest(made, 4) - 1
    with pytest.raises(ValueError) as raised:
        plan_from_estimate(made, short, whole_step=True)
    with pytest.raises(ValueError) as unchunked:  # the same estimate without the chunked head
        plan_from_estimate(dataclasses.replace(made, head_chunk_size=None), short, whole_step=True)
    assert str(raised.value) == str(unchunked.value)
    assert str(raised.value).startswith(f"no plan fits a budget of {short / 2**20:.2f} MiB: "), str(raised.value)
    # an estimate whose floor did not raise the chunk has no smaller one: the same error, not None
    single = _estimate(head_chunk_size=16, strategies=("none", "full"))
    assert single.head_smaller_chunk_size is None
    with pytest.raises(ValueError, match=r"^no plan fits a budget of "):
        plan_from_estimate(single, 1000)
