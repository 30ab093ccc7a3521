"""What :func:`hf_ckpt.verify` found: :class:`VerifyReport` and its parts, with a readable ``str``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GradientParity:
    """Gradients of one parameter group, with checkpointing against without.

    Attributes:
        group: ``"embeddings"``, ``"block <i>"``, ``"other"`` or ``"head"`` (see
            :func:`hf_ckpt.verification.parameter_groups`).
        parameters: Number of parameter tensors in the group that received a gradient in either step.
        max_abs_diff: Largest absolute difference of one gradient element between the two steps.
        reference_max: Largest absolute gradient element of the group in the step without checkpointing.
        rtol: Accepted ``max_abs_diff``, relative to ``reference_max``.
        atol: Absolute slack added to the accepted difference.
        missing: Parameters (by name) that got a gradient in one step only; never acceptable.
    """

    group: str
    parameters: int
    max_abs_diff: float
    reference_max: float
    rtol: float
    atol: float
    missing: tuple[str, ...] = ()

    @property
    def max_rel_diff(self) -> float:
        """``max_abs_diff / reference_max``: 0 when both are 0, ``inf`` when only the difference is non-zero."""
        if self.max_abs_diff == 0:
            return 0.0
        return self.max_abs_diff / self.reference_max if self.reference_max > 0 else math.inf

    @property
    def ok(self) -> bool:
        return not self.missing and self.max_abs_diff <= self.atol + self.rtol * self.reference_max


@dataclass(frozen=True)
class InplaceInput:
    """A recomputed block's input that was modified in place between the forward and the recompute.

    Attributes:
        block: Index of the block.
        argument: Which input, as the block's ``forward`` names it (``hidden_states``, ``position_embeddings[0]``).
        version_at_forward: The tensor's version counter when the block first ran.
        version_at_recompute: Its version counter when the backward recomputed the block.
    """

    block: int
    argument: str
    version_at_forward: int
    version_at_recompute: int


@dataclass
class VerifyReport:
    """What :func:`hf_ckpt.verify` found. ``report.ok`` is the verdict; ``str(report)`` explains it.

    Attributes:
        model: The model's class name.
        setting: The checkpointing setting that was verified, in words.
        block_names: Qualified module name of every block, by index.
        expected_recomputed: Blocks the model's flags say are recomputed (:func:`hf_ckpt.checkpointed_layers`).
        recomputed: Blocks that actually ran again in the backward of the checkpointed step.
        gradients: Gradient parity per parameter group, in model order.
        loss: Loss of the checkpointed step.
        reference_loss: Loss of the step without checkpointing.
        random_blocks: Recomputed blocks that draw random numbers (dropout): the ones the RNG check applies to.
        rng_mismatch: Of those, the blocks whose recompute started from another RNG state than their forward.
        inplace_inputs: Inputs of recomputed blocks modified in place between forward and recompute.
        error: The error the checkpointed step raised (for example a ``CheckpointError``), if any.
        always_checkpointed: Blocks checkpointed by wrappers verify cannot switch off (``torch.distributed``'s
            ``CheckpointWrapper``, accelerate's FSDP ``activation_checkpointing``): the reference step recomputes
            them too, so their gradient parity compares checkpointed against checkpointed.
    """

    model: str
    setting: str
    block_names: list[str]
    expected_recomputed: list[int]
    recomputed: list[int]
    gradients: list[GradientParity] = field(default_factory=list)
    loss: float | None = None
    reference_loss: float | None = None
    random_blocks: list[int] = field(default_factory=list)
    rng_mismatch: list[int] = field(default_factory=list)
    inplace_inputs: list[InplaceInput] = field(default_factory=list)
    error: str | None = None
    always_checkpointed: list[int] = field(default_factory=list)

    @property
    def missing_recompute(self) -> list[int]:
        """Blocks that should have been recomputed and were not: checkpointing silently off there."""
        return sorted(set(self.expected_recomputed) - set(self.recomputed))

    @property
    def unexpected_recompute(self) -> list[int]:
        """Blocks that were recomputed although the flags say they are not."""
        return sorted(set(self.recomputed) - set(self.expected_recomputed))

    @property
    def gradients_ok(self) -> bool:
        return all(group.ok for group in self.gradients)

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and not self.missing_recompute
            and not self.unexpected_recompute
            and self.gradients_ok
            and not self.rng_mismatch
            and not self.inplace_inputs
        )

    def __str__(self) -> str:
        lines = [f"hf_ckpt.verify: {self.model} ({self.setting}): {'OK' if self.ok else 'FAILED'}"]
        if not self.expected_recomputed and not self.recomputed:
            lines.append("  note: no block is set to be recomputed, so checkpointing is off on this model")
        if self.always_checkpointed:
            lines.append(
                f"  note: blocks {self.always_checkpointed} are checkpointed by wrappers verify cannot switch off, "
                "so the reference step recomputes them too"
            )
        if self.error is not None:
            lines.append(f"  [FAIL] the checkpointed step raised {self.error}")
            if self.inplace_inputs:
                lines.extend(self._inplace_lines())
            return "\n".join(lines)
        lines.append(self._recompute_line())
        lines.extend(self._gradient_lines())
        lines.append(self._rng_line())
        lines.extend(self._inplace_lines())
        return "\n".join(lines)

    def _recompute_line(self) -> str:
        status = "ok" if not (self.missing_recompute or self.unexpected_recompute) else "FAIL"
        line = f"  [{status}] recomputed blocks: expected {self.expected_recomputed}, measured {self.recomputed}"
        if self.missing_recompute:
            names = ", ".join(self.block_names[i] for i in self.missing_recompute)
            line += f"\n         not recomputed although checkpointed (checkpointing silently off): {names}"
        if self.unexpected_recompute:
            names = ", ".join(self.block_names[i] for i in self.unexpected_recompute)
            line += f"\n         recomputed although not checkpointed: {names}"
        return line

    def _gradient_lines(self) -> list[str]:
        status = "ok" if self.gradients_ok else "FAIL"
        labels = [self._group_label(group.group) for group in self.gradients]
        width = max([len("group")] + [len(label) for label in labels])
        lines = [
            f"  [{status}] gradient parity, checkpointed vs not (loss {self.loss:.6g} vs {self.reference_loss:.6g}):",
            f"         {'group':<{width}} {'params':>6} {'max abs diff':>13} {'max rel diff':>13} {'rtol':>8}",
        ]
        for label, group in zip(labels, self.gradients):
            flag = "" if group.ok else "  <- FAIL"
            lines.append(
                f"         {label:<{width}} {group.parameters:>6} {group.max_abs_diff:>13.3e} "
                f"{group.max_rel_diff:>13.3e} {group.rtol:>8.0e}{flag}"
            )
            if group.missing:
                lines.append(f"           gradient in one step only: {', '.join(group.missing)}")
        return lines

    def _group_label(self, group: str) -> str:
        if group.startswith("block "):
            return f"{group} ({self.block_names[int(group.split()[1])]})"
        return group

    def _rng_line(self) -> str:
        if not self.random_blocks:
            return "  [ok] RNG replay: no recomputed block draws random numbers (no active dropout): nothing to replay"
        if self.rng_mismatch:
            return (
                f"  [FAIL] RNG replay: blocks {self.rng_mismatch} drew other random numbers in the recompute than in "
                "the forward (was preserve_rng_state=False passed?)"
            )
        return f"  [ok] RNG replay: recomputed blocks {self.random_blocks} replayed the forward's random numbers"

    def _inplace_lines(self) -> list[str]:
        if not self.inplace_inputs:
            return ["  [ok] in-place inputs: no input of a recomputed block was modified before its recompute"]
        lines = ["  [FAIL] in-place inputs: the recompute ran on modified inputs, so its gradients are wrong:"]
        for item in self.inplace_inputs:
            lines.append(
                f"         block {item.block} ({self.block_names[item.block]}): {item.argument} was modified in place "
                f"after the forward (version {item.version_at_forward} -> {item.version_at_recompute})"
            )
        return lines
