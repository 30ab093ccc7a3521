"""hf_ckpt.estimate: predictions against real measured CPU steps on tiny models, argument errors, JSON, plans.

Accuracy here is checked on two tiny architectures (a decoder and an encoder) with more blocks than the
estimator traces, so the scaling by block type is exercised; ``benchmarks/estimate_check.py`` covers 14.
"""

from __future__ import annotations

import dataclasses

import json
import re

import pytest
import torch
import transformers

import hf_ckpt
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.estimation import estimate, plan_for, plan_from_estimate
from hf_ckpt.measure import measure_step

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

BATCH, SEQ, BLOCKS = 2, 16, 6
STRATEGIES = ("none", "full", "every_n:2", "selective")


def _llama_config():
    return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                    num_hidden_layers=BLOCKS, vocab_size=128, max_position_embeddings=64)


def _bert_config():
    return transformers.BertConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_hidden_layers=BLOCKS, vocab_size=128, max_position_embeddings=64)


ARCHITECTURES = {
    "llama": (_llama_config, transformers.LlamaForCausalLM),
    "bert": (_bert_config, transformers.BertForMaskedLM),
}


def _apply(model, strategy):
    hf_ckpt.disable(model)
    if strategy.startswith("full+head:"):
        hf_ckpt.enable(model, head_chunk_size=int(strategy.split(":")[1]))
    elif strategy.startswith("every_n:"):
        hf_ckpt.enable(model, every_n_layers=int(strategy.split(":")[1]))
    elif strategy != "none":
        hf_ckpt.enable(model, strategy=strategy)


