"""Warn-once bookkeeping, attributed to the user's own line.

A setting that cannot take effect warns exactly once, per model where the warning is about a model, and per
process otherwise. Nothing is stored on the model itself: the per-model record lives in a weak dictionary, so it
vanishes with the model and never changes its behaviour.

Warnings point at the user's code: ``stacklevel="user"`` walks up the stack to the first frame outside hf_ckpt and
the libraries it works inside (torch, transformers, peft, accelerate, TRL, ...), so that a warning raised from a
hook deep in a forward pass names the line of the training script that ran it, and ``-W``/``filterwarnings``
module filters see the user's module.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from typing import Any

_per_object: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
_per_process: set[str] = set()

#: Top-level packages whose frames are never "the user's code".
_LIBRARIES = frozenset(
    {"hf_ckpt", "torch", "transformers", "peft", "accelerate", "trl", "sentence_transformers", "deepspeed",
     "functools", "contextlib", "importlib", "runpy"}
)


class HfCkptWarning(UserWarning):
    """Category of every warning hf_ckpt emits, so users can filter them in one line."""


def _user_frame() -> Any:
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.partition(".")[0] not in _LIBRARIES:
            return frame
        frame = frame.f_back
    return None


def warn_user(message: str, category: type[Warning] = None) -> None:
    """``warnings.warn(message, category)``, attributed to the first frame of the user's code."""
    category = category or HfCkptWarning
    frame = _user_frame()
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    globals_ = frame.f_globals
    where = dict(filename=frame.f_code.co_filename, lineno=frame.f_lineno, module=globals_.get("__name__", "__main__"),
                 registry=globals_.setdefault("__warningregistry__", {}))
    try:
        warnings.warn_explicit(message, category, **where, module_globals=globals_)
    except ImportError:  # code whose loader has no source (``python -c``, stdin): the warning without a source line
        warnings.warn_explicit(message, category, **where)


def warn_once(message: str, *, key: str | None = None, owner: Any = None, stacklevel: int | str = "user") -> bool:
    """Emit ``message`` once per ``owner`` (or once per process when ``owner`` is None).

    ``stacklevel="user"`` (the default) attributes the warning to the user's code; an int is passed to
    ``warnings.warn``. Returns True when the warning was emitted now, False when it had been emitted already.
    """
    key = key or message
    seen = _per_object.setdefault(owner, set()) if owner is not None else _per_process
    if key in seen:
        return False
    seen.add(key)
    if stacklevel == "user":
        warn_user(message)
    else:
        warnings.warn(message, HfCkptWarning, stacklevel=stacklevel)
    return True
