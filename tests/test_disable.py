"""``disable`` restores the model exactly; the state dict never changes; save/load round-trips."""

import pytest
import torch
import torch.utils.checkpoint

import hf_ckpt
from helpers import MODEL_BUILDERS, batch_for, recomputed_in_step, tiny_llama, train_step

_ATTRIBUTES = ("gradient_checkpointing", "_gradient_checkpointing_func", "_hf_ckpt_selected", "_hf_ckpt_state")


def _snapshot(model):
    """Everything enable could touch: tracked attributes and the number of hooks of each kind, per module."""
    result = {}
    for name, module in model.named_modules():
        result[name] = (
            {a: module.__dict__.get(a, "<absent>") for a in _ATTRIBUTES},
            len(module._forward_hooks),
            len(module._forward_pre_hooks),
            len(module._backward_hooks),
        )
    return result


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_state(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", sorted(MODEL_BUILDERS))
def test_disable_restores_exactly(name):
    model = MODEL_BUILDERS[name]()
    before = _snapshot(model)
    state = _state(model)
    hf_ckpt.enable(model, every_n_layers=2, use_reentrant=True)
    _assert_same_state(state, _state(model))
    hf_ckpt.disable(model)
    assert _snapshot(model) == before
    _assert_same_state(state, _state(model))
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == []
    assert hf_ckpt.checkpointed_layers(model) == []


def test_disable_after_upstream_enable_turns_everything_off():
    model = tiny_llama()
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert hf_ckpt.checkpointed_layers(model) == [0, 1, 2, 3]
    hf_ckpt.disable(model)
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == []


def test_save_and_load_round_trip(tmp_path):
    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=2)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    _assert_same_state(_state(model), _state(loaded))
    assert hf_ckpt.checkpointed_layers(loaded) == []  # checkpointing is a runtime setting, not saved


def test_mixin_model_save_and_load_round_trip(tmp_path):
    base = type(tiny_llama())
    cls = type("CkptLlama", (hf_ckpt.GradientCheckpointingMixin, base), {})
    model = tiny_llama(cls=cls)
    hf_ckpt.enable(model, every_n_layers=2)
    model.save_pretrained(tmp_path)
    loaded = cls.from_pretrained(tmp_path)
    _assert_same_state(_state(model), _state(loaded))
    hf_ckpt.enable(loaded, every_n_layers=2)
    batch = batch_for(model)
    grads, loaded_grads = train_step(model, batch), train_step(loaded, batch)
    assert all(torch.allclose(grads[k], loaded_grads[k], atol=1e-6) for k in grads)
