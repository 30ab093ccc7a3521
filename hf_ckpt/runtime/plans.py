"""``CheckpointPlan``: a per-block checkpointing strategy, readable when printed and saved as JSON.

A plan is data: :func:`hf_ckpt.plan` makes one from a profiling step, ``hf_ckpt.enable(model, plan=plan)``
applies it, and a training script can load one saved earlier (``CheckpointPlan.load(path)``, or
``gradient_checkpointing_kwargs={"plan": "plan.json"}`` with the stock ``Trainer``).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from torch import nn

from hf_ckpt.runtime.util.units import format_bytes as _mib
from hf_ckpt.runtime.util.units import format_flops
from hf_ckpt.runtime.util.warn import HfCkptWarning
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.kinds import parse, strategy_class, summary_order

_FORMAT_VERSION = 1

#: The config fields that decide a block's activation shapes; a plan records them and checks them when applied.
_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "d_model", "d_ff",
                 "n_embd", "n_head", "num_heads")
def model_signature(model: nn.Module) -> dict[str, Any]:
    """What a plan records of the model it was made for: ``model_type``, the block count and the shape fields."""
    config = getattr(model, "config", None)
    signature: dict[str, Any] = {"model_type": getattr(config, "model_type", None), "num_blocks": len(find_blocks(model))}
    for name in _SHAPE_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            signature[name] = value
    return signature


@dataclass(frozen=True)
class CheckpointPlan:
    """One strategy per repeated block (global order: encoder blocks, then decoder blocks).

    Attributes:
        strategies: ``"full"``, ``"selective"`` or ``"none"`` for each block, or ``"oplevel:<name>"`` (one of
            ``policies``), or ``"partition:<F>"``: the block's forward and backward graphs split by torch's min-cut
            partitioner at ``activation_memory_budget=F``, run in eager mode (:mod:`hf_ckpt.strategies.partition.graph`);
            ``"partition:<F>:norms"`` lets the partitioner recompute layer norms and softmaxes too.
        predicted_bytes: Activation bytes the plan is predicted to retain at the end of forward.
        predicted_recompute_flops: FLOPs the plan is predicted to spend recomputing in backward.
        baseline_bytes: Activation bytes retained without any checkpointing (the 100% of a fractional budget).
        budget_bytes: The budget the plan was made for, when it was made by :func:`hf_ckpt.plan`.
        block_bytes: Measured retained bytes of each block under each strategy (the profile the plan used).
        block_recompute_flops: Measured recompute FLOPs of each block under each strategy.
        model_type: ``config.model_type`` of the model profiled.
        made_for: The model the plan was made for (:func:`model_signature`): model type, block count and the
            config fields that decide activation shapes. Applying the plan to a model that differs warns, naming
            both.
        policies: Op-level policies by name: the op occurrences (``"aten.mm.default#0"``) whose outputs a block
            with strategy ``"oplevel:<name>"`` keeps; it recomputes every other op (see :mod:`hf_ckpt.strategies.oplevel`).
        outside_blocks: Names of cheap modules between the blocks (``"model.norm"``) that are recomputed in
            backward instead of keeping their insides and their outputs (:mod:`hf_ckpt.strategies.outside.hook`).
        head_chunk_size: Run a causal LM's output projection and loss in checkpointed chunks of this many tokens
            (``hf_ckpt.enable``'s ``head_chunk_size``, which, given, takes precedence); None: not chunked.
    """

    strategies: tuple[str, ...]
    predicted_bytes: int | None = None
    predicted_recompute_flops: int | None = None
    baseline_bytes: int | None = None
    budget_bytes: int | None = None
    block_bytes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    block_recompute_flops: dict[str, tuple[int, ...]] = field(default_factory=dict)
    model_type: str | None = None
    made_for: dict[str, Any] = field(default_factory=dict)
    policies: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outside_blocks: tuple[str, ...] = ()
    head_chunk_size: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.strategies, (str, bytes)) or not hasattr(self.strategies, "__iter__"):
            raise TypeError(f"plan strategies must be a list with one strategy per block; got {self.strategies!r}")
        if not isinstance(self.policies, dict):
            raise TypeError(f"policies must be a dict from a policy name to a list of op occurrences; got {type(self.policies).__name__}")
        object.__setattr__(self, "policies", {k: _checked_policy(k, v) for k, v in self.policies.items()})
        object.__setattr__(self, "strategies", tuple(self._checked_strategy(s) for s in self.strategies))
        object.__setattr__(self, "outside_blocks", _checked_module_names(self.outside_blocks))
        chunk = self.head_chunk_size
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"head_chunk_size must be a positive int or None; got {chunk!r}")
        object.__setattr__(self, "block_bytes", {k: tuple(v) for k, v in self.block_bytes.items()})
        object.__setattr__(
            self, "block_recompute_flops", {k: tuple(v) for k, v in self.block_recompute_flops.items()}
        )

    def _checked_strategy(self, strategy: Any) -> str:
        """A block's strategy, as the registry (:func:`hf_ckpt.strategies.parse`) spells it."""
        return parse(strategy, self.policies).spelling

    @property
    def num_blocks(self) -> int:
        return len(self.strategies)

    def check_made_for(self, model: nn.Module) -> None:
        """Warn when ``model`` is not the kind of model the plan was made for (type or activation shapes)."""
        if not self.made_for:
            return
        actual = model_signature(model)
        differing = {k: (v, actual.get(k)) for k, v in self.made_for.items() if k in actual and actual[k] != v}
        if differing:
            details = ", ".join(f"{k}: plan {a!r}, model {b!r}" for k, (a, b) in differing.items())
            warnings.warn(
                f"This plan was made for another model ({details}); its per-block memory and recompute figures "
                "do not hold for this one. Make the plan on the model you train.",
                HfCkptWarning,
                stacklevel=5,
            )

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
        data["outside_blocks"] = list(self.outside_blocks)
        return {"format": "hf_ckpt.CheckpointPlan", "version": _FORMAT_VERSION, **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Any) -> "CheckpointPlan":
        """The plan in ``data`` (as :meth:`to_dict` writes it); ValueError saying what is wrong otherwise."""
        if not isinstance(data, dict):
            raise ValueError(f"not an hf_ckpt plan: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != "hf_ckpt.CheckpointPlan":
            raise ValueError("not an hf_ckpt plan: the JSON lacks \"format\": \"hf_ckpt.CheckpointPlan\"")
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(f"plan format version {data.get('version')!r} is not supported (this hf_ckpt reads {_FORMAT_VERSION})")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"format", "version"})
        if unknown:
            raise ValueError(f"unknown plan fields {unknown}; a plan has: {', '.join(sorted(known))}")
        if "strategies" not in data:
            raise ValueError("the plan has no \"strategies\" list")
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except (TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"invalid plan: {error}") from None

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CheckpointPlan":
        """The plan saved at ``path``; ValueError naming the file and what is wrong with it."""
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"plan file {str(path)!r} does not exist" + (" (it is a directory)" if file.is_dir() else ""))
        try:
            data = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"plan file {str(path)!r} is not valid JSON: {error}") from None
        try:
            return cls.from_dict(data)
        except ValueError as error:
            raise ValueError(f"plan file {str(path)!r}: {error}") from None

    def summary(self) -> str:
        """One line: how many blocks run each strategy, and how many modules between the blocks are recomputed
        (``"2 full, 2 none"``, ``"4 partition:0.9, outside 3 modules"``)."""
        counts = {s: self.strategies.count(s) for s in summary_order(self.strategies)}
        parts = [f"{n} {s}" for s, n in counts.items()]
        if self.outside_blocks:
            parts.append(f"outside {len(self.outside_blocks)} module{'s' if len(self.outside_blocks) > 1 else ''}")
        if self.head_chunk_size is not None:
            parts.append(f"head in chunks of {self.head_chunk_size} tokens")
        return ", ".join(parts)

    def __str__(self) -> str:
        lines = [
            f"CheckpointPlan for {self.num_blocks} blocks"
            + (f" ({self.model_type})" if self.model_type else "")
            + ": "
            + self.summary(),
        ]
        if self.budget_bytes is not None:
            lines.append(f"  budget:    {_mib(self.budget_bytes)}")
        if self.predicted_bytes is not None:
            share = f" ({100 * self.predicted_bytes / self.baseline_bytes:.1f}% of no checkpointing)" if self.baseline_bytes else ""
            lines.append(f"  predicted: {_mib(self.predicted_bytes)}{share}")
        if self.predicted_recompute_flops is not None:
            lines.append(f"  recompute: {format_flops(self.predicted_recompute_flops)}")
        lines.append("  block  strategy")
        lines.extend(f"  {i:>5}  {s}" for i, s in enumerate(self.strategies))
        for name, saved in self.policies.items():
            lines.append(f"  policy {name}: keeps {', '.join(saved)}; recomputes every other op")
        if self.outside_blocks:
            lines.append(f"  recomputed between the blocks: {', '.join(self.outside_blocks)}")
        return "\n".join(lines)


def _checked_policy(name: Any, saved: Any) -> tuple[str, ...]:
    """A policy of ``"oplevel:<name>"`` blocks, checked by that kind (:mod:`hf_ckpt.strategies.oplevel.spec`)."""
    return strategy_class("oplevel").check_policy(name, saved)


def _checked_module_names(names: Any) -> tuple[str, ...]:
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(f"outside_blocks must be a list of module names; got {names!r}")
    names = tuple(names)
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise ValueError(f"outside_blocks must hold module names (non-empty strings, e.g. 'model.norm'); got {bad[0]!r}")
    return names
