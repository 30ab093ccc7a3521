"""Wrapping a module's ``forward`` where a hook cannot do the job, without ever removing someone else's wrapper.

A block that its stack calls directly must run *inside* a checkpoint function, and a module a plan recomputes
outside the blocks must run under one; no module hook can do that, so hf_ckpt wraps the instance's ``forward``, as
torch's ``checkpoint_wrapper`` wraps a module. Other libraries wrap the same attribute (accelerate's device and
mixed-precision hooks, TRL's fused head), before hf_ckpt or after it. So:

* the wrapper calls whatever ``forward`` the instance had when it was put on (another library's wrapper included);
* undoing it puts the previous ``forward`` back only while the wrapper is still the instance's ``forward``; when
  another library wrapped it since, the wrapper stays inside that library's wrapper and only stops acting (it calls
  what it wraps), so the other wrapper is never removed.

The model's own top-level ``forward`` is never wrapped: the chunked head runs in module hooks
(:mod:`hf_ckpt.runtime.head`).
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn


class ForwardWrapper:
    """An instance ``forward`` of hf_ckpt's: ``function(inner, *args, **kwargs)`` while active, ``inner(...)`` after.

    A module-level class (a model holding one still pickles); ``__wrapped__`` lets ``inspect.signature`` see the
    wrapped signature, as ``functools.wraps`` would."""

    def __init__(self, function: Callable[..., Any], inner: Callable[..., Any]) -> None:
        self.function, self.inner, self.active = function, inner, True
        self.__wrapped__ = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.active:
            return self.function(self.inner, *args, **kwargs)
        return self.inner(*args, **kwargs)


_ABSENT = object()


def wrap_forward(module: nn.Module, function: Callable[..., Any]) -> Callable[[], None]:
    """Make ``module``'s calls run ``function(forward, *args, **kwargs)``, ``forward`` being the instance's
    ``forward`` now; returns the undo (see the module docstring: it never removes a wrapper put on since)."""
    previous = module.__dict__.get("forward", _ABSENT)
    wrapper = ForwardWrapper(function, module.forward)
    module.forward = wrapper

    def undo() -> None:
        wrapper.active = False
        if module.__dict__.get("forward") is not wrapper:
            return  # wrapped again since, by someone else: stay in their chain, passing calls through
        if previous is _ABSENT:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = previous

    return undo
