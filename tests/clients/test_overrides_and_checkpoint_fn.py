"""What the clients rely on, checked without them (this file runs in the default suite, on every release).

* Overrides: TRL wraps the instance's ``gradient_checkpointing_enable``; remote-code models override these methods.
  After ``patch_transformers()`` the entry point the ``Trainer`` calls (``activation_checkpointing_enable`` on
  transformers >= 5.23, ``gradient_checkpointing_enable`` before) must reach them, as upstream's does.
* ``checkpoint_fn=``: a custom checkpoint function (DeepSpeed's, in the clients environment) for the selected
  blocks, validated at the call.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import hf_ckpt
from helpers import batch_for, max_grad_diff, recomputed_in_step, tiny_llama, train_step


def _trainer_entry_point(model):
    """The method the stock Trainer calls to enable checkpointing on this release."""
    return getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)


_CONTEXT_CALLS: list = []


def _context_fn():
    _CONTEXT_CALLS.append(1)  # torch calls it once per checkpointed block, in the forward
    return torch.utils.checkpoint.noop_context_fn()


def _wrap_like_trl(model, calls: list) -> None:
    """TRL's ``enable_selective_activation_checkpointing``: an instance wrapper that turns its own key into a
    ``context_fn`` and passes the rest on."""
    original = model.gradient_checkpointing_enable

    def gradient_checkpointing_enable(gradient_checkpointing_kwargs=None, **kwargs):
        options = dict(gradient_checkpointing_kwargs or {})
        calls.append(options.pop("selective", None))
        options["use_reentrant"] = False
        options["context_fn"] = _context_fn
        return original(gradient_checkpointing_kwargs=options, **kwargs)

    model.gradient_checkpointing_enable = gradient_checkpointing_enable


def test_instance_wrapper_is_the_entry_point_and_combines_with_every_n_layers():
    hf_ckpt.patch_transformers()
    model = tiny_llama()
    calls: list = []
    _wrap_like_trl(model, calls)
    _trainer_entry_point(model)({"every_n_layers": 2, "selective": True})
    assert calls == [True]
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]
    reference = train_step(tiny_llama(), batch_for(model))
    _CONTEXT_CALLS.clear()
    recomputed, grads = recomputed_in_step(model, batch_for(model))
    assert recomputed == [0, 2]
    assert len(_CONTEXT_CALLS) == 2  # the wrapper's context_fn ran for blocks 0 and 2
    assert max_grad_diff(reference, grads) <= 1e-6  # 0.0 on most releases; 4.57 rounds differently


def test_instance_wrapper_of_disable_is_the_entry_point():
    hf_ckpt.patch_transformers()
    model = tiny_llama()
    _trainer_entry_point(model)({"every_n_layers": 2})
    original, calls = model.gradient_checkpointing_disable, []
    model.gradient_checkpointing_disable = lambda: (calls.append(1), original())[1]
    getattr(model, "activation_checkpointing_disable", model.gradient_checkpointing_disable)()
    assert calls == [1]
    assert hf_ckpt.checkpointed_layers(model) == []


class _OverridesOldName(type(tiny_llama())):
    """A remote-code model that overrides the old name to force a setting, calling super()."""

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        self.override_calls = getattr(self, "override_calls", 0) + 1
        options = dict(gradient_checkpointing_kwargs or {}, layers=[1])
        options.pop("every_n_layers", None)
        kwargs.pop("every_n_layers", None)
        return super().gradient_checkpointing_enable(gradient_checkpointing_kwargs=options, **kwargs)


def test_subclass_override_of_the_old_name_is_honoured():
    hf_ckpt.patch_transformers()
    model = tiny_llama(cls=_OverridesOldName)
    _trainer_entry_point(model)({"every_n_layers": 2})
    assert model.override_calls == 1
    assert recomputed_in_step(model, batch_for(model))[0] == [1]


def test_subclass_override_of_the_new_name_is_reached_from_the_old_name():
    if not hasattr(tiny_llama(), "activation_checkpointing_enable"):
        pytest.skip("transformers < 5.23 has no activation_checkpointing_enable to override")
    hf_ckpt.patch_transformers()

    class OverridesNewName(type(tiny_llama())):
        def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
            self.override_calls = getattr(self, "override_calls", 0) + 1
            return super().activation_checkpointing_enable(activation_checkpointing_kwargs, **kwargs)

    model = tiny_llama(cls=OverridesNewName)
    with pytest.warns(FutureWarning):
        model.gradient_checkpointing_enable({"every_n_layers": 2})
    assert model.override_calls == 1
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


# --- checkpoint_fn ------------------------------------------------------------------------------------------------


def _counting_reentrant(calls: list):
    def checkpoint_fn(function, *args, **kwargs):  # DeepSpeed's convention: no checkpoint keyword arguments
        calls.append(function)
        return checkpoint(function, *args, use_reentrant=True, **kwargs)

    return checkpoint_fn


def test_checkpoint_fn_runs_the_selected_blocks_exactly():
    calls: list = []
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(tiny_llama(), batch)
    hf_ckpt.enable(model, every_n_layers=2, checkpoint_fn=_counting_reentrant(calls))
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert len(calls) == 2  # one call per selected block in the forward
    assert max_grad_diff(reference, grads) <= 1e-6  # a reentrant function: input grads were turned on for it


def test_checkpoint_fn_in_the_kwargs_dict_of_the_patched_method():
    hf_ckpt.patch_transformers()
    calls: list = []
    model = tiny_llama()
    _trainer_entry_point(model)({"every_n_layers": 2, "checkpoint_fn": _counting_reentrant(calls)})
    assert recomputed_in_step(model, batch_for(model))[0] == [0, 2]
    assert len(calls) == 2


def test_checkpoint_fn_gets_only_the_keywords_it_names():
    received: list = []

    def checkpoint_fn(function, *args, use_reentrant=None, preserve_rng_state=True, **kwargs):
        received.append({"use_reentrant": use_reentrant, "preserve_rng_state": preserve_rng_state, **kwargs})
        return checkpoint(function, *args, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state, **kwargs)

    model = hf_ckpt.enable(tiny_llama(), layers=[1], checkpoint_fn=checkpoint_fn, preserve_rng_state=False)
    train_step(model, batch_for(model))
    assert len(received) == 1
    # the checkpoint options it names; the block's own keyword arguments (if any) pass through **kwargs
    assert {k: received[0][k] for k in ("use_reentrant", "preserve_rng_state")} == {
        "use_reentrant": False, "preserve_rng_state": False
    }


@pytest.mark.parametrize(
    "options, error, words",
    [
        ({"offload": True}, ValueError, "checkpoint_fn cannot be combined with offload=True"),
        ({"strategy": "selective"}, ValueError, 'checkpoint_fn cannot be combined with strategy="selective"'),
        ({"use_reentrant": True}, TypeError, "does not take 'use_reentrant'"),
        ({"context_fn": _context_fn}, TypeError, "does not take 'context_fn'"),
    ],
)
def test_checkpoint_fn_refuses_what_it_cannot_honour(options, error, words):
    with pytest.raises(error, match=words):
        hf_ckpt.enable(tiny_llama(), checkpoint_fn=_counting_reentrant([]), **options)


def test_checkpoint_fn_with_context_fn_it_names_is_still_refused():
    def checkpoint_fn(function, *args, context_fn=None, **kwargs):
        return checkpoint(function, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    with pytest.raises(ValueError, match="checkpoint_fn cannot be combined with context_fn"):
        hf_ckpt.enable(tiny_llama(), checkpoint_fn=checkpoint_fn, context_fn=_context_fn)


def test_checkpoint_fn_must_be_callable():
    with pytest.raises(TypeError, match="checkpoint_fn must be a function with torch.utils.checkpoint"):
        hf_ckpt.enable(tiny_llama(), checkpoint_fn="deepspeed")
