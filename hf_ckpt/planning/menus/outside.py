"""The planner's ``"outside"`` option: recompute the cheap modules between the blocks (:mod:`hf_ckpt.strategies.outside.hook`).

:func:`outside_option` finds the modules (:func:`cheap_modules`, one measured forward) and
measures, in one step with no block checkpointed, what recomputing them saves (bytes alive when forward returns)
and costs (FLOPs and elementwise output elements counted in backward). The solver sees it as one more row of the
menu, ``"none"`` (keep them: the saving is not made) or ``"outside"``, so it is chosen only where the saving buys
more than it costs.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import torch
from torch import nn

from hf_ckpt.runtime.apply import remove
from hf_ckpt.runtime.util.flop_formulas import flop_registry
from hf_ckpt.strategies.outside.hook import DROPOUTS
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime._torch import TorchDispatchMode
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.planning.profiling import apply_setting, left_as_found, measured_step
from hf_ckpt.solver.knapsack import Option
from hf_ckpt.strategies import OUTSIDE

#: The most FLOPs per output element a module between the blocks may spend to be recomputed (norms, activations,
#: rotary tables, embeddings lookups: a few; a projection: thousands).
MAX_FLOPS_PER_ELEMENT = 4


def outside_option(model: nn.Module, sample_inputs: Mapping[str, Any], *, loss_fn: Any = None,
                   **checkpoint_kwargs: Any) -> tuple[tuple[str, ...], list[Option]]:
    """(module names, the menu row: keep them or recompute them), or ``((), [])`` when none qualifies or
    recomputing them saves nothing."""
    target = target_model(model)
    blocks = find_blocks(target)
    with left_as_found(model):
        remove(model)
        names = cheap_modules(target, sample_inputs, blocks)
        if not names:
            return (), []
        measured = []
        for outside in ((), names):
            apply_setting(model, checkpoint_kwargs, plan=CheckpointPlan(("none",) * len(blocks), outside_blocks=outside))
            base, per_block, flops, elementwise = measured_step(model, blocks, sample_inputs, loss_fn)
            measured.append((base + sum(per_block), flops, elementwise))
        remove(model)
    (kept, flops, elementwise), (recomputed, outside_flops, outside_elementwise) = measured
    if recomputed >= kept:
        return (), []
    extra_flops = max(0, outside_flops - flops)
    extra = extra_flops + max(0, outside_elementwise - elementwise)
    return names, [Option("none", kept - recomputed, 0, 0, 0), Option(OUTSIDE, 0, extra, 1, extra_flops)]


class _CallCosts(TorchDispatchMode):
    """Per module (by id) on the stack: matmul-class FLOPs and whether a random op ran outside ``dropouts`` (torch's
    dropout modules, whose draws are replayed from the RNG state)."""

    def __init__(self, dropouts: set[int]) -> None:
        super().__init__()
        self.registry = flop_registry()
        self.dropouts = dropouts
        self.stack: list[int] = []
        self.flops: dict[int, int] = {}
        self.random: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.stack:
            formula = self.registry.get(func.overloadpacket)
            flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
            for key in self.stack:
                self.flops[key] = self.flops.get(key, 0) + flops
            if torch.Tag.nondeterministic_seeded in func.tags and self.stack[-1] not in self.dropouts:
                self.random.update(self.stack)
        return out


def cheap_modules(model: nn.Module, inputs: Mapping[str, Any], blocks: tuple | list) -> tuple[str, ...]:
    """Names of the outermost modules of ``model`` that hold no block and are cheap to recompute, measured in one
    training forward: called, no random op outside torch's dropout modules (those are replayed from their RNG
    state), at most :data:`MAX_FLOPS_PER_ELEMENT` FLOPs per output element, tensors (or a tuple of tensors) out.
    A module holding others (BERT's embeddings: lookups, a sum, a norm, a dropout) is chosen whole where it is
    cheap, so that only its inputs are kept; its modules then are not named."""
    inside = {id(m) for block in blocks for m in block.module.modules()}
    names = {id(m): name for name, m in model.named_modules()
             if name and not any(id(d) in inside for d in m.modules())}
    dropouts = {id(m) for m in model.modules() if isinstance(m, DROPOUTS)}
    costs, outputs = _CallCosts(dropouts), {}
    handles = []
    for module in model.modules():
        if id(module) in names:
            handles.append(module.register_forward_pre_hook(functools.partial(_note_call, costs)))
            handles.append(module.register_forward_hook(functools.partial(_note_output, costs, outputs), always_call=True))
    try:
        with torch.enable_grad(), costs:
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    cheap = {names[key] for key, elements in outputs.items()
             if elements and key not in costs.random and costs.flops.get(key, 0) <= MAX_FLOPS_PER_ELEMENT * elements}
    return tuple(sorted(name for name in cheap if not any(name.startswith(outer + ".") for outer in cheap)))


def _note_call(costs: _CallCosts, module: nn.Module, args: Any) -> None:
    costs.stack.append(id(module))


def _note_output(costs: _CallCosts, outputs: dict, module: nn.Module, args: Any, output: Any) -> None:
    costs.stack.pop()
    values = output if isinstance(output, tuple) else (output,)
    if all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in values):
        outputs[id(module)] = outputs.get(id(module), 0) + sum(v.numel() for v in values)
    else:
        outputs[id(module)] = 0  # anything but floating-point tensors out: never recomputed
