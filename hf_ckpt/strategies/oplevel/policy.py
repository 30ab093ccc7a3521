"""``OpPolicy``: which op occurrences of a block keep their outputs for backward; everything else is recomputed.

An op occurrence is spelled ``"aten.mm.default#3"``: the fourth call of that aten overload in one forward of the
block, counted the way PyTorch's selective checkpointing counts the ops it sees (every aten op except the
metadata ops in ``torch.utils.checkpoint.SAC_IGNORED_OPS``). The spelling is plain data: a policy pickles,
deep-copies and round-trips through JSON, and a person can read which matmuls a plan keeps.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from hf_ckpt.strategies.selective.policy import InPlaceGuard, selective_contexts

_KEY = re.compile(r"^[A-Za-z_][\w.]*#\d+$")


def op_key(func: Any, occurrence: int) -> str:
    """``"aten.mm.default#3"``: the spelling of the ``occurrence``-th call (from 0) of ``func`` in a forward."""
    return f"{func}#{occurrence}"


def ignored_ops() -> frozenset:
    return frozenset(getattr(torch.utils.checkpoint, "SAC_IGNORED_OPS", ()))


@dataclass(frozen=True)
class OpPolicy:
    """The op occurrences of a block whose outputs are saved (``MUST_SAVE``); all others are ``PREFER_RECOMPUTE``.

    Attributes:
        saved: Op occurrences, each ``"<aten overload>#<occurrence>"`` (``"aten.mm.default#0"``), sorted.
    """

    saved: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.saved, (str, bytes)) or not isinstance(self.saved, Iterable):
            raise TypeError(
                f"saved must be a list of op occurrences like 'aten.mm.default#0'; got {type(self.saved).__name__}"
            )
        saved = tuple(self.saved)
        bad = [key for key in saved if not isinstance(key, str) or not _KEY.match(key)]
        if bad:
            raise ValueError(
                f"saved must hold op occurrences spelled '<aten overload>#<occurrence>' (e.g. 'aten.mm.default#0'); "
                f"got {bad[0]!r}"
            )
        object.__setattr__(self, "saved", tuple(sorted(set(saved), key=_sort_key)))

    def context_fn(self, respect_saved_tensors_hooks: bool | None = False) -> Callable[[], Any]:
        """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint`` applying this policy (picklable).

        A policy that saves nothing is plain checkpointing: it gets torch's no-op contexts, without the selective
        machinery's per-op dispatch. ``respect_saved_tensors_hooks``: see :func:`hf_ckpt.strategies.selective.policy.selective_contexts`.
        """
        if not self.saved:
            from torch.utils.checkpoint import noop_context_fn

            return noop_context_fn
        return functools.partial(_op_contexts, frozenset(self.saved), respect_saved_tensors_hooks)


def _sort_key(key: str) -> tuple[str, int]:
    name, _, occurrence = key.rpartition("#")
    return name, int(occurrence)


def _occurrences(saved: frozenset) -> dict[str, frozenset[int]]:
    """``{"aten.mm.default": {0, 4}}`` from ``{"aten.mm.default#0", "aten.mm.default#4"}``."""
    by_op: dict[str, set[int]] = {}
    for key in saved:
        name, _, occurrence = key.rpartition("#")
        by_op.setdefault(name, set()).add(int(occurrence))
    return {name: frozenset(occurrences) for name, occurrences in by_op.items()}


class _Counting:
    """The policy function: counts op occurrences per pass and answers MUST_SAVE for the listed ones.

    PyTorch >= 2.9 calls the policy in forward only; older releases call it in the recompute too, with
    ``ctx.is_recompute`` set. Each pass has its own counter, so both see the same numbering. It runs for every op
    of the block: the saved occurrences are looked up per op object (its name is spelled once per op, not per
    call).
    """

    _EMPTY: frozenset[int] = frozenset()

    def __init__(self, saved: frozenset) -> None:
        from torch.utils.checkpoint import CheckpointPolicy

        self.saved = saved
        self._by_name = _occurrences(saved)
        self._by_op: dict[Any, frozenset[int]] = {}
        self.counts: dict[bool, Counter] = {False: Counter(), True: Counter()}
        self.last: tuple[Any, bool] = (None, False)
        self._answers = (CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.MUST_SAVE)

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        counts = self.counts[bool(getattr(ctx, "is_recompute", False))]
        occurrence = counts[func]
        counts[func] = occurrence + 1
        wanted = self._by_op.get(func)
        if wanted is None:
            wanted = self._by_op[func] = self._by_name.get(str(func), self._EMPTY)
        keep = occurrence in wanted
        self.last = (func, keep)
        return self._answers[keep]


def _op_contexts(saved: frozenset, respect_saved_tensors_hooks: bool | None = False) -> tuple[Any, Any]:
    """PyTorch's selective checkpoint contexts for ``saved``, plus hf_ckpt's in-place guard in forward."""
    policy = _Counting(saved)
    forward_context, recompute_context = selective_contexts(policy, respect_saved_tensors_hooks)
    ignored = ignored_ops()

    def last_decision(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        decided, keep = policy.last
        if func in ignored or decided is not func:
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    stack = contextlib.ExitStack()

    class _Forward:
        def __enter__(self) -> None:
            stack.enter_context(forward_context)
            stack.enter_context(InPlaceGuard(last_decision))

        def __exit__(self, *exc_info: Any) -> Any:
            return stack.__exit__(*exc_info)

    return _Forward(), recompute_context
