"""What happens to one repeated block in backward: the one definition every module uses."""

from __future__ import annotations

from enum import Enum


class BlockStrategy(str, Enum):
    """A per-block checkpointing strategy.

    A ``str`` enum: members compare equal to their values, so plans and configs may carry plain strings
    (``"full"``), as JSON does.

    Attributes:
        FULL: Recompute the whole block in backward; only its inputs are kept.
        SELECTIVE: Keep the outputs of its matmuls and attention, recompute the cheap ops in between.
        NONE: No checkpointing: keep every activation.
    """

    FULL = "full"
    SELECTIVE = "selective"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


#: Every strategy, in the order the planner tries them (cheapest recompute first).
ALL_STRATEGIES: tuple[str, ...] = tuple(s.value for s in (BlockStrategy.NONE, BlockStrategy.SELECTIVE, BlockStrategy.FULL))


def check_strategy(value: object, name: str = "strategy") -> BlockStrategy:
    """``value`` as a :class:`BlockStrategy`; ValueError naming ``name`` and the accepted values otherwise."""
    try:
        return BlockStrategy(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {', '.join(repr(s) for s in ALL_STRATEGIES)}; got {value!r}") from None
