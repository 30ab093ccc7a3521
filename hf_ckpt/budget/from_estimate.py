"""Each plan of a budget made at the first training batch: the step estimated on meta and fake tensors for the
batch's shapes (:func:`estimate_for`, cached per shape), ``"auto"`` resolved against the device's free memory less
what the step still allocates (gradients, the optimizer's first-step state, the largest transient), and the cheapest
plan within the budget (:func:`plan_for`)."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from hf_ckpt.budget import forms as _budget
from hf_ckpt.budget.record import DeferredBudget, ModelWeights
from hf_ckpt.runtime.util.compat import has_peft_adapters
from hf_ckpt.runtime.util.units import format_bytes, precision_label
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.meters.optimizer_states import pending_state_bytes, unwrap
from hf_ckpt.estimation import estimate, plan_from_estimate
from hf_ckpt.estimation._engine import detected_sharding, still_allocated
from hf_ckpt.estimation._model import build_on_meta
from hf_ckpt.strategies.selective.policy import selective_supported
from hf_ckpt.strategies import FULL, NONE, SELECTIVE, strategy_class

_CACHE_SIZE = 16
_estimates: dict[tuple, Any] = {}


def _peft_config(target: nn.Module) -> Any:
    configs = target.__dict__.get("peft_config") if has_peft_adapters(target) else None
    if not isinstance(configs, Mapping) or not configs:
        return None
    return configs.get("default") or next(iter(configs.values()))


def _strategies(request: DeferredBudget) -> tuple[str, ...]:
    config = request.config()
    selective = not strategy_class(SELECTIVE)().refused(config) and selective_supported()
    return (NONE, FULL, SELECTIVE) if selective else (NONE, FULL)


def estimate_for(target: nn.Module, shape: tuple[int, int], strategies: tuple[str, ...],
                 autocast: torch.dtype | None = None, keep_outputs: bool = False) -> Any:
    """The estimator's :class:`~hf_ckpt.estimation.MemoryEstimate` for ``target`` at ``shape`` (under autocast to
    ``autocast`` when given; for a loop that keeps the outputs with ``keep_outputs``), cached."""
    weights = ModelWeights.read(target)
    dtype, device = weights.dtype, weights.device
    estimated_on = "cuda" if device.type == "cuda" else "cpu"
    peft_config = _peft_config(target)
    sharding = detected_sharding()  # FSDP / DeepSpeed set up by accelerate (the Trainer): per-device states
    key = (type(target), target.config.to_json_string(), shape, dtype, autocast, estimated_on, repr(peft_config),
           strategies, keep_outputs, tuple(sorted(sharding.items())))
    if key not in _estimates:
        meta = build_on_meta(type(target), target.config, dtype)
        made = estimate(meta, batch_size=shape[0], seq_len=shape[1], dtype=dtype, autocast=autocast,
                        device=estimated_on, peft_config=peft_config, strategies=strategies, keep_outputs=keep_outputs,
                        **sharding)
        while len(_estimates) >= _CACHE_SIZE:
            _estimates.pop(next(iter(_estimates)))
        _estimates[key] = made
    return _estimates[key], device


def plan_for(target: nn.Module, request: DeferredBudget, shape: tuple[int, int],
             autocast: torch.dtype | None) -> tuple[Any, str]:
    """The cheapest plan within ``request``'s budget for ``target`` at ``shape``, and where it was made for the log
    line (``"LlamaForCausalLM at batch 2 x seq 16 (float32 on cpu)"``)."""
    made, device = estimate_for(target, shape, _strategies(request), autocast, request.keep_outputs)
    budget: float | int = request.budget  # type: ignore[assignment]
    trained = f", {made.peft}" if made.peft else ""
    trained += "; outputs kept through backward" if made.keep_outputs else ""
    where = (f"{type(target).__name__} at batch {shape[0]} x seq {shape[1]} "
             f"({precision_label(made.dtype, made.autocast)} on {made.device}{trained})")
    if request.budget == _budget.AUTO:
        if request.auto_bytes is None:
            if made.shard == "none":  # the backward's peak beside the activations, the live optimizer's states
                states, named = _optimizer_states(request, made)
                backward = made.held_above_bytes[""] - made.parameters_bytes - made.optimizer_bytes
                still = states + backward
                details = (f"{named} states {format_bytes(states)}, gradients and transients at the backward's peak "
                           f"{format_bytes(backward)}")
            else:  # the engine's per-device states, what it allocates before the first batch left out
                transient = max(made.transient_bytes.values())
                still, details = still_allocated(made)
                still, details = still + transient, f"{details}, transients {format_bytes(transient)}"
            try:
                request.auto_bytes = _budget.auto_activation_bytes(device, still, details)
            except ValueError as error:
                raise ValueError(f"{error} (first training batch: {where})") from None
        budget = request.auto_bytes
    try:
        plan = plan_from_estimate(made, budget, transient_in_budget=request.auto_bytes is not None)
    except ValueError as error:
        raise ValueError(f"budget={_budget.describe(request.budget)}"
                         f"{'' if request.auto_bytes is None else f' ({format_bytes(request.auto_bytes)})'} "
                         f"for {where}: {error}") from None
    return plan, where


def _optimizer_states(request: DeferredBudget, made: Any) -> tuple[int, str]:
    """(bytes, name): the state the optimizer's first step allocates: the optimizer's own when it is known and
    registered (:mod:`hf_ckpt.meters.optimizer_states`), AdamW's as the estimator counts it otherwise."""
    optimizer = request.optimizer() if request.optimizer is not None else None
    if optimizer is None:
        return made.optimizer_bytes, "AdamW"
    name = type(unwrap(optimizer)).__name__
    pending = pending_state_bytes(optimizer)
    if pending is None:
        warn_once(f"budget='auto': hf_ckpt does not know what {name}'s first step allocates; it leaves room for "
                  "AdamW's states (two buffers the size of each trainable parameter). Register the optimizer with "
                  "hf_ckpt.register_optimizer_states, or give the budget in bytes.", key=f"auto-optimizer:{name}")
        return made.optimizer_bytes, f"AdamW (assumed for {name})"
    return pending, name
