"""The ``"oplevel:<name>"`` kind: a plan's op-level policy, the op occurrences whose outputs a block keeps
(:mod:`hf_ckpt.strategies.oplevel.policy`); every other op is recomputed."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from hf_ckpt.strategies.oplevel.policy import OpPolicy
from hf_ckpt.runtime.kinds import Setting, Strategy
from hf_ckpt.strategies.selective.spec import CONTEXT_FN_REFUSES, check_selective_contexts, respected_hooks


class OpLevel(Strategy):
    """``"oplevel:<name>"``: keep the outputs of the op occurrences ``policies[name]`` lists (``"aten.mm.default#0"``).

    Attributes:
        name: The policy's name in the plan.
        saved: The op occurrences it keeps.
    """

    kind = "oplevel"
    uses_context_fn = True
    refuses = CONTEXT_FN_REFUSES

    def __init__(self, name: str, saved: tuple[str, ...]) -> None:
        self.name, self.saved = name, tuple(saved)

    @staticmethod
    def check_policy(name: Any, saved: Any) -> tuple[str, ...]:
        """A plan's ``policies[name]``: the op occurrences it keeps, normalised; ValueError naming what is wrong."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"policies keys must be non-empty names without ':'; got {name!r}")
        return OpPolicy(saved).saved

    @classmethod
    def from_argument(cls, argument: str | None, spelling: str, policies: Mapping[str, Any]) -> "OpLevel":
        if argument is None or argument not in policies:
            raise ValueError(
                f"each plan strategy 'oplevel:<name>' must name a key of policies "
                f"({', '.join(sorted(policies)) or 'none given'}); got {spelling!r}"
            )
        return cls(argument, policies[argument])

    @property
    def spelling(self) -> str:
        return f"{self.kind}:{self.name}"

    def check(self, config: Setting) -> None:
        check_selective_contexts(self, config)

    def context_fn(self, config: Setting) -> Callable[[], Any]:
        return OpPolicy(self.saved).context_fn(respected_hooks(config))
