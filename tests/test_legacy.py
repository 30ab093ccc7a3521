"""Remote-code models with the legacy ``_set_gradient_checkpointing(module, value)`` signature."""

import warnings

import pytest

import hf_ckpt
from hf_ckpt import HfCkptWarning
from helpers import _LegacyBase, LegacyDirectModel, LegacyFuncModel, batch_for, max_grad_diff, recomputed_in_step, tiny_legacy, train_step


def _hf_ckpt_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, HfCkptWarning)]


@pytest.mark.parametrize("every_n_layers, expected", [(1, [0, 1, 2, 3]), (2, [0, 2]), (3, [0, 3])])
def test_legacy_model_calling_the_bound_function_honours_every_n_layers(every_n_layers, expected):
    model = tiny_legacy(LegacyFuncModel)
    batch = batch_for(model)
    reference = train_step(model, batch)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hf_ckpt.enable(model, every_n_layers=every_n_layers, preserve_rng_state=True)
    messages = _hf_ckpt_warnings(record)
    assert len(messages) == 1 and "defines _set_gradient_checkpointing(module, value)" in messages[0]
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == expected
    assert hf_ckpt.checkpointed_layers(model) == expected
    assert max_grad_diff(reference, grads) <= 1e-5


def test_legacy_model_own_logic_runs_and_the_user_kwargs_are_bound():
    model = tiny_legacy(LegacyFuncModel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_ckpt.enable(model, use_reentrant=True)
    assert model.gradient_checkpointing is True  # set by the model's own _set_gradient_checkpointing
    assert model._gradient_checkpointing_func.args[0].keywords == {"use_reentrant": True}


def test_legacy_deprecation_warning_is_emitted_once_per_model():
    model = tiny_legacy(LegacyFuncModel)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hf_ckpt.enable(model)
        hf_ckpt.disable(model)
        hf_ckpt.enable(model, every_n_layers=2)
    assert len(_hf_ckpt_warnings(record)) == 1


def test_legacy_model_calling_torch_checkpoint_itself_gets_its_selected_blocks_wrapped():
    """Its loop calls torch.utils.checkpoint itself (every block, torch's arguments): hf_ckpt keeps the flag its own
    logic set off again and checkpoints the selected blocks by wrapping them, with the user's arguments."""
    model = tiny_legacy(LegacyDirectModel)
    batch = batch_for(model)
    reference = train_step(model, batch)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hf_ckpt.enable(model, every_n_layers=2, use_reentrant=True)
        recomputed, grads = recomputed_in_step(model, batch)
    assert [m for m in _hf_ckpt_warnings(record) if m.startswith("Measured in the first training step")] == []
    assert model.gradient_checkpointing is False
    assert all(layer.forward.function.func.__name__ == "_checkpointed_forward" for layer in model.layers)
    assert model.layers[0]._hf_ckpt_selected.keywords["use_reentrant"] is True
    assert recomputed == [0, 2] == hf_ckpt.checkpointed_layers(model)
    assert max_grad_diff(reference, grads) <= 1e-5


def test_legacy_disable_runs_the_model_logic_and_restores():
    model = tiny_legacy(LegacyFuncModel)
    before = dict(model.__dict__)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_ckpt.enable(model, every_n_layers=2)
    hf_ckpt.disable(model)
    assert model.gradient_checkpointing is False
    assert "_gradient_checkpointing_func" not in model.__dict__ or "_gradient_checkpointing_func" in before
    assert all("_hf_ckpt_selected" not in layer.__dict__ for layer in model.layers)
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == []


class LegacyInertModel(_LegacyBase):
    """A stack that carries the flag but never checkpoints (Starcoder2Model on 4.51, GPTBigCodeModel on 4.57)."""

    def _run_layer(self, layer, hidden_states):
        return layer(hidden_states)


def test_a_stack_that_never_checkpoints_gets_its_blocks_checkpointed_by_hf_ckpt():
    # No method of it names a checkpoint function: hf_ckpt wraps the selected blocks itself (hf_ckpt/runtime/stacks/direct.py).
    model = tiny_legacy(LegacyInertModel)
    batch = batch_for(model)
    reference = train_step(model, batch)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hf_ckpt.enable(model, every_n_layers=2)
        recomputed, grads = recomputed_in_step(model, batch)
    assert [m for m in _hf_ckpt_warnings(record) if m.startswith("Measured in the first training step")] == []
    assert recomputed == [0, 2] == hf_ckpt.checkpointed_layers(model)
    assert max_grad_diff(reference, grads) <= 1e-5
