"""One training step, measured: activation memory, FLOPs and the blocks that were recomputed.

:func:`measure_step` runs ``loss = loss_fn(model(**batch)); loss.backward()`` once, under a
:class:`~hf_ckpt.meters.memory.StorageTracker`, a ``FlopCounterMode`` and a
:class:`~hf_ckpt.runtime.counting.BlockRunCounter`, and returns a :class:`StepMeasurement`. It measures the model as it
is: enable checkpointing first (``hf_ckpt.enable``, upstream's methods, anything), then measure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from hf_ckpt.runtime.counting import BlockRunCounter
from hf_ckpt.meters.flops import count_flops
from hf_ckpt.meters.memory import StorageTracker

LossFn = Callable[[Any], torch.Tensor]


def loss_of(output: Any, loss_fn: LossFn | None = None, *, caller: str = "", inputs: str = "the batch") -> torch.Tensor:
    """``loss_fn(output)``, or the loss the model returned; a clear error when there is none.

    ``caller`` prefixes the message (``"verify: "``) and ``inputs`` names what the user passed (``"sample_inputs"``).
    """
    if loss_fn is not None:
        return loss_fn(output)
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise ValueError(
            f"{caller}the model returned no loss: put labels in {inputs}, or pass loss_fn (a function from the "
            "model's output to a scalar tensor)"
        )
    return loss


def run_forward(model: nn.Module, batch: Mapping[str, Any]) -> Any:
    """``model(**batch)`` as one forward of a training loop, under the caller's autocast if any.

    A loop enters autocast around each forward (the ``Trainer``, through accelerate, wraps ``forward``): each
    forward casts the weights anew, and at its exit autocast empties its cache of casts, freeing those backward does
    not keep. Called inside one long autocast context (``with torch.autocast(...): hf_ckpt.plan(...)``), steps
    would share cached casts instead: a later step would not count them, and a checkpointed block's would stay
    alive. So the cache is emptied before and after the forward, as at a loop's autocast exit; outside autocast it
    is empty and this is a no-op.
    """
    torch.clear_autocast_cache()
    try:
        return model(**batch)
    finally:
        torch.clear_autocast_cache()


def forward_loss(model: nn.Module, batch: Mapping[str, Any], loss_fn: LossFn | None = None) -> torch.Tensor:
    """The forward half of a step: ``loss_fn(model(**batch))`` (:func:`run_forward`); only the loss is kept, as a
    training loop does."""
    return loss_of(run_forward(model, batch), loss_fn)


def training_step(model: nn.Module, batch: Mapping[str, Any], loss_fn: LossFn | None = None) -> float:
    """One forward and backward pass (no optimizer step); returns the loss."""
    loss = forward_loss(model, batch, loss_fn)
    loss.backward()
    return float(loss.detach())


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def _allocator(device: torch.device) -> Any | None:
    """``torch.cuda`` (or another backend module) when it reports allocated memory for ``device``, else None."""
    backend = getattr(torch, device.type, None)
    needed = ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "synchronize")
    if device.type == "cpu" or backend is None or not all(hasattr(backend, name) for name in needed):
        return None
    return backend


@dataclass(frozen=True)
class StepMeasurement:
    """What one training step cost.

    Attributes:
        device: The model's device (``"cpu"``, ``"cuda:0"``, ...).
        retained_bytes: Bytes on ``device`` of the storages created during forward that are still alive when
            forward has returned (the loss included): what backward holds. The activation memory.
        peak_bytes: The most bytes on ``device`` of storages created during the step alive at once (forward
            and backward: activations, temporaries, recomputed activations, gradients); None where not measured
            (a ``compile:F`` setting: its compiled graphs are measured, not the step).
        retained_bytes_by_device / peak_bytes_by_device: The same per device; offloaded copies appear under
            ``"cpu"`` when the model is on an accelerator.
        flops: FLOPs of the whole step (forward, recompute, backward), by ``FlopCounterMode``.
        recomputed_blocks: Blocks that ran more than once in the step, counted by ``BlockRunCounter``.
        block_runs: ``{block index: runs}`` for every block.
        allocator_retained_bytes / allocator_peak_bytes: The device allocator's view (``memory_allocated``
            after forward and ``max_memory_allocated`` during the step, both less what was allocated before the
            step); None where the backend does not report it (CPU).
        loss: The loss of the step.
    """

    device: str
    retained_bytes: int
    peak_bytes: int | None  # None where not measured (a torch.compile setting's row)
    retained_bytes_by_device: dict[str, int]
    peak_bytes_by_device: dict[str, int]
    flops: int
    recomputed_blocks: list[int]
    block_runs: dict[int, int] = field(default_factory=dict)
    allocator_retained_bytes: int | None = None
    allocator_peak_bytes: int | None = None
    loss: float = float("nan")


def measure_step(
    model: nn.Module,
    batch: Mapping[str, Any],
    *,
    loss_fn: LossFn | None = None,
) -> StepMeasurement:
    """Run one training step of ``model`` on ``batch`` and measure its memory, FLOPs and recompute.

    Two steps run: one under the storage tracker and the block-run counter (memory, recompute), then one under
    ``FlopCounterMode`` (whose module tracker would itself hold memory). The model is put in training mode and
    its gradients are set to None before each (as ``optimizer.zero_grad()`` does), so that every measured step
    starts alike; the gradients of the last step are left in place.

    Args:
        model: A ``PreTrainedModel`` (or PEFT model), checkpointing enabled or not, on its device.
        batch: Keyword arguments for ``model``, already on the model's device; give labels so the model returns
            a loss, or pass ``loss_fn``.
        loss_fn: Maps the model's output to the scalar loss; default: ``output.loss``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of keyword arguments for the model; got {type(batch).__name__}")
    device = model_device(model)
    model.train()
    model.zero_grad(set_to_none=True)
    allocator = _allocator(device)
    if allocator is not None:
        allocator.synchronize(device)
        allocator.reset_peak_memory_stats(device)
        allocated_before = allocator.memory_allocated(device)

    with BlockRunCounter(model) as runs, StorageTracker() as tracker:
        loss = forward_loss(model, batch, loss_fn)
        retained = tracker.live_bytes()
        if allocator is not None:
            allocator.synchronize(device)
            allocator_retained = allocator.memory_allocated(device) - allocated_before
        loss.backward()
        peak = tracker.peak_bytes()
    if allocator is not None:
        allocator.synchronize(device)
        allocator_peak = allocator.max_memory_allocated(device) - allocated_before
    loss_value = float(loss.detach())
    del loss

    # FlopCounterMode's module tracker keeps tensors alive during backward, so FLOPs get a step of their own.
    model.zero_grad(set_to_none=True)
    with count_flops() as flops:
        training_step(model, batch, loss_fn)

    key = str(device)
    return StepMeasurement(
        device=key,
        retained_bytes=retained.get(key, 0),
        peak_bytes=peak.get(key, 0),
        retained_bytes_by_device=retained,
        peak_bytes_by_device=peak,
        flops=flops.total,
        recomputed_blocks=runs.recomputed(),
        block_runs={block.index: runs.counts[block.index] for block in runs.blocks},
        allocator_retained_bytes=allocator_retained if allocator is not None else None,
        allocator_peak_bytes=allocator_peak if allocator is not None else None,
        loss=loss_value,
    )
