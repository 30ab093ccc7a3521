"""The stock ``Trainer`` (and TRL's trainers) with a budget: where the plan made at the first batch is saved.

``gradient_checkpointing_kwargs={"budget": ...}`` is planned at the first training batch
(:mod:`hf_ckpt._deferred`); :class:`BudgetPlanCallback` tells it the Trainer's ``output_dir`` at
``on_train_begin`` (after the Trainer enabled checkpointing, before the first batch), so the plan is saved there
as ``hf_ckpt_plan.json`` (on the process that saves checkpoints). :func:`hf_ckpt.patch_transformers` adds the
callback to every ``Trainer`` made after it (``transformers.trainer.DEFAULT_CALLBACKS``);
:func:`hf_ckpt.unpatch_transformers` takes it out. Without the patch, pass it yourself:
``Trainer(..., callbacks=[BudgetPlanCallback()])``.
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_callback import TrainerCallback

from .._state import get_state
from .._target import target_model


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


def _budget_of(model: Any) -> Any:
    """The budget planned at the first batch (:class:`hf_ckpt._deferred.DeferredBudget`) on ``model``'s record, or
    None: read through the record, so the runtime loads none of the planning code."""
    if model is None:
        return None
    try:
        target = target_model(model)
    except TypeError:
        return None
    return getattr(get_state(target), "budget", None)


def _default_callbacks() -> list | None:
    try:
        from transformers import trainer
    except ImportError:  # the Trainer needs accelerate; without it there is no Trainer to tell
        return None
    callbacks = getattr(trainer, "DEFAULT_CALLBACKS", None)
    return callbacks if isinstance(callbacks, list) else None


def install() -> None:
    """Add :class:`BudgetPlanCallback` to the callbacks every ``Trainer`` starts with (idempotent)."""
    callbacks = _default_callbacks()
    if callbacks is not None and BudgetPlanCallback not in callbacks:
        callbacks.append(BudgetPlanCallback)


def uninstall() -> None:
    """Take :class:`BudgetPlanCallback` out of the ``Trainer``'s default callbacks."""
    callbacks = _default_callbacks()
    while callbacks is not None and BudgetPlanCallback in callbacks:
        callbacks.remove(BudgetPlanCallback)
