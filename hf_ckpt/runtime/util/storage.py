"""The storage behind a tensor: what memory accounting and the saved-tensor hooks key tensors by."""

from __future__ import annotations

from typing import Any

import torch


def storage_of(value: Any) -> torch.UntypedStorage | None:
    """The untyped storage behind a plain tensor, or None (no tensor, meta/sparse tensor, tensor subclass)."""
    if not isinstance(value, torch.Tensor) or value.is_meta or value.layout is not torch.strided:
        return None
    try:
        return value.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
