"""LoRA adapters receive gradients in every order, with reentrant and non-reentrant checkpointing."""

import pytest

peft = pytest.importorskip("peft")  # `peft` is in the test extra; CI installs it, so this never skips there
from peft import LoraConfig, get_peft_model

import hf_ckpt
from helpers import batch_for, max_grad_diff, recomputed_in_step, tiny_llama, train_step


def _lora_config():
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False)


def _lora_grads(grads):
    return {name: g for name, g in grads.items() if "lora_" in name}


def _check(model, enabled_model, batch, expected_blocks):
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == expected_blocks
    lora = _lora_grads(grads)
    assert len(lora) == 4 * 2 * 2  # 4 layers x (q, v) x (A, B)
    assert all(g.abs().sum() > 0 for g in lora.values())
    hf_ckpt.disable(enabled_model)
    reference = _lora_grads(train_step(model, batch))
    assert max_grad_diff(reference, lora) <= 1e-5


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_wrap_then_enable(use_reentrant):
    model = get_peft_model(tiny_llama(), _lora_config())
    hf_ckpt.enable(model, every_n_layers=2, use_reentrant=use_reentrant)
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]
    _check(model, model, batch_for(model), [0, 2])


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_enable_then_wrap(use_reentrant):
    base = tiny_llama()
    hf_ckpt.enable(base, every_n_layers=2, use_reentrant=use_reentrant)
    model = get_peft_model(base, _lora_config())
    _check(model, base, batch_for(model), [0, 2])


def _add_adapter(model):
    """``PreTrainedModel.add_adapter`` where the installed peft satisfies the installed transformers; otherwise
    the two steps it performs (transformers 5.24 asks for a peft release that does not exist yet)."""
    try:
        model.add_adapter(_lora_config())
    except ValueError as error:
        if "version of PEFT" not in str(error):
            raise
        peft.inject_adapter_in_model(_lora_config(), model)
        model._hf_peft_config_loaded = True


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("order", ["add_adapter_then_enable", "enable_then_add_adapter"])
def test_transformers_add_adapter(order, use_reentrant):
    model = tiny_llama()
    for p in model.parameters():
        p.requires_grad_(False)
    if order == "add_adapter_then_enable":
        _add_adapter(model)
        hf_ckpt.enable(model, use_reentrant=use_reentrant)
    else:
        hf_ckpt.enable(model, use_reentrant=use_reentrant)
        _add_adapter(model)
    _check(model, model, batch_for(model), [0, 1, 2, 3])


def _embedding_hooks(model):
    return len(model.get_input_embeddings()._forward_hooks)


def test_disable_removes_only_what_enable_added():
    model = get_peft_model(tiny_llama(), _lora_config())
    base = model.get_base_model()
    before = _embedding_hooks(base)
    hf_ckpt.enable(model, use_reentrant=True)
    assert _embedding_hooks(base) == before + 1
    hf_ckpt.disable(model)
    assert _embedding_hooks(base) == before
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == []


def test_upstream_failure_is_fixed_reentrant_with_frozen_embeddings():
    """The 4.x failure: reentrant checkpointing, everything but LoRA frozen, no input grads."""
    model = get_peft_model(tiny_llama(), _lora_config())
    hf_ckpt.enable(model, use_reentrant=True)
    loss = model(**batch_for(model)).loss
    assert loss.requires_grad  # upstream 4.x: "element 0 of tensors does not require grad" at backward
    loss.backward()
