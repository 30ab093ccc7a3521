"""The stock ``Trainer`` (and TRL's trainers) with a budget: where the plan made at the first batch is saved.

``gradient_checkpointing_kwargs={"budget": ...}`` is planned at the first training batch
(:mod:`hf_ckpt.budget.deferred`); :class:`BudgetPlanCallback` tells it the Trainer's ``output_dir`` at
``on_train_begin`` (after the Trainer enabled checkpointing, before the first batch), so the plan is saved there
as ``hf_ckpt_plan.json`` (on the process that saves checkpoints). :func:`hf_ckpt.patch_transformers` adds the
callback to every ``Trainer`` made after it (``transformers.trainer.DEFAULT_CALLBACKS``);
:func:`hf_ckpt.unpatch_transformers` takes it out. Without the patch, pass it yourself:
``Trainer(..., callbacks=[BudgetPlanCallback()])``.

:class:`DeepSpeedConfigCallback`, added the same way, warns once when the Trainer's DeepSpeed config has an
``"activation_checkpointing"`` block while checkpointing is off (:func:`hf_ckpt.integrations.deepspeed.warn_unused_config`).
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_callback import TrainerCallback

from hf_ckpt.runtime.state import PlannedBudget, get_state
from hf_ckpt.runtime.target import target_model
from hf_ckpt.integrations.deepspeed import warn_unused_config


class BudgetPlanCallback(TrainerCallback):
    """Saves the plan of a ``budget`` given in ``gradient_checkpointing_kwargs`` in ``args.output_dir``, and tells
    a ``"auto"`` budget the optimizer whose first-step state it leaves room for."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        request = _budget_of(model)
        if request is None:
            return
        request.use_optimizer(optimizer)
        if getattr(args, "should_save", True):
            request.save_in(getattr(args, "output_dir", None))


def _budget_of(model: Any) -> PlannedBudget | None:
    """The budget planned at the first batch (:class:`hf_ckpt.budget.record.DeferredBudget`) on ``model``'s record, or
    None: read through the record's typed :class:`~hf_ckpt.runtime.state.PlannedBudget`, so the runtime loads none
    of the planning code."""
    if model is None:
        return None
    try:
        target = target_model(model)
    except TypeError:
        return None
    state = get_state(target)
    return state.budget if state is not None else None


def checkpointing_on(model: Any) -> bool:
    """Whether ``model`` checkpoints: hf_ckpt set it up (a budget waiting for its first batch included) or
    upstream's flag says so. True for an object that is no model hf_ckpt knows (nothing to say about it)."""
    try:
        target = target_model(model)
    except TypeError:
        return True
    # the newer name where the release has it (5.25 warns on the old one)
    flag = "is_activation_checkpointing" if hasattr(type(target), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return get_state(target) is not None or bool(getattr(target, flag, False))


class DeepSpeedConfigCallback(TrainerCallback):
    """At ``on_train_begin`` (the Trainer's DeepSpeed set-up has read its config, and checkpointing was enabled
    or not): warns once when that config's ``"activation_checkpointing"`` block asks for something while the model
    does not checkpoint, naming the keys and what to do instead."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None or checkpointing_on(model):
            return
        config = getattr(getattr(args, "hf_deepspeed_config", None), "config", None)
        warn_unused_config(config if isinstance(config, dict) else None, owner=model)


_CALLBACKS = (BudgetPlanCallback, DeepSpeedConfigCallback)


def _default_callbacks() -> list | None:
    try:
        from transformers import trainer
    except ImportError:  # the Trainer needs accelerate; without it there is no Trainer to tell
        return None
    callbacks = getattr(trainer, "DEFAULT_CALLBACKS", None)
    return callbacks if isinstance(callbacks, list) else None


def install() -> None:
    """Add :class:`BudgetPlanCallback` and :class:`DeepSpeedConfigCallback` to the callbacks every ``Trainer``
    starts with (idempotent)."""
    callbacks = _default_callbacks()
    for callback in _CALLBACKS if callbacks is not None else ():
        if callback not in callbacks:
            callbacks.append(callback)


def uninstall() -> None:
    """Take hf_ckpt's callbacks out of the ``Trainer``'s default callbacks."""
    callbacks = _default_callbacks()
    for callback in _CALLBACKS if callbacks is not None else ():
        while callback in callbacks:
            callbacks.remove(callback)
