"""Warn-once bookkeeping.

A setting that cannot take effect warns exactly once, per model where the warning is about a model, and per
process otherwise. Nothing is stored on the model itself: the per-model record lives in a weak dictionary, so it
vanishes with the model and never changes its behaviour.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

_per_object: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
_per_process: set[str] = set()


class HfCkptWarning(UserWarning):
    """Category of every warning hf_ckpt emits, so users can filter them in one line."""


def warn_once(message: str, *, key: str | None = None, owner: Any = None, stacklevel: int = 3) -> bool:
    """Emit ``message`` once per ``owner`` (or once per process when ``owner`` is None).

    Returns True when the warning was emitted now, False when it had been emitted already.
    """
    key = key or message
    if owner is not None:
        seen = _per_object.setdefault(owner, set())
    else:
        seen = _per_process
    if key in seen:
        return False
    seen.add(key)
    warnings.warn(message, HfCkptWarning, stacklevel=stacklevel)
    return True
