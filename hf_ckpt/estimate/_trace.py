"""Trace one training step of the reduced model on fake tensors: bytes retained per block, peak, FLOPs.

The reduced model (at most two blocks per block type, see :mod:`._model`) gets parameters made under a
``FakeTensorMode``: tensors with shapes, dtypes and a device but no data, so a step at 8k tokens of a 70B
layer costs milliseconds and no memory. The step runs under :class:`hf_ckpt.measure.StorageTracker`, the same
tracker :func:`hf_ckpt.measure.measure_step` uses on real tensors, with each storage labelled by the block that
created it (as the planner does): what is alive when forward returns, per block and outside the blocks, is
what a real step retains. FLOPs come from :func:`hf_ckpt.measure.count_flops` on the same fake step, so they
are the figures ``hf_ckpt.measure`` would count on a real one.

Data-dependent Python control flow (``if tensor.item()``) cannot run on fake tensors; batches are built without
an attention mask (causal models use ``is_causal``), which is the packed-sequence case.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from ..blocks import Block
from ..config import CheckpointConfig
from ..core import apply_config, remove
from ..plans import CheckpointPlan
from ..selective import SelectiveRecomputeError
from ._attention import attention_for

#: The per-block strategies traced; every other strategy (every_n:k, a plan) is composed from them.
TRACED = ("none", "full", "selective")


@dataclass(frozen=True)
class Trace:
    """What the reduced model's step cost, per traced strategy (all blocks set to it).

    Attributes:
        base_bytes: Bytes retained at the end of forward outside the blocks (embeddings, head, loss, masks).
        retained: ``retained[strategy][j]``: bytes traced block ``j`` retains at the end of forward.
        transient: Peak during the step above the bytes retained at the end of forward (gradients excluded).
        step_flops: FLOPs of the reduced step without checkpointing.
        block_flops: Forward and backward FLOPs of each traced block without checkpointing.
        recompute_flops: ``recompute_flops[strategy][j]``: FLOPs traced block ``j`` spends recomputing.
        unusable: Strategies that cannot run on this model, with the reason.
    """

    base_bytes: dict[str, int]
    retained: dict[str, tuple[int, ...]]
    transient: dict[str, int]
    step_flops: int
    block_flops: tuple[int, ...]
    recompute_flops: dict[str, tuple[int, ...]]
    unusable: dict[str, str]


def fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def to_fake(model: nn.Module, mode: Any, device: str = "cpu") -> nn.Module:
    """Replace the (meta) parameters and buffers of ``model`` by fake tensors on ``device``, ties kept."""
    made: dict[int, torch.Tensor] = {}
    with mode:
        for module in model.modules():
            for name, parameter in list(module._parameters.items()):
                if parameter is None:
                    continue
                if id(parameter) not in made:
                    data = torch.empty(parameter.shape, dtype=parameter.dtype, device=device)
                    made[id(parameter)] = nn.Parameter(data, requires_grad=parameter.requires_grad)
                module._parameters[name] = made[id(parameter)]
            for name, buffer in list(module._buffers.items()):
                if buffer is None:
                    continue
                if id(buffer) not in made:
                    made[id(buffer)] = torch.zeros(buffer.shape, dtype=buffer.dtype, device=device)
                module._buffers[name] = made[id(buffer)]
    return model


def _loss(output: Any) -> torch.Tensor:
    from ..measure.step import loss_of

    return loss_of(output, None, caller="estimate: ")


def _apply(model: nn.Module, strategies: tuple[str, ...] | None, strategy: str | None = None) -> None:
    remove(model)
    if strategy == "none" or (strategies is not None and all(s == "none" for s in strategies)):
        return
    if strategies is not None:
        apply_config(model, CheckpointConfig.from_arguments({}, dict_name="checkpoint_kwargs",
                                                            plan=CheckpointPlan(strategies)))
    else:
        apply_config(model, CheckpointConfig.from_arguments({}, dict_name="checkpoint_kwargs", strategy=strategy))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _memory_step(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], mode: Any, device: str):
    """(base bytes, bytes per block, transient peak) of one fake step, labelled by block."""
    from ..measure.memory import StorageTracker

    current: list[int | None] = [None]
    handles = []
    for block in blocks:
        handles.append(block.module.register_forward_pre_hook(lambda m, a, i=block.index: current.__setitem__(0, i)))
        handles.append(block.module.register_forward_hook(lambda m, a, o: current.__setitem__(0, None)))
    try:
        with mode, attention_for(device), StorageTracker(label=lambda: current[0]) as tracker:
            loss = _loss(model(**inputs))
            by_block = tracker.live_bytes_by_label("meta")
            retained = sum(by_block.values())
            tracker.reset_peak()
            loss.backward()
            peak = tracker.peak_bytes().get("meta", 0)
            del loss
    finally:
        for handle in handles:
            handle.remove()
    return by_block.get(None, 0), tuple(by_block.get(block.index, 0) for block in blocks), max(0, peak - retained)


def _flops_step(model: nn.Module, inputs: Mapping[str, Any], mode: Any) -> tuple[int, dict[str, int]]:
    """Whole-step FLOPs and FLOPs per module name, of one fake step."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..measure.flops import _missing_formulas

    counter = FlopCounterMode(display=False, custom_mapping=_missing_formulas())
    with mode, counter:
        _loss(model(**inputs)).backward()
    per_module = {name: sum(counts.values()) for name, counts in counter.get_flop_counts().items()}
    return int(counter.get_total_flops()), per_module


def _preallocate_grads(model: nn.Module, mode: Any) -> None:
    """Gradients exist before the step (counted apart, as persistent state), so the tracker does not count them."""
    with mode:
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)


def _block_names(model: nn.Module, blocks: list[Block]) -> list[str]:
    names = {id(module): name for name, module in model.named_modules()}
    root = type(model).__name__
    return [f"{root}.{names[id(block.module)]}" if names.get(id(block.module)) else "" for block in blocks]


def trace(
    model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], mode: Any, device: str,
    strategies: tuple[str, ...] = TRACED,
) -> Trace:
    """Trace the fake ``model`` (its blocks ``blocks``) on ``inputs`` under each of ``strategies``."""
    base: dict[str, int] = {}
    retained: dict[str, tuple[int, ...]] = {}
    transient: dict[str, int] = {}
    recompute: dict[str, tuple[int, ...]] = {}
    unusable: dict[str, str] = {}
    _preallocate_grads(model, mode)
    with _quiet():
        for strategy in dict.fromkeys(("none", *strategies)):
            _apply(model, None, strategy)
            try:
                base[strategy], retained[strategy], transient[strategy] = _memory_step(
                    model, blocks, inputs, mode, device
                )
            except SelectiveRecomputeError as error:
                unusable[strategy] = str(error)
        remove(model)
        step_flops, per_module = _flops_step(model, inputs, mode)
        names = _block_names(model, blocks)
        block_flops = tuple(per_module.get(name, 0) for name in names)
        for strategy in retained:
            if strategy == "none":
                recompute[strategy] = (0,) * len(blocks)
                continue
            per_block = []
            for block in blocks:  # one traced block at a time: whole-step totals are exact
                plan = tuple(strategy if b.index == block.index else "none" for b in blocks)
                _apply(model, plan)
                total, _ = _flops_step(model, inputs, mode)
                per_block.append(max(0, total - step_flops))
            recompute[strategy] = tuple(per_block)
        remove(model)
    for parameter in model.parameters():
        parameter.grad = None
    return Trace(base, retained, transient, step_flops, block_flops, recompute, unusable)
