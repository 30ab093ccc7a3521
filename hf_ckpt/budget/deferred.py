"""A budget without ``sample_inputs``: planned from the first real training batch's shapes, before its step.

``hf_ckpt.enable(model, budget=...)``, the mixin and the patched methods (so the stock ``Trainer`` and TRL, with
``gradient_checkpointing_kwargs={"budget": ...}``) come here when no sample batch is given:

1. **At the call** the budget and every other option are checked by the request
   (:class:`~hf_ckpt.runtime.request.EnableRequest`), the model here (its checkpointing flags, a token input); a call
   that raises changes nothing. The previous setting is taken back and a record
   (:class:`~hf_ckpt.runtime.state.CheckpointState`, its ``budget`` a :class:`~hf_ckpt.budget.record.DeferredBudget`)
   holds one forward
   pre-hook per ``PreTrainedModel`` level (PEFT calls the inner ``forward`` directly). Nothing is checkpointed yet;
   ``disable`` takes the record back like any other.
2. **At the first training forward** (training mode, grad enabled) the hook reads the batch size and sequence
   length from the forward's arguments (the model's ``main_input_name``, ``inputs_embeds``, decoder inputs and
   labels: the longest sequence), estimates the step (:mod:`hf_ckpt.budget.from_estimate`) on meta and fake
   tensors (no real step, no allocation), under the autocast the forward runs in (:mod:`hf_ckpt.meters.precision`),
   solves the cheapest plan within the budget and applies it through the normal binding, before any block of this
   step runs; the first step's recompute probe measures it as it measures any setting. One INFO line on the
   ``hf_ckpt`` logger gives the budget, the shapes, the plan and its predicted activation memory; the plan is saved
   as JSON (:data:`~hf_ckpt.budget.record.PLAN_FILE`, the format ``enable(plan=path)`` reads) in the Trainer's
   ``output_dir`` (told by :class:`hf_ckpt.integrations.trainer.BudgetPlanCallback`).
   Where no plan fits, the error names the budget and the smallest activation memory reachable.
3. **Autocast found further in.** accelerate wraps the outer model's ``forward`` in autocast, after the outer
   level's pre-hook: an inner level that finds autocast on, which the plan was made without, plans again for the
   same shapes, before any block runs. A plan made under autocast is kept when an outer level runs without it.
4. **A later batch larger** in batch size or sequence length than any planned for **re-plans** for the largest
   of each seen so far (a plan for larger shapes fits smaller ones; keeping a plan made for smaller shapes would
   exceed a byte budget), logged the same way, the JSON rewritten. Smaller batches keep the plan. Estimates are
   cached per shape, so a re-plan for shapes seen before costs no trace.

Enabling again on the same model with the same budget and options re-applies the plan made for it at once (TRL's
DPO trainer disables and re-enables checkpointing within every step).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Mapping

import torch
from torch import nn

from hf_ckpt.budget.from_estimate import ModelWeights, plan_for
from hf_ckpt.budget.record import DeferredBudget, log_plan
from hf_ckpt.runtime.apply import apply_request, install
from hf_ckpt.runtime.binding import resolve
from hf_ckpt.meters.precision import autocast_dtype
from hf_ckpt.runtime.state import CheckpointState, Source, peek_state
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.config import CheckpointConfig
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.planning.planner import plan as make_plan
from hf_ckpt.strategies import kind_class

_GROUP = "budget"
_SEQUENCE_INPUTS = ("inputs_embeds", "decoder_input_ids", "decoder_inputs_embeds", "labels")
_last: "weakref.WeakKeyDictionary[nn.Module, DeferredBudget]" = weakref.WeakKeyDictionary()


def _check_model(target: nn.Module, config: CheckpointConfig) -> None:
    resolve(target, config)  # a model that cannot be checkpointed fails here, as enable would
    main = getattr(target, "main_input_name", "input_ids")
    if main != "input_ids":
        raise ValueError(
            f"budget without sample_inputs plans from token shapes, and {type(target).__name__} reads {main!r}: "
            "make a plan with hf_ckpt.plan(model, batch, budget) on a sample batch and pass plan= (or, with "
            "hf_ckpt.enable, give sample_inputs=)"
        )


def enable_within(model: nn.Module, request: EnableRequest) -> nn.Module:
    """The cheapest plan within the request's budget, applied: profiled now on its ``sample_inputs``, or (without)
    planned at the first training batch (:func:`defer`). ``hf_ckpt.enable``, the mixin and the patch come here with
    a budget."""
    if request.sample_inputs is None:
        return defer(model, request)
    policy = request.options.get("policy")
    made = make_plan(model, request.sample_inputs, request.budget, policy=policy, **dict(request.kwargs_dict or {}))
    takes_policy = any(kind_class(s).takes_policy for s in made.strategies)
    return apply_request(model, request, plan=made, policy=policy if takes_policy else None)


def defer(model: nn.Module, request: EnableRequest) -> nn.Module:
    """Check the model, then leave it with a record that plans the request's budget at the first training batch."""
    target = target_model(model)
    _check_model(target, request.config)
    deferred = DeferredBudget(request, request.budget, keep_outputs=request.keep_outputs)
    previous = _last.get(target)
    if previous is not None and previous.same_request(deferred):
        deferred = previous  # the plan made for this model and budget (TRL re-enables within every step)
    elif previous is not None:  # the same training run, enabled with other options: what it found still holds
        deferred.output_dir, deferred.autocast = previous.output_dir, previous.autocast
        deferred.optimizer = previous.optimizer
    _last[target] = deferred
    if deferred.plan is not None:
        _apply(model, target, deferred, deferred.plan)
        return model
    # nothing bound yet; the chunked head goes on where it may: the wrapper the first forward already runs reads
    # the chunk of the plan made in that forward
    state = install(model, request.config, source=Source.BUDGET, budget=deferred, pending=True)
    _watch(state, model, target, deferred)
    return model


