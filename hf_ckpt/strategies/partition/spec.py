"""The ``"partition:<F>[:norms]"`` kind: the block's forward and backward graphs split by torch's min-cut
partitioner at ``activation_memory_budget=F`` and run in eager mode (:mod:`hf_ckpt.strategies.partition.graph`)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from hf_ckpt.strategies.partition.graph import check_budget, partition_unavailable, partitioned_checkpoint
from hf_ckpt.runtime.kinds import MODIFIERS, Setting, Strategy, Wrap

#: Suffix of a partition whose partitioner may also recompute norms and softmaxes: ``"partition:0.5:norms"``.
NORMS = ":norms"


class Partition(Strategy):
    """``"partition:<F>"``: the partitioner's budget ``F`` in ``[0, 1]``; ``"partition:<F>:norms"`` lets it
    recompute layer norms and softmaxes too (their own kernels), as inductor does after decomposing them.

    Attributes:
        budget: The partitioner's ``activation_memory_budget``.
        norms: Whether norms and softmaxes may be recomputed.
    """

    kind = "partition"
    saved_tensor_hook = True
    #: Every modifier: a partitioned block runs its own graphs, not ``torch.utils.checkpoint``.
    refuses = frozenset(MODIFIERS)
    names_refusals = True

    @classmethod
    def unavailable(cls) -> str | None:
        return partition_unavailable()

    def __init__(self, budget: float, norms: bool = False) -> None:
        self.budget, self.norms = float(budget), bool(norms)

    @classmethod
    def from_argument(cls, argument: str | None, spelling: str, policies: Mapping[str, Any]) -> "Partition":
        text = argument or ""
        norms = text.endswith(NORMS)
        text = text[: -len(NORMS)] if norms else text
        try:
            value: Any = float(text)
        except ValueError:
            value = text
        name = f"the budget of plan strategy {spelling!r} ('partition:<F>' or 'partition:<F>:norms')"
        return cls(check_budget(value, name), norms)

    @property
    def spelling(self) -> str:
        return f"{self.kind}:{self.budget:g}{NORMS if self.norms else ''}"

    def check(self, config: Setting) -> None:
        reason = self.unavailable()
        if reason is not None:
            raise ValueError(f"a plan with 'partition:<F>' blocks cannot run: {reason}")
        refused = self.refused(config)
        if refused:
            raise ValueError(
                f"a plan with 'partition:<F>' blocks cannot be combined with {' and '.join(refused)}: a partitioned "
                "block runs its own forward and backward graphs, not torch.utils.checkpoint. Drop them, or make the "
                "plan without partitions."
            )

    def checkpoint_function(self, config: Setting, checkpoint_kwargs: Mapping[str, Any],
                            wrap: Wrap) -> Callable[..., Any]:
        return functools.partial(partitioned_checkpoint, budget=self.budget, recompute_norms=self.norms,
                                 **checkpoint_kwargs)
