"""``MemoryEstimate``: what one training step will need, per checkpointing strategy; printable and JSON."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from hf_ckpt.runtime.util.units import format_bytes, precision_label
from hf_ckpt.estimation._sharding import optimizer_definition

_FORMAT = "hf_ckpt.MemoryEstimate"


#: The table's short words for where a peak falls (:attr:`MemoryEstimate.peak_phase`).
_PHASES = {"the optimizer step": "optimizer step", "the backward of the head and loss": "backward: head, loss",
           "the forward's loss": "forward: loss",
           "backward, gradients held whole": "backward (all grads)"}


def _short_phase(phase: str) -> str:
    return _PHASES.get(phase, phase.replace("the backward of ", "backward: "))


@dataclass(frozen=True)
class MemoryEstimate:
    """The predicted memory and compute of one training step (forward, backward, optimizer state).

    All byte counts are per device: the whole model's with ``shard="none"``, the engine's share under FSDP or
    ZeRO (``world_size`` > 1). The fixed part (:attr:`fixed_bytes`) is ``parameters_bytes + gradients_bytes +
    optimizer_bytes + buffer_bytes + gather_bytes``; activations depend on the strategy.

    Attributes:
        model_type: ``config.model_type``.
        model_class: The model class estimated (with its training head).
        device: Target device type (``"cuda"`` or ``"cpu"``).
        dtype: Training dtype of the parameters (and of the activations, without ``autocast``).
        autocast: The dtype the step's autocast runs matmuls in (mixed precision), or None.
        batch_size: Sequences per step.
        seq_len: Tokens per sequence (encoder and decoder alike for encoder-decoder models).
        optimizer: The optimizer whose states are counted.
        peft: The PEFT method (``"LORA"``, ...) or None for full fine-tuning.
        parameters: Number of parameters (tied weights once).
        trainable_parameters: Number of parameters that receive gradients.
        parameters_bytes: Bytes of the parameters.
        gradients_bytes: Bytes of the gradients of the trainable parameters.
        optimizer_bytes: Bytes of the optimizer states on the device.
        activation_bytes: Bytes retained at the end of forward, per strategy (what backward holds).
        peak_bytes: Predicted peak of a steady step per strategy: the most the step's timeline holds (see
            :mod:`hf_ckpt.estimation._timeline`: the backward as the gradients appear, the optimizer step).
        first_step_peak_bytes: The same for the first step, before the optimizer has allocated its states.
        peak_phase: Per strategy, where the steady step's peak falls (``"the optimizer step"``, ``"the backward
            of block 27"``, ``"the forward's loss"``, ``"the backward of the head and loss"``, or ``"backward, gradients held whole"`` with
            gradient accumulation or a sharded engine).
        gradient_accumulation_steps: Micro-batches per optimizer step: above 1 the later ones run with every
            gradient held.
        optimizer_step_bytes: What the optimizer's step allocates above its states (its temporaries; single
            device: a sharded engine's step is ``step_bytes``).
        held_above_bytes: What the backward holds beside a plan's activations at its peak, for the planners (the
            parameters, optimizer states, gradients made by then and transients; every activation counted in each
            block's phase: a bound for any plan): keyed ``""`` with the head whole, ``"head:<chunk>"`` chunked.
        recompute_flops: FLOPs the strategy adds to the step, per strategy: the recompute in backward, plus any
            change of kernel a checkpointed block makes (T5's attention takes SDPA's math path in checkpointed
            blocks, where its zero position bias requires grad, and counts fewer FLOPs there: this term can be
            below zero).
        step_flops: FLOPs of the whole step (forward, recompute, backward) per strategy.
        flops_ratio: ``step_flops[strategy] / step_flops["none"]``.
        num_blocks: Repeated blocks of the model (encoder then decoder).
        traced_blocks: Blocks actually traced (at most two per block type).
        block_bytes: Per base strategy (none, full, selective), the bytes each block retains, whatever the next
            block runs (the largest: a block's output is kept when the next block checkpoints it); additive, as
            the planner's solver needs, so a plan's sum never understates.
        block_recompute_flops: Per base strategy, each block's recompute FLOPs.
        base_bytes: Bytes retained outside the blocks (embeddings, head, loss), the largest over strategies.
        representative: For each block, the traced block that stands for it.
        transient_bytes: Per strategy, the step's peak above the bytes retained at the end of forward, with every
            gradient held (gradient accumulation's later micro-batches).
        unusable: Strategies that cannot run on this model, with the reason.
        attention: How attention's saved tensors were obtained (traced or modelled) for the device.
        notes: What the figures assume.
        keep_outputs: The training loop estimated: False, the ``Trainer``'s (only the loss is held into backward);
            True, a loop that keeps the model's outputs (logits, ...) alive through backward, counted in
            ``activation_bytes``, ``base_bytes`` and ``peak_bytes``.
        world_size: Devices the states are sharded over.
        shard: ``none``, ``fsdp-full``, ``fsdp-grad-op``, ``zero1``, ``zero2`` or ``zero3``.
        offload_optimizer: Optimizer states (and master weights, gradient partitions) on the host.
        offload_parameters: Parameter partitions on the host.
        fsdp_param_dtype: FSDP2's mixed-precision ``param_dtype`` (units gathered and computed in it, the shards
            and states in ``dtype``), or None.
        buffer_bytes: The engine's buffers kept on the device between steps (ZeRO-3's gradient bucket).
        gather_bytes: The most the engine holds above its steady state during forward and backward (gathered units
            and their unsharded gradients, ZeRO-1/2's gradient bucket).
        step_bytes: What the optimizer step allocates on the device (ZeRO's fp32 gradient partition).
        host_bytes: Host memory one device's offloaded states take.
        model_parameters_bytes: The whole model's parameter bytes (as one device would hold them).
        model_gradients_bytes: The whole model's gradient bytes.
        model_optimizer_bytes: The whole model's optimizer bytes, defined as ``optimizer_bytes`` is (under ZeRO: fp32
            master weights and fp32 states; else the states in the parameters' dtype).
        head_chunk_size: The chunk (tokens) of the chunked head estimated (the row ``full+head:<chunk>``), or None
            where it was not (a model that refuses it: the reason is in ``unusable``).
        head_base_bytes: ``base_bytes`` with the head chunked (its logits and their float32 copy not retained).
        head_transient_bytes: ``transient_bytes`` per base strategy with the head chunked.
        head_recompute_flops: FLOPs the chunked head adds (its projection recomputed in backward).
        head_smaller_chunk_size: Where ``head_chunk_size`` was chosen (not given) and raised to its floor (128
            tokens, or the sequence), the memory rule's smaller chunk, traced too: a plan falls back to it where a
            whole-step budget needs its smaller transients; None otherwise.
        head_smaller_base_bytes, head_smaller_transient_bytes, head_smaller_recompute_flops: ``head_base_bytes``,
            ``head_transient_bytes`` and ``head_recompute_flops`` for ``head_smaller_chunk_size`` (more chunks
            retain a little more: each keeps its loss share and its checkpoint's record).
        quantization: The bitsandbytes quantization of the base (``"4bit nf4, double quant, compute bfloat16"``,
            ``"8bit (LLM.int8)"``) counted in ``parameters_bytes`` and the transients, or None.
        mlp_chunk_size: The chunk (tokens) of the chunked MLP estimated (the rows ``full+mlp:<m>`` and
            ``full+head:<c>+mlp:<m>``), or None where it was not (not asked, or refused: the reason in ``unusable``).
        activation_host_bytes: With ``offload_activations``: host bytes of each ``<row>+offload`` (the checkpointed
            block inputs the offload keeps in pinned host memory); empty otherwise.
    """

    model_type: str | None
    model_class: str
    device: str
    dtype: str
    batch_size: int
    seq_len: int
    optimizer: str
    peft: str | None
    parameters: int
    trainable_parameters: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activation_bytes: dict[str, int]
    peak_bytes: dict[str, int]
    recompute_flops: dict[str, int]
    step_flops: dict[str, int]
    flops_ratio: dict[str, float]
    num_blocks: int
    traced_blocks: int
    block_bytes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    block_recompute_flops: dict[str, tuple[int, ...]] = field(default_factory=dict)
    base_bytes: int = 0
    representative: tuple[int, ...] = ()
    transient_bytes: dict[str, int] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)
    attention: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    autocast: str | None = None
    keep_outputs: bool = False
    world_size: int = 1
    shard: str = "none"
    offload_optimizer: bool = False
    offload_parameters: bool = False
    fsdp_param_dtype: str | None = None
    buffer_bytes: int = 0
    gather_bytes: int = 0
    step_bytes: int = 0
    host_bytes: int = 0
    model_parameters_bytes: int = 0
    model_gradients_bytes: int = 0
    model_optimizer_bytes: int = 0
    head_chunk_size: int | None = None
    head_base_bytes: int = 0
    head_transient_bytes: dict[str, int] = field(default_factory=dict)
    head_recompute_flops: int = 0
    head_smaller_chunk_size: int | None = None
    head_smaller_base_bytes: int = 0
    head_smaller_transient_bytes: dict[str, int] = field(default_factory=dict)
    head_smaller_recompute_flops: int = 0
    quantization: str | None = None
    mlp_chunk_size: int | None = None
    activation_host_bytes: dict[str, int] = field(default_factory=dict)
    first_step_peak_bytes: dict[str, int] = field(default_factory=dict)
    peak_phase: dict[str, str] = field(default_factory=dict)
    gradient_accumulation_steps: int = 1
    optimizer_step_bytes: int = 0
    held_above_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def fixed_bytes(self) -> int:
        """Parameters, gradients, optimizer states and the engine's buffers and gathers: what every strategy
        needs on the device."""
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes + self.buffer_bytes
                + self.gather_bytes)

    @property
    def optimizer_step_peak_bytes(self) -> int:
        """The device during the optimizer step: parameters, gradients, states, the engine's buffers and the
        step's temporaries."""
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes + self.buffer_bytes
                + self.step_bytes + self.optimizer_step_bytes)

    def fits(self, device_memory: int) -> dict[str, bool]:
        """Per strategy, whether the predicted peak fits ``device_memory`` bytes."""
        return {name: peak <= device_memory for name, peak in self.peak_bytes.items()}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["block_bytes"] = {k: list(v) for k, v in self.block_bytes.items()}
        data["block_recompute_flops"] = {k: list(v) for k, v in self.block_recompute_flops.items()}
        data["notes"] = list(self.notes)
        data["representative"] = list(self.representative)
        return {"format": _FORMAT, "version": 1, **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_json` to ``path``."""
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(self.to_json() + "\n")

    def table(self, device_memory: int | None = None) -> str:
        """One row per strategy: activation memory, peak (a steady step's), whether it fits, FLOPs ratio (and,
        with offloaded rows, the host memory they take), the first step's peak and where the peak falls."""
        header = ["strategy", "activations", "peak", "fits", "FLOPs ratio"]
        host = bool(self.activation_host_bytes)
        header += (["host"] if host else []) + ["first step", "peak in"]
        rows = []
        fits = self.fits(device_memory) if device_memory is not None else {}
        for name in self.activation_bytes:
            rows.append([
                name, format_bytes(self.activation_bytes[name]), format_bytes(self.peak_bytes[name]),
                ("yes" if fits[name] else "no") if fits else "-", f"{self.flops_ratio[name]:.3f}x",
            ] + ([format_bytes(self.activation_host_bytes[name]) if name in self.activation_host_bytes else "-"]
                 if host else [])
              + [format_bytes(self.first_step_peak_bytes.get(name, self.peak_bytes[name])),
                 _short_phase(self.peak_phase.get(name, "-"))])
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        last = len(header) - 1  # the phase, left-aligned like the names
        lines = ["  ".join(str(c).ljust(w) if i in (0, last) else str(c).rjust(w)
                           for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in [header, *rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def _sharding_line(self) -> str:
        if self.shard == "none":
            return ""
        offload = [what for what, on in (("optimizer", self.offload_optimizer), ("parameters", self.offload_parameters))
                   if on]
        mixed = f", units gathered and computed in {self.fsdp_param_dtype}" if self.fsdp_param_dtype else ""
        return (f"per device of {self.world_size} ({self.shard}{', offload ' + ' and '.join(offload) if offload else ''}"
                f"{mixed}): engine buffers {format_bytes(self.buffer_bytes)}, gathered in forward/backward "
                f"{format_bytes(self.gather_bytes)}, optimizer step {format_bytes(self.step_bytes)}, host "
                f"{format_bytes(self.host_bytes)}; whole model: parameters {format_bytes(self.model_parameters_bytes)}"
                f", gradients {format_bytes(self.model_gradients_bytes)}, optimizer "
                f"{format_bytes(self.model_optimizer_bytes)}; optimizer figures count "
                f"{optimizer_definition(self.shard)}\n")

    def __str__(self) -> str:
        lora = f", {self.peft}" if self.peft else ""
        lora += f" on a {self.quantization} base" if self.quantization else ""
        loop = "outputs kept through backward" if self.keep_outputs else "outputs dropped (the Trainer's step)"
        head = (
            f"{self.model_class} ({self.parameters / 1e9:.2f}B parameters, {self.num_blocks} blocks, "
            f"{self.traced_blocks} traced); batch {self.batch_size} x seq {self.seq_len}, "
            f"{precision_label(self.dtype, self.autocast)} on "
            f"{self.device}, {self.optimizer}{lora}; {loop}\n"
            f"parameters {format_bytes(self.parameters_bytes)}, gradients {format_bytes(self.gradients_bytes)}, "
            f"optimizer {format_bytes(self.optimizer_bytes)} (fixed {format_bytes(self.fixed_bytes)})\n"
            + self._sharding_line() +
            f"attention: {self.attention.get('kernel', '-')}"
            + (" [modelled, unverified on hardware]" if self.attention.get("modelled") else "")
        )
        return head + "\n" + self.table()
