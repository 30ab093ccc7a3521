"""QLoRA on the CPU: ``hf_ckpt.estimate(..., quantization_config=BitsAndBytesConfig(...), peft_config=LoraConfig(...))``
against real steps of a tiny Llama loaded by transformers with bitsandbytes (4-bit nf4/fp4, double quantization,
8-bit): the weights' bytes as bitsandbytes stores them, the activations and the step's peak, first and steady step.

Runs in the clients environment (``python ci/clients.py``); skipped where bitsandbytes is not installed.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

import hf_ckpt  # noqa: E402
from hf_ckpt.meters.memory import StorageTracker  # noqa: E402

BATCH, SEQ = 4, 256


def _config():
    import transformers

    return transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                    num_key_value_heads=2, num_hidden_layers=4, vocab_size=256,
                                    max_position_embeddings=256)


def _stored_bytes(model) -> int:
    """Distinct storages of the parameters and of bitsandbytes' quantization state (absmax, codes, row scales)."""
    seen = {}
    for p in model.parameters():
        tensors = [p, getattr(p, "SCB", None)]
        state = getattr(p, "quant_state", None)
        if state is not None:
            tensors += [*vars(state).values(), *(vars(state.state2).values() if state.state2 is not None else ())]
        for t in tensors:
            if isinstance(t, torch.Tensor):
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


QUANTIZATIONS = {
    "nf4-double": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
    "fp4": {"load_in_4bit": True, "bnb_4bit_quant_type": "fp4"},
    "int8": {"load_in_8bit": True},
}


@pytest.mark.parametrize("name", QUANTIZATIONS)
def test_qlora_estimate_matches_real_cpu_steps(name, tmp_path):
    import peft
    import transformers

    options = dict(QUANTIZATIONS[name])
    if options.get("load_in_4bit"):
        options["bnb_4bit_compute_dtype"] = torch.bfloat16
    quantization = transformers.BitsAndBytesConfig(**options)
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(_config()).to(torch.bfloat16).save_pretrained(tmp_path)
    warnings.simplefilter("ignore")
    ids = torch.randint(3, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with StorageTracker() as tracker:  # from the load on, so the peak counts everything alive
        base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quantization,
                                                                 device_map="cpu", dtype=torch.bfloat16)
        model = peft.get_peft_model(base, lora).train()
        stored = _stored_bytes(model)  # before a step: the 8-bit layers' row scales move to their matmul state
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        steps = []
        for _ in range(2):  # the first step allocates the optimizer's states, the second has them
            gc.collect()
            tracker.reset_peak()
            before = tracker.live_bytes()["cpu"]
            loss = model(input_ids=ids, labels=ids).loss
            retained = tracker.live_bytes()["cpu"] - before
            loss.backward()
            del loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps.append((retained, tracker.peak_bytes()["cpu"]))
    made = hf_ckpt.estimate(_config(), batch_size=BATCH, seq_len=SEQ, dtype="bfloat16", device="cpu",
                            peft_config=lora, quantization_config=quantization, optimizer="adamw_torch",
                            strategies=("none",))
    assert made.parameters_bytes == stored
    for retained, _peak in steps:
        assert made.activation_bytes["none"] == pytest.approx(retained, rel=0.03)
    (_, first), (_, steady) = steps
    assert made.first_step_peak_bytes["none"] == pytest.approx(first, rel=0.03)
    assert made.peak_bytes["none"] == pytest.approx(steady, rel=0.03)
