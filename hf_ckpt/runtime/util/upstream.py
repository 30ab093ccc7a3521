"""transformers' own ``gradient_checkpointing_*`` methods, kept here by :func:`hf_ckpt.patch_transformers` while it is
in effect (the bench's upstream settings call them without importing the patch)."""

from __future__ import annotations

from typing import Any

PATCHED_NAMES = (
    "gradient_checkpointing_enable",
    "gradient_checkpointing_disable",
    "activation_checkpointing_enable",
    "activation_checkpointing_disable",
)
ORIGINALS: dict[str, Any] = {}


def original(name: str) -> Any:
    """Upstream's ``PreTrainedModel.<name>``, also while :func:`hf_ckpt.patch_transformers` is in effect."""
    from transformers import PreTrainedModel

    if name not in PATCHED_NAMES:
        raise ValueError(f"name must be one of {', '.join(PATCHED_NAMES)}; got {name!r}")
    if name in ORIGINALS:
        return ORIGINALS[name]
    if name not in PreTrainedModel.__dict__:
        raise ValueError(f"transformers.PreTrainedModel has no {name} in this release")
    return PreTrainedModel.__dict__[name]