def _batch():
    ids = torch.randint(3, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def predicted_and_real(request):
    make_config, model_class = ARCHITECTURES[request.param]
    config = make_config()
    with torch.device("meta"):
        meta = model_class(config)
    predicted = estimate(meta, batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", strategies=STRATEGIES)
    torch.manual_seed(0)
    return predicted, model_class(config).train()


@pytest.mark.filterwarnings("ignore")
@pytest.mark.slow
def test_retained_bytes_and_flops_match_a_measured_step_for_every_strategy(predicted_and_real):
    predicted, model = predicted_and_real
    assert predicted.traced_blocks < predicted.num_blocks == BLOCKS  # scaled, not traced whole
    for strategy in STRATEGIES:
        _apply(model, strategy)
        measured = measure_step(model, _batch())
        assert predicted.activation_bytes[strategy] == pytest.approx(measured.retained_bytes, rel=0.03), strategy
        assert predicted.step_flops[strategy] == pytest.approx(measured.flops, rel=0.01), strategy
    hf_ckpt.disable(model)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", ["llama", "gpt2"])
@pytest.mark.slow
def test_autocast_retained_bytes_equal_a_step_whose_forward_runs_under_autocast(name):
    """Mixed precision (float32 weights, bfloat16 autocast around forward, backward outside, as the Trainer runs
    it): the estimate equals the measured step, byte for byte, and differs from the float32 one."""
    from hf_ckpt.measure.workload import build_workload

    work = build_workload(name, batch=2, seq=64, layers=4, hidden=64)
    model, batch = work.model, dict(work.batch)
    strategies = ("none", "full", "selective")
    mixed = estimate(model.config, batch_size=2, seq_len=64, dtype="float32", autocast="bf16", device="cpu",
                     strategies=strategies)
    plain = estimate(model.config, batch_size=2, seq_len=64, dtype="float32", device="cpu", strategies=strategies)
    assert mixed.autocast == "bfloat16" and plain.autocast is None
    assert "float32 with bfloat16 autocast on cpu" in str(mixed)
    # CUDA attention is modelled by a kernel without an autocast rule: it is handed autocast's casts, so a
    # checkpoint's recompute sees the dtypes its forward saw
    cuda = estimate(model.config, batch_size=2, seq_len=64, dtype="float32", autocast="bf16", device="cuda",
                    strategies=strategies)
    chunked = f"full+head:{mixed.head_chunk_size}"  # every block checkpointed, the head in chunks
    assert set(cuda.activation_bytes) == {*strategies, chunked} and not cuda.unusable
    forward = model.forward
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(forward)
    try:
        for strategy in (*strategies, chunked):
            _apply(model, strategy)
            measured = measure_step(model, batch, loss_fn=work.loss_fn).retained_bytes
            assert mixed.activation_bytes[strategy] == measured, strategy
            if strategy != chunked:  # chunked, nothing autocast makes outlives forward: the float32 figure holds
                assert plain.activation_bytes[strategy] != measured, strategy
    finally:
        model.forward = forward
        hf_ckpt.disable(model)


def _loop_keeping_outputs(model, batch, keep):
    """Bytes a real CPU step holds at the end of forward: ``outputs = model(**batch)`` kept through
    ``outputs.loss.backward()`` (``keep``), or the loss alone (the Trainer's step)."""
    from hf_ckpt.meters.memory import StorageTracker

    model.zero_grad(set_to_none=True)
    with StorageTracker() as tracker:
        outputs = model(**batch)
        loss = outputs.loss
        outputs = outputs if keep else None
        retained = tracker.live_bytes().get("cpu", 0)
        loss.backward()
    del outputs
    return retained


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_keep_outputs_matches_a_loop_that_keeps_the_outputs_through_backward():
    """keep_outputs=True: within 3% of a real step that keeps ``outputs`` (none and full checkpointing), on a
    vocabulary large enough that the logits matter; the default matches the loss-only step, not this loop."""
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=BLOCKS, vocab_size=1000,
                                      max_position_embeddings=64)
    batch_size, seq_len = 2, 64
    strategies = ("none", "full")
    kept = estimate(config, batch_size=batch_size, seq_len=seq_len, dtype="float32", device="cpu",
                    strategies=strategies, keep_outputs=True)
    dropped = estimate(config, batch_size=batch_size, seq_len=seq_len, dtype="float32", device="cpu",
                       strategies=strategies)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(3, 1000, (batch_size, seq_len), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids.clone()}
    for strategy in strategies:
        _apply(model, strategy)
        loop, trainer = _loop_keeping_outputs(model, batch, True), _loop_keeping_outputs(model, batch, False)
        assert kept.activation_bytes[strategy] == pytest.approx(loop, rel=0.03), strategy
        assert dropped.activation_bytes[strategy] == pytest.approx(trainer, rel=0.03), strategy
        assert dropped.activation_bytes[strategy] < loop / 1.03, strategy  # the default does not model this loop
        # the difference is what the output holds: the logits, in their dtype (float32 here), and on older
        # releases the key/value cache too (the measured loop above is the reference on every release)
        logits = batch_size * seq_len * config.vocab_size * 4
        assert kept.activation_bytes[strategy] - dropped.activation_bytes[strategy] >= logits, strategy
        # the peak: the logits more from the loss on; while the forward computes the loss both loops hold them
        if dropped.peak_phase[strategy] == "the forward's loss":
            assert kept.peak_bytes[strategy] >= dropped.peak_bytes[strategy], strategy
        else:
            assert kept.peak_bytes[strategy] - dropped.peak_bytes[strategy] >= logits, strategy
    hf_ckpt.disable(model)
    assert kept.to_dict()["keep_outputs"] is True and dropped.to_dict()["keep_outputs"] is False
    assert any(note.startswith("outputs: kept") for note in kept.to_dict()["notes"])
    assert any(note.startswith("outputs: dropped") for note in dropped.to_dict()["notes"])
    assert "outputs kept through backward" in str(kept) and "outputs dropped" in str(dropped)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_parameter_gradient_and_adamw_bytes_are_exact(predicted_and_real):
    predicted, model = predicted_and_real
    model.zero_grad(set_to_none=True)
    model(**_batch()).loss.backward()
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.step()
    parameters = list(model.parameters())
    assert predicted.parameters_bytes == sum(p.numel() * p.element_size() for p in parameters)
    assert predicted.gradients_bytes == sum(p.grad.numel() * p.grad.element_size() for p in parameters if p.grad is not None)
    assert predicted.optimizer_bytes == sum(
        t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
    )


@pytest.mark.slow
def test_cost_does_not_grow_with_depth():
    shallow = estimate(_llama_config(), batch_size=1, seq_len=8, dtype="float32", strategies=("none", "full"))
    deep_config = _llama_config()
    deep_config.num_hidden_layers = 40
    deep = estimate(deep_config, batch_size=1, seq_len=8, dtype="float32", strategies=("none", "full"))
    assert deep.traced_blocks == shallow.traced_blocks == 4
    assert deep.num_blocks == 40
    per_block = deep.block_bytes["none"][1]
    assert deep.activation_bytes["none"] - shallow.activation_bytes["none"] == (40 - BLOCKS) * per_block


@pytest.mark.slow
def test_lora_trains_only_the_adapters():
    peft = pytest.importorskip("peft")  # optional dependency; installed in the project's test environment
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    made = estimate(_llama_config(), batch_size=1, seq_len=8, dtype="float32", device="cpu", peft_config=lora,
                    strategies=("none", "full"))
    real = peft.get_peft_model(transformers.LlamaForCausalLM(_llama_config()), lora)
    adapters = [p for p in real.parameters() if p.requires_grad]
    assert made.parameters == sum(p.numel() for p in real.parameters())
    assert made.trainable_parameters == sum(p.numel() for p in adapters)
    assert made.gradients_bytes == sum(p.numel() * p.element_size() for p in adapters)
    # AdamW: exp_avg and exp_avg_sq per adapter weight, and a 4-byte step per tensor (on the CPU device)
    assert made.optimizer_bytes == 2 * made.gradients_bytes + 4 * len(adapters)
    assert made.peft == "LORA"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.slow
def test_plan_for_a_budget_fits_when_applied_to_the_real_model():
    config = _llama_config()
    made = plan_for(config, batch_size=BATCH, seq_len=SEQ, budget=0.5, dtype="float32", device="cpu")
    assert made.predicted_bytes <= made.budget_bytes
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    hf_ckpt.enable(model, plan=made)
    assert measure_step(model, _batch()).retained_bytes <= made.budget_bytes
    assert set(made.strategies) - {"none"}  # something is checkpointed to meet half the memory
    assert len(made.strategies) == len(find_blocks(model))


def test_plan_budget_as_size_and_whole_step():
    made = estimate(_llama_config(), batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu",
                    strategies=("none", "full"))
    roomy = plan_from_estimate(made, made.peak_bytes["none"] + 2**20, whole_step=True)
    assert roomy.strategies == ("none",) * BLOCKS
    step = made.optimizer_step_peak_bytes
    with pytest.raises(ValueError, match=rf"^no plan fits a budget of 0.00 MiB: the optimizer step alone takes "
                                         rf"{step / 2**20:.2f} MiB \(parameters, gradients, optimizer states and the "
                                         r"step's temporaries\); shard them"):
        plan_from_estimate(made, "1KiB", whole_step=True)
    # the optimizer step fits, the backward not: nothing left beside it for activations
    short = max(step, made.held_above_bytes[""])
    held = dataclasses.replace(made, held_above_bytes={"": short}, head_chunk_size=None)
    with pytest.raises(ValueError, match=rf"^no plan fits a budget of {short / 2**20:.2f} MiB: beside the activations "
                                         rf"the backward holds {short / 2**20:.2f} MiB \(parameters, optimizer states, "
                                         r"the gradients made by its peak and its transients\)"):
        plan_from_estimate(held, short, whole_step=True)
    tight = plan_from_estimate(made, f"{made.activation_bytes['full'] + 1}B")
    assert tight.predicted_bytes <= tight.budget_bytes


@pytest.mark.slow
def test_json_has_the_documented_keys(tmp_path):
    made = estimate(_llama_config(), batch_size=1, seq_len=8, dtype="float32")
    path = tmp_path / "estimate.json"
    made.save(path)
    data = json.loads(path.read_text())
    for key in ("parameters_bytes", "gradients_bytes", "optimizer_bytes"):
        assert isinstance(data[key], int)
    unusable = set(data["unusable"])  # a strategy that cannot be traced is reported with its reason, never dropped
    chunked = {name for name in {*data["activation_bytes"], *unusable} if name.startswith("full+head:")}
    assert len(chunked) == 1  # the head chunked: a row, or a reason (4.45: no loss_function)
    assert unusable - chunked <= {"selective"}  # only transformers 4.57's Llama: selective does not replay on fake tensors
    rows = {"none", "full", "every_n:2", "selective", *chunked}
    for key in ("activation_bytes", "peak_bytes", "flops_ratio"):
        assert set(data[key]) | unusable == rows
    assert data["flops_ratio"]["none"] == 1.0
    assert data["attention"]["modelled"] is True  # device="cuda" by default: kernels modelled, said so


def test_accepts_a_config_json_path_and_its_folder(tmp_path):
    _llama_config().save_pretrained(tmp_path)
    by_file = estimate(str(tmp_path / "config.json"), batch_size=1, seq_len=8, strategies=("none",))
    by_folder = estimate(tmp_path, batch_size=1, seq_len=8, strategies=("none",))
    assert by_file.to_dict() == by_folder.to_dict()
    assert by_file.model_class == "LlamaForCausalLM"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive int; got 0"),
        ({"seq_len": 2.5}, "seq_len must be a positive int; got 2.5"),
        ({"dtype": "float8"}, "dtype must be one of float32, bfloat16, float16 (or bf16, fp16, fp32, or the torch dtype); got 'float8'"),
        ({"device": "tpu"}, "device must be one of cuda, cpu; got 'tpu'"),
        ({"autocast": "float32"}, "autocast must be None, bfloat16 or float16 (or bf16, fp16, or the torch dtype); got 'float32'"),
        ({"autocast": True}, "autocast must be None, bfloat16 or float16 (or bf16, fp16, or the torch dtype); got True"),
        ({"optimizer": "lion"}, "optimizer must be one of adamw_torch, adamw_torch_fused, adafactor, sgd, rmsprop, adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit, paged_adamw_32bit, lion_8bit, lion_32bit, paged_lion_8bit, paged_lion_32bit, rmsprop_bnb, rmsprop_bnb_8bit, rmsprop_bnb_32bit, ademamix, ademamix_8bit, paged_ademamix_8bit, paged_ademamix_32bit (the Trainer's optim names) or adamw, adam, sgd_momentum; got 'lion'"),
        ({"peft_config": {"r": 8}}, "peft_config must be a peft.PeftConfig (e.g. peft.LoraConfig) or None; got dict"),
        ({"strategies": "full"}, "strategies must be a non-empty list or tuple of none, full, selective, every_n:K (K a positive int) or a hf_ckpt.CheckpointPlan; got 'full'"),
        ({"strategies": ("full", "every_n:0")}, "strategies: each must be none, full, selective, every_n:K (K a positive int) or a hf_ckpt.CheckpointPlan; got 'every_n:0'"),
        ({"strategies": ("full", "full")}, "strategies must not repeat; full appears more than once"),
        ({"keep_outputs": "yes"}, "keep_outputs must be True or False; got 'yes'"),
        ({"keep_outputs": None}, "keep_outputs must be True or False; got None"),
    ],
)
def test_bad_arguments_fail_at_the_call_naming_the_argument(kwargs, message):
    arguments = {"batch_size": 1, "seq_len": 8, **kwargs}
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        estimate(_llama_config(), **arguments)


def test_bad_sources_name_model_or_config(tmp_path):
    with pytest.raises(ValueError, match="^model_or_config must be a transformers PretrainedConfig"):
        estimate(42, batch_size=1, seq_len=8)
    with pytest.raises(FileNotFoundError, match="^model_or_config: no config.json at"):
        estimate(tmp_path / "missing", batch_size=1, seq_len=8)
    real = transformers.LlamaForCausalLM(_llama_config())
    with pytest.raises(ValueError, match=r"^model_or_config: a model must be on the meta device .* got parameters on cpu$"):
        estimate(real, batch_size=1, seq_len=8)
