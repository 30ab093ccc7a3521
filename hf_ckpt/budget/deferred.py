"""A budget without ``sample_inputs``: planned from the first real training batch's shapes, before its step.

``hf_ckpt.enable(model, budget=...)``, the mixin and the patched methods (so the stock ``Trainer`` and TRL, with
``gradient_checkpointing_kwargs={"budget": ...}``) come here when no sample batch is given:

1. **At the call** the budget and every other option are checked by the request
   (:class:`~hf_ckpt.runtime.request.EnableRequest`), the model here (its checkpointing flags, a token input); a call
   that raises changes nothing. The previous setting is taken back and a record
   (:class:`~hf_ckpt.runtime.state.CheckpointState`, its ``budget`` a :class:`DeferredBudget`) holds one forward
   pre-hook per ``PreTrainedModel`` level (PEFT calls the inner ``forward`` directly). Nothing is checkpointed yet;
   ``disable`` takes the record back like any other.
2. **At the first training forward** (training mode, grad enabled) the hook reads the batch size and sequence
   length from the forward's arguments (the model's ``main_input_name``, ``inputs_embeds``, decoder inputs and
   labels: the longest sequence), estimates the step with :func:`hf_ckpt.estimate.estimate` on meta and fake
   tensors (no real step, no allocation), under the autocast the forward runs in (:mod:`hf_ckpt.meters.precision`),
   solves the cheapest plan within the budget and applies it through
   the normal binding, before any block of this step runs; the first step's recompute probe measures it as it
   measures any setting. One INFO line on the ``hf_ckpt`` logger gives the budget, the shapes, the plan and its
   predicted activation memory; the plan is saved as JSON (:data:`PLAN_FILE`, the format ``enable(plan=path)``
   reads) in the Trainer's ``output_dir`` (told by :class:`hf_ckpt.integrations.trainer.BudgetPlanCallback`).
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
import logging
import os
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from hf_ckpt.budget import forms as _budget
from hf_ckpt.runtime.apply import apply_request, install
from hf_ckpt.runtime.binding import resolve
from hf_ckpt.runtime.compat import has_peft_adapters
from hf_ckpt.meters.optimizer_states import pending_state_bytes, unwrap
from hf_ckpt.meters.precision import autocast_dtype
from hf_ckpt.runtime.state import CheckpointState, Source, get_state, peek_state
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.units import format_bytes, precision_label
from hf_ckpt.runtime.warn import warn_once
from hf_ckpt.runtime.config import CheckpointConfig
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.estimate import estimate, plan_from_estimate
from hf_ckpt.estimate._engine import detected_sharding, still_allocated
from hf_ckpt.estimate._model import build_on_meta
from hf_ckpt.planning.planner import plan as make_plan
from hf_ckpt.strategies.selective.policy import selective_supported
from hf_ckpt.strategies import FULL, NONE, SELECTIVE, kind_class, strategy_class, summary_order

logger = logging.getLogger("hf_ckpt")

#: The plan's file name in the Trainer's ``output_dir``.
PLAN_FILE = "hf_ckpt_plan.json"
_GROUP = "budget"
_SEQUENCE_INPUTS = ("inputs_embeds", "decoder_input_ids", "decoder_inputs_embeds", "labels")
_ESTIMATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CACHE_SIZE = 16
_estimates: dict[tuple, Any] = {}
_last: "weakref.WeakKeyDictionary[nn.Module, DeferredBudget]" = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class DeferredBudget:
    """A budget planned at the first training batch, and what it planned (see the module docstring).

    Attributes:
        request: The enable call (:class:`~hf_ckpt.runtime.request.EnableRequest`): the budget, hf_ckpt's other
            options and the checkpoint keyword arguments, as parsed.
        budget: ``"auto"``, a fraction (float) or bytes (int): the request's.
        output_dir: Where the plan JSON is saved (the Trainer's ``output_dir``); None: not saved.
        shape: ``(batch, seq)`` the current plan was made for; None until the first batch.
        autocast: The autocast dtype the current plan was made for (mixed precision), or None.
        weights: The parameters' dtype and device, read at the first training forward and again when they moved
            (``model.to(...)``): the plan is then made again, and ``"auto"`` read from the new device.
        optimizer: A weak reference to the optimizer that will step the model (told by the ``Trainer``'s
            :class:`~hf_ckpt.integrations.trainer.BudgetPlanCallback`), whose first-step state ``"auto"`` leaves
            room for; None: AdamW's states are assumed.
        plan: The plan in effect; None until the first batch.
        auto_bytes: ``"auto"`` resolved to activation bytes at the first batch.
        plan_path: Where the plan was last saved.
        keep_outputs: Plan for a loop that keeps the model's outputs alive through backward
            (:func:`hf_ckpt.estimate.estimate`'s ``keep_outputs``); False: the ``Trainer``'s step.
    """

    request: EnableRequest
    budget: float | int | str
    output_dir: str | None = None
    shape: tuple[int, int] | None = None
    autocast: torch.dtype | None = None
    weights: "_Weights | None" = None
    optimizer: Any = None
    plan: Any = None
    auto_bytes: int | None = None
    plan_path: str | None = None
    keep_outputs: bool = False

    def same_request(self, other: "DeferredBudget") -> bool:
        """The same budget and the same configuration: options are compared as the configuration they make, so
        ``every_n_layers=1, offload=False`` (the ``Trainer``'s) and none at all (TRL's re-enable) are one request."""
        return (self.budget == other.budget and self.keep_outputs == other.keep_outputs
                and self.request.config == other.request.config)

    def use_optimizer(self, optimizer: Any) -> None:
        """Leave room for ``optimizer``'s first-step state in ``"auto"`` (the Trainer's callback tells it)."""
        if optimizer is not None:
            self.optimizer = weakref.ref(optimizer)

    def save_in(self, output_dir: str | os.PathLike | None) -> None:
        """Save the plan in ``output_dir`` (now, if it is made already, and at every re-plan)."""
        self.output_dir = os.fspath(output_dir) if output_dir is not None else None
        save_plan(self)

    def config(self, plan: Any = None) -> CheckpointConfig:
        """The request's config with ``plan``; without one, the request's config."""
        return self.request.config if plan is None else self.request.config_with(plan=plan)


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
    plan, summary = _make_plan(target, request, wanted, autocast)
    request.shape, request.autocast = wanted, autocast
    new_state = _apply(model, target, request, plan)
    _log(request, summary, reason)
    return _run_new_pre_hooks(new_state, module, args, kwargs)


def _weights_moved(request: DeferredBudget, target: nn.Module) -> str:
    """Read the weights' dtype and device at the first forward, and again when they moved (``model.to(...)``) since;
    what changed (``"float32 on cpu, now bfloat16 on cuda:0"``), or ``""``."""
    if request.weights is not None and not request.weights.moved():
        return ""  # one parameter looked at: every forward of every level comes here
    before, request.weights = request.weights, _Weights.read(target)
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


# -- the plan --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Weights:
    """The dtype most of a model's floating-point parameters have (one the estimator models, float32 otherwise) and
    their device, with one parameter to notice a move by."""

    dtype: torch.dtype
    device: torch.device
    probe: Any = None  # a weak reference to the first floating-point parameter
    seen: tuple = ()  # its dtype and device when read

    @classmethod
    def read(cls, target: nn.Module) -> "_Weights":
        sizes: Counter = Counter()
        first = None
        for parameter in target.parameters():
            if parameter.is_floating_point():
                sizes[parameter.dtype] += parameter.numel()
                first = first if first is not None else parameter
        dtype = sizes.most_common(1)[0][0] if sizes else torch.float32
        return cls(dtype if dtype in _ESTIMATE_DTYPES else torch.float32,
                   first.device if first is not None else torch.device("cpu"),
                   weakref.ref(first) if first is not None else None,
                   (first.dtype, first.device) if first is not None else ())

    def moved(self) -> bool:
        """Whether the parameter looked at changed dtype or device, or is gone (replaced): then read again."""
        if self.probe is None:
            return False
        first = self.probe()
        return first is None or (first.dtype, first.device) != self.seen

    def describe(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')} on {self.device}"


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
    """The estimator's :class:`~hf_ckpt.estimate.MemoryEstimate` for ``target`` at ``shape`` (under autocast to
    ``autocast`` when given; for a loop that keeps the outputs with ``keep_outputs``), cached."""
    weights = _Weights.read(target)
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


def _make_plan(target: nn.Module, request: DeferredBudget, shape: tuple[int, int],
               autocast: torch.dtype | None) -> tuple[Any, str]:
    made, device = estimate_for(target, shape, _strategies(request), autocast, request.keep_outputs)
    budget: float | int = request.budget  # type: ignore[assignment]
    trained = f", {made.peft}" if made.peft else ""
    trained += "; outputs kept through backward" if made.keep_outputs else ""
    where = (f"{type(target).__name__} at batch {shape[0]} x seq {shape[1]} "
             f"({precision_label(made.dtype, made.autocast)} on {made.device}{trained})")
    if request.budget == _budget.AUTO:
        if request.auto_bytes is None:
            transient = max(made.transient_bytes.values())
            if made.shard == "none":
                states, named = _optimizer_states(request, made)
                still = made.gradients_bytes + states + transient
                details = (f"gradients {format_bytes(made.gradients_bytes)}, {named} states {format_bytes(states)}, "
                           f"transients {format_bytes(transient)}")
            else:  # the engine's per-device states, what it allocates before the first batch left out
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


def set_optimizer(model: nn.Module, optimizer: Any) -> None:
    """Plan ``model``'s ``"auto"`` budget for ``optimizer``'s state; no-op without a budget or an optimizer."""
    request = _request_of(model)
    if request is not None:
        request.use_optimizer(optimizer)


def _request_of(model: nn.Module) -> "DeferredBudget | None":
    try:
        target = target_model(model)
    except TypeError:
        return None
    request = getattr(get_state(target), "budget", None)
    return request if isinstance(request, DeferredBudget) else None


def _summary(plan: Any) -> str:
    counts = Counter(plan.strategies)
    return ", ".join(f"{counts[s]} {s}" for s in summary_order(plan.strategies))


def _log(request: DeferredBudget, where: str, replanned: str) -> None:
    plan = request.plan
    saved = save_plan(request)
    budget = _budget.describe(request.budget)
    if request.auto_bytes is not None:
        budget += f" ({format_bytes(request.auto_bytes)} for activations)"
    logger.info(
        "%sbudget %s for %s: plan %s; predicted activation memory %s of %s without checkpointing%s",
        replanned,
        budget, where, _summary(plan), format_bytes(plan.predicted_bytes), format_bytes(plan.baseline_bytes),
        f"; saved to {saved}" if saved else "",
    )


def save_plan(request: DeferredBudget) -> str | None:
    """Write the plan in effect to ``output_dir``/:data:`PLAN_FILE`; its path, or None when there is no
    plan or no ``output_dir``."""
    if request.plan is None or not request.output_dir:
        return None
    os.makedirs(request.output_dir, exist_ok=True)
    path = os.path.join(request.output_dir, PLAN_FILE)
    request.plan.save(path)
    request.plan_path = path
    return path


def set_output_dir(model: nn.Module, output_dir: str | os.PathLike | None) -> None:
    """Save ``model``'s budget plan in ``output_dir`` (now, if it is made already); no-op without a budget."""
    request = _request_of(model)
    if request is not None:
        request.save_in(output_dir)
