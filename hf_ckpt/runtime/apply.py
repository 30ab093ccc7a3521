"""Applying one :class:`~hf_ckpt.CheckpointConfig` to a model, reading it back, and taking it back.

:func:`install` is the one function that makes the :class:`~hf_ckpt.runtime.state.CheckpointState` and installs its
hooks, for every entry point (``hf_ckpt.enable``, the mixin, the patch, the planner's profiling, a budget pending or
planned, ``hf_ckpt.distributed.apply``), so that none can leave a hook out; :func:`remove` puts back exactly what
that record says the model had; :func:`checkpointed_layers` reads back which blocks are recomputed.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from hf_ckpt.runtime import hooks as _hooks
from hf_ckpt.runtime.binding import (
    Binding, bind, is_block_checkpointed, resolve, run_model_logic, uses_legacy_signature,
)
from hf_ckpt.runtime.stacks.stack_code import never_calls_bound_function
from hf_ckpt.runtime.state import CheckpointState, PlannedBudget, Source, get_state, set_state, take_back
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.config import CheckpointConfig
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.runtime import extensions


def _warn_legacy(target: nn.Module) -> None:
    warn_once(
        f"{type(target).__name__} defines _set_gradient_checkpointing(module, value), a signature transformers "
        "deprecated in 4.35. hf_ckpt calls it the old way so the model's own logic runs, then binds the "
        "checkpoint function itself so your settings still apply. Remove that method from the modeling file "
        "to silence this warning.",
        key="legacy-signature",
        owner=target,
    )


def apply_request(model: nn.Module, request: EnableRequest, **changes: Any) -> nn.Module:
    """Enable checkpointing on ``model`` as the parsed ``request`` says, with ``changes`` to its options (a budget's
    plan): :func:`install` with the flags. The one door of every caller, the lab's included; a request's budget is
    planned by the lab first (:mod:`hf_ckpt.budget.deferred`), which comes back here with the plan."""
    install(model, request.config_with(**changes) if changes else request.config)
    return model


#: ``wrappers(target, binding) -> (bound, undo)``: bind a setting through checkpoint wrappers instead of flags.
Wrappers = Callable[[nn.Module, Binding], "tuple[list[tuple[nn.Module, str, Any]], list[Callable[[], None]]]"]


def install(model: nn.Module, config: CheckpointConfig, *, source: Source = Source.ENABLE,
            wrappers: Wrappers | None = None, budget: PlannedBudget | None = None,
            pending: bool = False) -> CheckpointState:
    """Put ``config`` on ``model``: the one function that makes a :class:`~hf_ckpt.runtime.state.CheckpointState`
    and installs its hooks, whichever entry point asked (``enable``, the mixin, the patch, a budget,
    ``hf_ckpt.distributed.apply``).

    The config is resolved on the model first (everything that can fail fails before any change); the previous
    setting is taken back; the blocks are bound (with the flags, or with ``wrappers``: blocks wrapped by
    :func:`hf_ckpt.distributed.apply`, which keeps its guard on the model after the setting goes); then the hooks
    go on: input grads, ``use_cache``, ``no_grad``, the probe, directly called blocks, the chunked head, the
    saved-tensor hook of ``outside_blocks`` and partitioned blocks, the guard. ``pending``: a ``budget`` waiting
    for its first batch: nothing is bound and only the chunked head goes on (where the model allows it and the
    budget does not keep the outputs), which the plan made then may use. Returns the record, set on the model.
    """
    target = target_model(model)
    binding = None if pending else resolve(target, config)  # everything that can fail on this model fails here
    head = _head_runtime(target, config, budget, pending)
    mlp = _mlp_runtime(target, config)
    outside = None if binding is None else _outside_modules(target, config, binding)
    if binding is not None and binding.legacy and wrappers is None:
        _warn_legacy(target)
    if binding is not None:
        extensions.check_config(model, config, target)  # e.g. a DeepSpeed "activation_checkpointing" block
    before = take_back(target)
    try:
        bound, undo = ([], []) if binding is None else (wrappers or _bind_flags)(target, binding)
    except BaseException:
        before.restore()
        raise
    state = CheckpointState(config=config, before=before, bound=bound, source=source, budget=budget)
    state.undo.extend(undo)
    if binding is not None:
        _hooks.add_checkpointing_hooks(state, target, binding, needs_input_grads=target is not model)
        if wrappers is None:
            _install_direct(state, binding)
    if head is not None:
        head.install(state, target)
    if mlp is not None:
        mlp.install(state, target)
    if outside is not None:  # one saved-tensor hook for both: recomputed modules, remade block outputs
        outside[0].install(state, [model, target], outside[1])
    guards = extensions.guard_hooks(target) if binding is not None and wrappers is None else []
    for guard in guards:  # one of the record's hooks: removed and put back with them (apply's outlives it)
        state.hooks.add(target, "register_forward_pre_hook", guard, group="guard")
    _hooks.add_stale_check(state, target)  # the last of its pre-hooks
    set_state(target, state)
    return state


def _bind_flags(target: nn.Module, binding: Binding) -> tuple[list[tuple[nn.Module, str, Any]], list[Callable[[], None]]]:
    return bind(target, binding), []


def _head_runtime(target: nn.Module, config: CheckpointConfig, budget: PlannedBudget | None, pending: bool) -> Any:
    """The chunked head's module when the head goes on, else None: ``head_chunk_size`` given (refused, with an
    error, where the model's forward does not allow it), or a pending budget whose plan may chunk it (where the
    model allows it and the budget does not keep the outputs)."""
    wanted = (budget is not None and not budget.keep_outputs) if pending else config.head_chunk_size is not None
    if not wanted:
        return None
    from hf_ckpt.runtime import head as _head  # deferred: the chunked head loads only when it may run

    refused = _head.refusal(target)
    if refused and not pending:
        raise ValueError(f"head_chunk_size cannot apply to {type(target).__name__}: {refused}. Drop head_chunk_size.")
    return None if refused else _head


def _mlp_runtime(target: nn.Module, config: CheckpointConfig) -> Any:
    """The chunked MLP's module when ``mlp_chunk_size`` is given, else None; refused, with an error naming the
    reason, where a block has no position-wise MLP child."""
    if config.mlp_chunk_size is None:
        return None
    from hf_ckpt.runtime import mlp_chunks as _mlp  # deferred: the chunked MLP loads only when it may run

    refused = _mlp.refusal(target)
    if refused:
        raise ValueError(f"mlp_chunk_size cannot apply to {type(target).__name__}: {refused}. Drop mlp_chunk_size.")
    return _mlp


def _outside_modules(target: nn.Module, config: CheckpointConfig, binding: Binding) -> tuple[Any, list] | None:
    """(the saved-tensor hook's module, the modules it recomputes), or None when the config needs no hook."""
    names = config.plan.outside_blocks if config.plan is not None else ()
    if not (names or any(s.saved_tensor_hook for s in config.strategies())):
        return None
    hook = extensions.saved_tensor_hook()  # loaded only for plans with outside_blocks or partitions
    return hook, hook.resolve_outside(target, names, binding.blocks)


def _install_direct(state: CheckpointState, binding: Binding) -> None:
    """Blocks a stack calls directly (it never calls its bound function): checkpointed by wrapping them."""
    if any(not block.layer_flag and never_calls_bound_function(type(block.owner)) for block in binding.blocks):
        from hf_ckpt.runtime.stacks import direct as _direct  # deferred: only such a stack has blocks to wrap

        _direct.install(state, binding.blocks)


def remove(model: nn.Module) -> nn.Module:
    """Disable checkpointing on ``model``: hf_ckpt's setting is taken back to what the model had before it; a
    model hf_ckpt never set up (or whose setting was replaced behind its back) is switched off, as upstream's
    ``gradient_checkpointing_disable`` does."""
    target = target_model(model)
    if get_state(target, warn=False) is not None:  # removed anyway: a stale record goes without a warning
        take_back(target)
        return model
    if uses_legacy_signature(target):
        run_model_logic(target, False, None)
    for module in target.modules():
        if getattr(module, "gradient_checkpointing", False):
            module.gradient_checkpointing = False
    return model


def checkpointed_layers(model: nn.Module) -> list[int]:
    """Indices of the blocks recomputed in backward, in global order: measured once a training step ran, else what
    the flags and checkpoint wrappers say (see :func:`hf_ckpt.checkpointed_layers`)."""
    target = target_model(model)
    state = get_state(target)
    if state is not None and state.measured is not None:
        return list(state.measured)
    wrapped = extensions.wrapped_blocks(target)  # hf_ckpt.distributed.apply, or anyone's checkpoint_wrapper
    return [block.index for block in find_blocks(target) if block.index in wrapped or is_block_checkpointed(block)]
