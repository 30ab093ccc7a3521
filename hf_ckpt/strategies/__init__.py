"""Per-block strategy kinds, one folder each, and the planner's choices among them. The registry (:class:`Strategy`,
:func:`register`, :func:`parse`, ``none`` and ``full``) is the runtime's (:mod:`hf_ckpt.runtime.kinds`), re-exported
here. Each further kind is a folder whose ``__init__`` registers it, the one line that names it
(:func:`~hf_ckpt.runtime.kinds.register_lazy`), and whose ``spec`` holds its class, loaded when a setting first uses
it: ``selective`` (torch's selective checkpointing), ``oplevel`` (a plan's op-level policy), ``partition`` (the min-cut
partitioner). This package is imported with ``hf_ckpt``. The planner's ``"outside"`` is no kind (:data:`OUTSIDE`)."""

from __future__ import annotations

from hf_ckpt.runtime.kinds import (
    ALL_STRATEGIES, FULL, MODIFIERS, NONE, SELECTIVE, WHOLE_MODEL_STRATEGIES, BlockStrategy, Full, NoCheckpoint, Setting,
    Strategy, Wrap, keeps_everything, kind_class, kind_of, kinds, parse, register, strategy_class,
    summary_order,
)
from hf_ckpt.strategies import oplevel, outside, partition, selective  # noqa: F401  (each registers its kind)

OUTSIDE = outside.OUTSIDE
#: What ``hf_ckpt.plan(strategies=...)`` takes beyond :data:`ALL_STRATEGIES` (the op-level planner's options: every
#: kind that takes an argument, then :data:`OUTSIDE`), and all it takes.
FINER_CHOICES: tuple[str, ...] = (*(kind for kind in kinds() if kind not in ALL_STRATEGIES), OUTSIDE)
PLANNER_CHOICES: tuple[str, ...] = (*ALL_STRATEGIES, *FINER_CHOICES)
