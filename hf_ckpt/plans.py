"""``CheckpointPlan``: a per-block checkpointing strategy, readable when printed and saved as JSON.

A plan is data: :func:`hf_ckpt.plan` makes one from a profiling step, ``hf_ckpt.enable(model, plan=plan)``
applies it, and a training script can load one saved earlier (``CheckpointPlan.load(path)``, or
``gradient_checkpointing_kwargs={"plan": "plan.json"}`` with the stock ``Trainer``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_FORMAT_VERSION = 1
_VALID = ("full", "selective", "none")
#: Prefix of a strategy that applies one of the plan's op-level policies: ``"oplevel:<name>"``.
_OPLEVEL = "oplevel:"


def _mib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f} MiB"


@dataclass(frozen=True)
class CheckpointPlan:
    """One strategy per repeated block (global order: encoder blocks, then decoder blocks).

    Attributes:
        strategies: ``"full"``, ``"selective"`` or ``"none"`` for each block.
        predicted_bytes: Activation bytes the plan is predicted to retain at the end of forward.
        predicted_recompute_flops: FLOPs the plan is predicted to spend recomputing in backward.
        baseline_bytes: Activation bytes retained without any checkpointing (the 100% of a fractional budget).
        budget_bytes: The budget the plan was made for, when it was made by :func:`hf_ckpt.plan`.
        block_bytes: Measured retained bytes of each block under each strategy (the profile the plan used).
        block_recompute_flops: Measured recompute FLOPs of each block under each strategy.
        model_type: ``config.model_type`` of the model profiled, for the reader's benefit.
        policies: Op-level policies by name: the op occurrences (``"aten.mm.default#0"``) whose outputs a block
            with strategy ``"oplevel:<name>"`` keeps; it recomputes every other op (see :mod:`hf_ckpt.oplevel`).
    """

    strategies: tuple[str, ...]
    predicted_bytes: int | None = None
    predicted_recompute_flops: int | None = None
    baseline_bytes: int | None = None
    budget_bytes: int | None = None
    block_bytes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    block_recompute_flops: dict[str, tuple[int, ...]] = field(default_factory=dict)
    model_type: str | None = None
    policies: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategies", tuple(self.strategies))
        if not isinstance(self.policies, dict):
            raise TypeError(f"policies must be a dict from a policy name to a list of op occurrences; got {type(self.policies).__name__}")
        object.__setattr__(self, "policies", {k: _checked_policy(k, v) for k, v in self.policies.items()})
        bad = [
            s for s in self.strategies
            if s not in _VALID and not (isinstance(s, str) and s.startswith(_OPLEVEL) and s[len(_OPLEVEL):] in self.policies)
        ]
        if bad:
            raise ValueError(
                f"plan strategies must each be one of {', '.join(_VALID)} or 'oplevel:<name>' with <name> a key of "
                f"policies ({', '.join(sorted(self.policies)) or 'none given'}); got {bad[0]!r}"
            )
        object.__setattr__(self, "block_bytes", {k: tuple(v) for k, v in self.block_bytes.items()})
        object.__setattr__(
            self, "block_recompute_flops", {k: tuple(v) for k, v in self.block_recompute_flops.items()}
        )

    @property
    def num_blocks(self) -> int:
        return len(self.strategies)

    def check_fits(self, num_blocks: int) -> None:
        """Raise when the plan was made for a model with another number of blocks."""
        if num_blocks != self.num_blocks:
            raise ValueError(
                f"plan has a strategy for {self.num_blocks} blocks, but this model has {num_blocks} repeated blocks; "
                "make the plan on the same architecture"
            )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["strategies"] = list(self.strategies)
        data["block_bytes"] = {k: list(v) for k, v in self.block_bytes.items()}
        data["block_recompute_flops"] = {k: list(v) for k, v in self.block_recompute_flops.items()}
        data["policies"] = {k: list(v) for k, v in self.policies.items()}
        return {"format": "hf_ckpt.CheckpointPlan", "version": _FORMAT_VERSION, **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CheckpointPlan":
        if data.get("format") != "hf_ckpt.CheckpointPlan":
            raise ValueError("not an hf_ckpt plan: the JSON lacks \"format\": \"hf_ckpt.CheckpointPlan\"")
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(f"plan format version {data.get('version')!r} is not supported (this hf_ckpt reads {_FORMAT_VERSION})")
        fields = {k: v for k, v in data.items() if k not in ("format", "version")}
        return cls(**fields)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CheckpointPlan":
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"plan file {str(path)!r} does not exist")
        return cls.from_dict(json.loads(file.read_text()))

    def __str__(self) -> str:
        counts = {s: self.strategies.count(s) for s in dict.fromkeys(self.strategies)}
        lines = [
            f"CheckpointPlan for {self.num_blocks} blocks"
            + (f" ({self.model_type})" if self.model_type else "")
            + ": "
            + ", ".join(f"{n} {s}" for s, n in counts.items()),
        ]
        if self.budget_bytes is not None:
            lines.append(f"  budget:    {_mib(self.budget_bytes)}")
        if self.predicted_bytes is not None:
            share = f" ({100 * self.predicted_bytes / self.baseline_bytes:.1f}% of no checkpointing)" if self.baseline_bytes else ""
            lines.append(f"  predicted: {_mib(self.predicted_bytes)}{share}")
        if self.predicted_recompute_flops is not None:
            lines.append(f"  recompute: {self.predicted_recompute_flops / 1e9:.4f} GFLOP")
        lines.append("  block  strategy")
        lines.extend(f"  {i:>5}  {s}" for i, s in enumerate(self.strategies))
        for name, saved in self.policies.items():
            lines.append(f"  policy {name}: keeps {', '.join(saved)}; recomputes every other op")
        return "\n".join(lines)


def _checked_policy(name: Any, saved: Any) -> tuple[str, ...]:
    from .oplevel import OpPolicy

    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"policies keys must be non-empty names without ':'; got {name!r}")
    return OpPolicy(saved).saved