def _watch(state: CheckpointState, model: nn.Module, target: nn.Module, request: DeferredBudget) -> None:
    from transformers import PreTrainedModel

    levels = {id(model): model}
    for module in target.modules():
        if isinstance(module, PreTrainedModel):
            levels.setdefault(id(module), module)
    hook = functools.partial(_on_forward, request, model)
    for module in levels.values():
        state.hooks.add(module, "register_forward_pre_hook", hook, group=_GROUP, with_kwargs=True)


def _tensor(value: Any) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) and value.dim() >= 1 else None


def batch_shape(module: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(batch, seq)`` of a forward's inputs: the batch of the main input (or ``inputs_embeds``), the longest
    sequence among the main input, ``inputs_embeds``, decoder inputs and labels; None when there is no token input."""
    main = getattr(module, "main_input_name", "input_ids")
    first = _tensor(kwargs.get(main))
    if first is None and args:
        first = _tensor(args[0])
    if first is None:
        first = _tensor(kwargs.get("inputs_embeds"))
    if first is None or first.dim() < 2:
        return None
    lengths = [first.shape[1]]
    lengths += [t.shape[1] for t in map(_tensor, (kwargs.get(k) for k in _SEQUENCE_INPUTS)) if t is not None and t.dim() >= 2]
    return int(first.shape[0]), int(max(lengths))


def _on_forward(request: DeferredBudget, model: nn.Module, module: nn.Module, args: tuple, kwargs: dict) -> Any:
    if not (module.training and torch.is_grad_enabled()):
        return None
    shape = batch_shape(module, args, kwargs)
    if shape is None:
        return None
    target = target_model(model)
    state = peek_state(target)  # in a forward: a stale record is never dropped there
    if state is None or not state.is_current() or state.budget is not request:
        return None
    planned = request.shape
    moved = _weights_moved(request, target)
    # an outer level runs before the autocast that wraps an inner forward: a plan never goes back to no autocast
    autocast = autocast_dtype(request.weights.device, request.weights.dtype) or request.autocast
    reason = _why_plan(request, shape, autocast, moved, module)
    if reason is None:
        return None
    if moved:
        request.auto_bytes = None  # "auto" is read again from the memory of the device the weights are on now
    wanted = shape if planned is None else (max(shape[0], planned[0]), max(shape[1], planned[1]))
    plan, summary = plan_for(target, request, wanted, autocast)
    request.shape, request.autocast = wanted, autocast
    new_state = _apply(model, target, request, plan)
    log_plan(request, summary, reason)
    return _run_new_pre_hooks(new_state, module, args, kwargs)


def _weights_moved(request: DeferredBudget, target: nn.Module) -> str:
    """Read the weights' dtype and device at the first forward, and again when they moved (``model.to(...)``) since;
    what changed (``"float32 on cpu, now bfloat16 on cuda:0"``), or ``""``."""
    if request.weights is not None and not request.weights.moved():
        return ""  # one parameter looked at: every forward of every level comes here
    before, request.weights = request.weights, ModelWeights.read(target)
    if before is None or (before.dtype, before.device) == (request.weights.dtype, request.weights.device):
        return ""
    return f"{before.describe()}, now {request.weights.describe()}"


def _why_plan(request: DeferredBudget, shape: tuple[int, int], autocast: torch.dtype | None, moved: str,
              module: nn.Module) -> str | None:
    """Why a plan is made in this forward (``""``: the first), or None when the plan in effect holds: the weights
    moved, a larger batch, or autocast on where the plan was made without it (the forward of ``module``, inside
    the one planned at: accelerate wraps the outer ``forward`` in autocast)."""
    planned = request.shape
    if planned is None:
        return ""
    if moved:
        return f"re-planned (the weights are {moved}) "
    if shape[0] > planned[0] or shape[1] > planned[1]:
        return f"re-planned (batch {planned[0]} x seq {planned[1]} was planned before) "
    if autocast != request.autocast:
        return f"re-planned ({str(autocast).removeprefix('torch.')} autocast is on in {type(module).__name__}'s forward) "
    return None


def _run_new_pre_hooks(state: CheckpointState, module: nn.Module, args: tuple, kwargs: dict) -> tuple:
    """The pre-hooks the plan put on ``module`` were not there when this call began: run them for it."""
    for function, options in state.hooks.registered(module, "register_forward_pre_hook"):
        if isinstance(function, functools.partial) and function.func is _on_forward:
            continue
        if options.get("with_kwargs"):
            result = function(module, args, kwargs)
            if result is not None:
                args, kwargs = result
        else:
            result = function(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    return args, kwargs


def _apply(model: nn.Module, target: nn.Module, request: DeferredBudget, plan: Any) -> CheckpointState:
    state = install(model, request.config(plan), source=Source.BUDGET, budget=request)
    request.plan = plan
    _watch(state, model, target, request)
    return state
