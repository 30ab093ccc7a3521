"""Applying one :class:`~hf_ckpt.CheckpointConfig` to a model, reading it back, and taking it back: the runtime's
one way in, which every entry point (``hf_ckpt.enable``, the mixin, the patch, the planner's profiling, a budget
planned at the first batch) ends in.

:func:`apply_config` resolves the config on the model first (everything that can fail fails there, before any
change), restores a previous hf_ckpt setting, binds, adds the hooks and records it all in the one
:class:`~hf_ckpt.runtime.state.CheckpointState`; :func:`remove` puts back exactly what that record says the model had;
:func:`checkpointed_layers` reads back which blocks are recomputed.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from hf_ckpt.runtime import hooks as _hooks
from hf_ckpt.runtime.binding import bind, is_block_checkpointed, resolve, run_model_logic, uses_legacy_signature
from hf_ckpt.runtime.stack_code import never_calls_bound_function
from hf_ckpt.runtime.state import CheckpointState, get_state, set_state, take_back
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.warn import warn_once
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.config import CheckpointConfig
from hf_ckpt.distributed._engines import wrapped_blocks
from hf_ckpt.distributed.checks import new_hook as new_guard_hook
from hf_ckpt.integrations.deepspeed import warn_ignored_config


def _warn_legacy(target: nn.Module) -> None:
    warn_once(
        f"{type(target).__name__} defines _set_gradient_checkpointing(module, value), a signature transformers "
        "deprecated in 4.35. hf_ckpt calls it the old way so the model's own logic runs, then binds the "
        "checkpoint function itself so your settings still apply. Remove that method from the modeling file "
        "to silence this warning.",
        key="legacy-signature",
        owner=target,
    )


def apply_options(model: nn.Module, kwargs_dict: Mapping[str, Any] | None = None,
                  dict_name: str = "checkpoint_kwargs", **options: Any) -> nn.Module:
    """:func:`apply_config` of the config these options make (:meth:`~hf_ckpt.CheckpointConfig.from_arguments`)."""
    return apply_config(model, CheckpointConfig.from_arguments(kwargs_dict, dict_name=dict_name, **options))


def apply_config(model: nn.Module, config: CheckpointConfig) -> nn.Module:
    """Enable checkpointing on ``model`` as ``config`` says. The shared implementation of every entry point."""
    target = target_model(model)
    binding = resolve(target, config)  # everything that can fail on this model fails here, before any change
    if config.head_chunk_size is not None:  # deferred: the chunked head loads only when head_chunk_size is set
        from hf_ckpt.runtime import head as _head
        refused = _head.refusal(target)
        if refused:
            raise ValueError(f"head_chunk_size cannot apply to {type(target).__name__}: {refused}. Drop head_chunk_size.")
    names = config.plan.outside_blocks if config.plan is not None else ()
    hooked = names or any(s.saved_tensor_hook for s in config.strategies())
    if hooked:  # deferred: only plans with outside_blocks or partitions load the saved-tensor hook's runtime
        from hf_ckpt.strategies.outside import hook as _outside
    outside = _outside.resolve_outside(target, names, binding.blocks) if hooked else []
    if binding.legacy:
        _warn_legacy(target)
    warn_ignored_config(model, config.checkpoint_fn, owner=target)  # a DeepSpeed "activation_checkpointing" block
    before = take_back(target)
    try:
        bound = bind(target, binding)
    except BaseException:
        before.restore()
        raise
    state = CheckpointState(config=config, before=before, bound=bound)
    _hooks.add_checkpointing_hooks(state, target, binding, needs_input_grads=target is not model)
    if any(not block.layer_flag and never_calls_bound_function(type(block.owner)) for block in binding.blocks):
        from hf_ckpt.runtime import direct as _direct  # deferred: only a stack that never calls its bound function has blocks to wrap
        _direct.install(state, binding.blocks)  # blocks a stack calls directly: checkpointed by wrapping them
    if config.head_chunk_size is not None:
        _head.install(state, target)
    if hooked:  # one saved-tensor hook for both: recomputed modules, remade block outputs
        _outside.install(state, [model, target], outside)
    guard = new_guard_hook(target)  # one checkpoint per block under any engine; the DDP trap
    if guard is not None:  # one of the record's hooks: removed and put back with them
        state.hooks.add(target, "register_forward_pre_hook", guard, group="guard")
    set_state(target, state)
    return model


def remove(model: nn.Module) -> nn.Module:
    """Disable checkpointing on ``model``: hf_ckpt's setting is taken back to what the model had before it; a
    model hf_ckpt never set up (or whose setting was replaced behind its back) is switched off, as upstream's
    ``gradient_checkpointing_disable`` does."""
    target = target_model(model)
    if get_state(target) is not None:
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
    wrapped = set(wrapped_blocks(target))  # hf_ckpt.distributed.apply, or anyone's checkpoint_wrapper
    return [block.index for block in find_blocks(target) if block.index in wrapped or is_block_checkpointed(block)]
