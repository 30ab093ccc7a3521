"""Opt-in patch of ``transformers`` so that stock models and the stock ``Trainer`` behave like the mixin.

After :func:`patch_transformers`, ``TrainingArguments(gradient_checkpointing=True,
gradient_checkpointing_kwargs={"every_n_layers": 2})`` works with the stock ``Trainer`` (and TRL's trainers,
which pass the same kwargs) on every supported release; ``{"budget": "40GiB"}`` (or ``0.5``, ``"auto"``) plans
from the first batch and saves the plan in the Trainer's ``output_dir`` (the patch adds
:class:`~hf_ckpt.integrations.trainer.BudgetPlanCallback` to the Trainer's default callbacks).
:func:`unpatch_transformers` puts upstream's methods back, identical objects included, and takes the callback out.
"""

from __future__ import annotations

from hf_ckpt.runtime.util import upstream
from hf_ckpt.runtime.util.upstream import PATCHED_NAMES as _PATCHED_NAMES
from hf_ckpt.runtime.util.upstream import original  # noqa: F401  (hf_ckpt.patch.original, as before)
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.mixin import GradientCheckpointingMixin

#: Upstream's methods while the patch is in effect (the runtime's record: :func:`hf_ckpt.runtime.util.upstream.original`).
_originals = upstream.ORIGINALS


def _patchable_names() -> list[str]:
    from transformers import PreTrainedModel

    return [name for name in _PATCHED_NAMES if name in PreTrainedModel.__dict__]


def _trainer_callback(action: str) -> None:
    try:
        from hf_ckpt.integrations import trainer
    except ImportError:  # no Trainer in this environment (it needs accelerate)
        return
    getattr(trainer, action)()


def is_patched() -> bool:
    """Whether :func:`patch_transformers` is in effect."""
    return bool(_originals)


def patch_transformers() -> None:
    """Give ``transformers.PreTrainedModel`` hf_ckpt's ``gradient_checkpointing_*`` (and ``activation_*``) methods.

    Idempotent: patching twice is the same as once. Reversible with :func:`unpatch_transformers`. Subclasses
    that define these methods themselves (the mixin, some remote-code models) keep their own.
    """
    from transformers import PreTrainedModel

    if _originals:
        return
    for name in _patchable_names():
        _originals[name] = PreTrainedModel.__dict__[name]
        setattr(PreTrainedModel, name, GradientCheckpointingMixin.__dict__[name])
    _trainer_callback("install")  # a budget's plan is saved in the Trainer's output_dir


def unpatch_transformers() -> None:
    """Restore upstream's methods on ``transformers.PreTrainedModel``. A no-op when not patched.

    Only the methods that are still hf_ckpt's are put back: a method another library patched in after
    :func:`patch_transformers` is left in place (with a warning), since restoring upstream's would silently undo
    that library's patch.
    """
    from transformers import PreTrainedModel

    replaced = []
    for name, original in _originals.items():
        if PreTrainedModel.__dict__.get(name) is GradientCheckpointingMixin.__dict__[name]:
            setattr(PreTrainedModel, name, original)
        else:
            replaced.append(name)
    _originals.clear()
    _trainer_callback("uninstall")
    if replaced:
        warn_once(
            f"unpatch_transformers left PreTrainedModel.{', '.join(replaced)} as it is: another library patched "
            "it after hf_ckpt did, and restoring upstream's method would undo that patch.",
            key=f"unpatch:{replaced}",
        )
