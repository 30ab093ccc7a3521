"""``enable`` / ``disable``: activation checkpointing on any loaded model, without subclassing.

This module holds the one implementation every entry point shares: :func:`hf_ckpt.enable`, the
:class:`~hf_ckpt.GradientCheckpointingMixin` methods and the methods :func:`hf_ckpt.patch_transformers` puts on
``PreTrainedModel``.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from torch import nn
from torch.utils.hooks import RemovableHandle

from . import _hooks
from ._compat import current_accelerator, has_peft_adapters, is_gradient_checkpointing_layer, peft_model_base
from ._warnings import warn_once
from .blocks import SELECTED_ATTRIBUTE, Block, find_blocks, is_block_checkpointed
from .config import CheckpointConfig

if TYPE_CHECKING:
    from .plans import CheckpointPlan
from .offload import OverlappedOffload
from .functions import build_block_functions, build_checkpoint_function, with_block_selection

#: The instance attributes hf_ckpt may set on a model's modules; ``disable`` restores each one.
_TRACKED_ATTRIBUTES = ("gradient_checkpointing", "_gradient_checkpointing_func", SELECTED_ATTRIBUTE)
_STATE_ATTRIBUTE = "_hf_ckpt_state"


@dataclass
class _EnabledState:
    """What ``enable`` changed on a model, so that ``disable`` can undo exactly that."""

    config: CheckpointConfig
    selected: list[int]
    saved_attributes: list[tuple[nn.Module, str, bool, Any]]
    hooks: list[RemovableHandle] = field(default_factory=list)
    uncontrolled: list[int] = field(default_factory=list)
    inert: list[int] = field(default_factory=list)


def _target_model(model: nn.Module) -> nn.Module:
    """The ``PreTrainedModel`` to act on: ``model`` itself, the model a PEFT ``PeftModel`` wraps, or the model
    inside ``DistributedDataParallel`` / FSDP1's ``FullyShardedDataParallel`` (either of those)."""
    from transformers import PreTrainedModel

    from .distributed._engines import unwrap_engine

    model = unwrap_engine(model)
    base = peft_model_base(model)
    target = base if base is not None else model
    if not isinstance(target, PreTrainedModel):
        raise TypeError(
            "hf_ckpt expects a transformers PreTrainedModel, or a PEFT PeftModel wrapping one; "
            f"got {type(model).__name__}"
        )
    return target


def _uses_legacy_signature(model: nn.Module) -> bool:
    """Remote-code models written before transformers 4.35 define ``_set_gradient_checkpointing(module, value)``."""
    return "value" in inspect.signature(model._set_gradient_checkpointing).parameters


def _overrides_set_gradient_checkpointing(model: nn.Module) -> bool:
    from transformers import PreTrainedModel

    return type(model)._set_gradient_checkpointing is not PreTrainedModel._set_gradient_checkpointing


def _snapshot(model: nn.Module) -> list[tuple[nn.Module, str, bool, Any]]:
    saved = []
    for module in model.modules():
        for name in _TRACKED_ATTRIBUTES:
            existed = name in module.__dict__
            saved.append((module, name, existed, module.__dict__.get(name)))
    return saved


def _restore(saved: list[tuple[nn.Module, str, bool, Any]]) -> None:
    for module, name, existed, value in saved:
        if existed:
            setattr(module, name, value)
        elif name in module.__dict__:
            delattr(module, name)


def _own_source(stack: nn.Module) -> str | None:
    """The source of every class of the stack's own hierarchy (a loop may delegate to a helper method), or None
    when none can be read."""
    sources = []
    for cls in type(stack).__mro__:
        if cls.__module__.startswith(("torch.", "builtins")) or cls.__module__ == "transformers.modeling_utils":
            continue
        try:
            sources.append(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
    return "\n".join(sources) if sources else None


def _calls_bound_function(source: str | None) -> bool:
    """Whether a stack's code calls ``self._gradient_checkpointing_func`` (given the benefit of the doubt when
    its source cannot be read)."""
    return source is None or "_gradient_checkpointing_func" in source


def _checkpoints_at_all(source: str | None) -> bool:
    """Whether a stack's code calls a ``checkpoint(...)`` function of its own (``torch.utils.checkpoint``)."""
    return source is None or re.search(r"\bcheckpoint\s*\(", source) is not None


def _describe(config: CheckpointConfig) -> str:
    parts = [f"every_n_layers={config.every_n_layers}"]
    for name in ("layers", "num_layers", "method", "policy"):
        value = getattr(config, name)
        if value is not None:
            parts.append(f"{name}={list(value) if name == 'layers' else value!r}")
    if config.strategy != "full":
        parts.append(f"strategy={config.strategy!r}")
    if config.plan is not None:
        parts.append("plan=<CheckpointPlan>")
    if config.offload:
        parts.append("offload=True")
    parts.extend(f"{key}={value!r}" for key, value in sorted(config.checkpoint_kwargs.items()))
    return ", ".join(parts)


def _run_model_logic(model: nn.Module, enable: bool, checkpoint_function: Any, config: CheckpointConfig) -> None:
    """Let a model that customises ``_set_gradient_checkpointing`` run its own logic, in either signature."""
    if _uses_legacy_signature(model):
        model.apply(functools.partial(model._set_gradient_checkpointing, value=enable))
    elif enable and _overrides_set_gradient_checkpointing(model):
        options: dict[str, Any] = {"enable": True, "gradient_checkpointing_func": checkpoint_function}
        if "every_n_layers" in inspect.signature(model._set_gradient_checkpointing).parameters:
            options["every_n_layers"] = config.every_n_layers
        model._set_gradient_checkpointing(**options)


def _bind(
    model: nn.Module, blocks: list[Block], functions: dict[int, Any], default_function: Any, legacy: bool
) -> bool:
    """Bind checkpoint functions to every module with a ``gradient_checkpointing`` flag; False if none has one.

    ``functions`` maps the index of each block to checkpoint to its function; other blocks run directly.
    """
    block_of = {id(block.module): block for block in blocks}
    enclosing = {id(m): block for block in blocks for m in block.module.modules() if m is not block.module}
    stack_function = with_block_selection(default_function)
    found = False
    for module in model.modules():
        if not hasattr(module, "gradient_checkpointing"):
            continue
        found = True
        if legacy and not module.gradient_checkpointing:
            continue  # the model's own `_set_gradient_checkpointing` left this module off
        block = block_of.get(id(module))
        if block is not None:
            module._gradient_checkpointing_func = functions.get(block.index, default_function)
            module.gradient_checkpointing = block.index in functions
        elif id(module) in enclosing:
            # A flag inside a block says "my block is checkpointed" (T5Attention reads it to make its position bias
            # require grad). A nested checkpointing layer stays off: never checkpoint inside a checkpoint.
            index = enclosing[id(module)].index
            module._gradient_checkpointing_func = functions.get(index, default_function)
            module.gradient_checkpointing = index in functions and not is_gradient_checkpointing_layer(module)
        else:
            module._gradient_checkpointing_func = stack_function
            module.gradient_checkpointing = True
    for block in blocks:
        if not block.layer_flag:
            setattr(block.module, SELECTED_ATTRIBUTE, functions.get(block.index, False))
    return found


def _warn_uncontrolled(model: nn.Module, blocks: list[Block], config: CheckpointConfig) -> tuple[list[int], list[int]]:
    """Stacks whose code ignores hf_ckpt's function: say so, once. Returns (uncontrolled, inert) block indices.

    *Uncontrolled* stacks call ``torch.utils.checkpoint`` themselves: all their blocks are recomputed, with the
    model's own arguments. *Inert* stacks never checkpoint at all (an upstream bug in a few releases): none of
    their blocks is recomputed, whatever the flags say.
    """
    uncontrolled, inert = [], []
    for stack in {id(b.owner): b.owner for b in blocks if not b.layer_flag}.values():
        if not getattr(stack, "gradient_checkpointing", False):
            continue
        source = _own_source(stack)
        if _calls_bound_function(source):
            continue
        indices = [b.index for b in blocks if b.owner is stack]
        if not _checkpoints_at_all(source):
            inert.extend(indices)
            warn_once(
                f"{type(stack).__name__}.forward never checkpoints its blocks in this transformers release (an "
                f"upstream bug: upstream's gradient_checkpointing_enable has no effect on it either), so blocks "
                f"{indices} are not recomputed and these settings cannot take effect: {_describe(config)}.",
                key=f"inert:{type(stack).__qualname__}",
                owner=model,
                stacklevel=5,
            )
            continue
        uncontrolled.extend(indices)
        warn_once(
            f"{type(stack).__name__}.forward calls torch.utils.checkpoint itself instead of "
            f"self._gradient_checkpointing_func, so these settings cannot take effect there: {_describe(config)}. "
            f"All its blocks ({indices}) are recomputed with the model's own checkpoint arguments.",
            key=f"uncontrolled:{type(stack).__qualname__}",
            owner=model,
            stacklevel=5,
        )
    return uncontrolled, inert


def _offload_device(model: nn.Module, config: CheckpointConfig):
    if not config.offload:
        return None
    device = current_accelerator()
    if device is None:
        warn_once(
            "offload=True has no effect on this machine: there is no accelerator, so activations already live in "
            "host memory. Running plain activation checkpointing.",
            key="offload",
            owner=model,
            stacklevel=5,
        )
    return device


def apply_config(model: nn.Module, config: CheckpointConfig) -> nn.Module:
    """Enable checkpointing on ``model`` as ``config`` says. The shared implementation of every entry point."""
    target = _target_model(model)
    if not getattr(target, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"{type(target).__name__} does not support activation checkpointing: the class sets "
            "supports_gradient_checkpointing = False."
        )
    if _STATE_ATTRIBUTE in target.__dict__:
        remove(target)
    from .distributed import wrapper as distributed_wrapper

    distributed_wrapper.remove(target)  # enable replaces hf_ckpt.distributed.apply

    legacy = _uses_legacy_signature(target)
    if legacy:
        warn_once(
            f"{type(target).__name__} defines _set_gradient_checkpointing(module, value), a signature transformers "
            "deprecated in 4.35. hf_ckpt calls it the old way so the model's own logic runs, then binds the "
            "checkpoint function itself so your settings still apply. Remove that method from the modeling file "
            "to silence this warning.",
            key="legacy-signature",
            owner=target,
            stacklevel=4,
        )
    blocks = find_blocks(target)
    strategies = config.resolve(len(blocks))
    saved = _snapshot(target)
    offload_to = _offload_device(target, config)
    offloader = None if offload_to is None else OverlappedOffload(offload_to.type, pin_memory=offload_to.type != "cpu")
    checkpoint_function = build_checkpoint_function(dict(config.checkpoint_kwargs), offloader=offloader)
    functions = build_block_functions(
        strategies, dict(config.checkpoint_kwargs), offloader=offloader, policy=config.policy,
        policies=getattr(config.plan, "policies", None),
    )
    _run_model_logic(target, True, checkpoint_function, config)

    selected = sorted(strategies)
    if not _bind(target, blocks, functions, checkpoint_function, legacy):
        _restore(saved)
        raise ValueError(
            f"{type(target).__name__} is not compatible with activation checkpointing: none of its modules has a "
            "`gradient_checkpointing` attribute."
        )
    state = _EnabledState(config=config, selected=selected, saved_attributes=saved)
    state.uncontrolled, state.inert = _warn_uncontrolled(target, blocks, config)

    if config.use_reentrant or target is not model or has_peft_adapters(target):
        handle = _hooks.add_input_grads_hook(target)
        if handle is not None:
            state.hooks.append(handle)
    state.hooks.extend(_hooks.add_use_cache_hooks(target, [b.module for b in blocks]))
    from .distributed import checks as distributed_checks

    guard = distributed_checks.install(target)  # one checkpoint per block under any engine; the DDP trap
    if guard is not None:
        state.hooks.append(guard)
    target.__dict__[_STATE_ATTRIBUTE] = state
    return model


def remove(model: nn.Module) -> nn.Module:
    """Disable checkpointing on ``model`` and undo everything :func:`apply_config` did."""
    target = _target_model(model)
    if _uses_legacy_signature(target):
        _run_model_logic(target, False, None, None)
    state = target.__dict__.pop(_STATE_ATTRIBUTE, None)
    if state is not None:
        for handle in state.hooks:
            handle.remove()
        _restore(state.saved_attributes)
    from .distributed import wrapper as distributed_wrapper

    distributed_wrapper.remove(target)  # disable also turns hf_ckpt.distributed.apply's wrappers off
    for module in target.modules():
        if getattr(module, "gradient_checkpointing", False):
            module.gradient_checkpointing = False
    return model


def enable(
    model: nn.Module,
    *,
    every_n_layers: int = 1,
    layers: Sequence[int] | None = None,
    num_layers: int | None = None,
    method: str | None = None,
    strategy: str = "full",
    policy: Any = None,
    plan: "CheckpointPlan | str | None" = None,
    budget: float | int | None = None,
    sample_inputs: Mapping[str, Any] | None = None,
    offload: bool = False,
    **checkpoint_kwargs: Any,
) -> nn.Module:
    """Enable activation checkpointing on a loaded model, without subclassing it.

    Works on a ``transformers.PreTrainedModel`` of any supported release (4.45 to 5.x), layer-flag and stack-flag
    models alike, remote-code models with the legacy ``_set_gradient_checkpointing(module, value)`` signature
    included, and on a PEFT ``PeftModel`` wrapping one. Calling it again replaces the previous setting.

    Which blocks (give at most one way; blocks are the repeated per-layer blocks in global order, encoder blocks
    then decoder blocks):

    Args:
        model: The model, in any state; checkpointing takes effect in training mode.
        every_n_layers: Checkpoint blocks ``0, n, 2n, ...``. ``1`` (the default) checkpoints every block.
        layers: Explicit block indices, e.g. ``[0, 1, 5]``.
        num_layers: Checkpoint this many blocks, placed by ``method``: ``"uniform"`` (spread evenly, default)
            or ``"block"`` (the first ``num_layers``).
        method: See ``num_layers``.
        strategy: ``"full"`` recomputes each selected block; ``"selective"`` keeps the outputs of its matmuls and
            attention and recomputes only the cheap ops in between (see :mod:`hf_ckpt.selective`).
        policy: The selective policy: a name, a list of aten ops to save, or a callable.
        plan: A :class:`~hf_ckpt.CheckpointPlan` (or the path of one saved as JSON): a strategy per block.
        budget: With ``sample_inputs``: make a plan that fits this activation-memory budget (bytes, or a
            fraction of the no-checkpointing activation memory) at the least recompute, and apply it.
        sample_inputs: A representative batch for ``budget``'s profiling step.
        offload: Keep the inputs saved for the recompute in pinned host memory. Without an accelerator there is
            nothing to offload: plain checkpointing runs and one warning says so.
        **checkpoint_kwargs: Passed to ``torch.utils.checkpoint.checkpoint`` (``use_reentrant``,
            ``preserve_rng_state``, ``context_fn``, ``determinism_check``, ``debug``, ...). ``use_reentrant``
            defaults to ``False`` and is always passed explicitly.

    Returns:
        ``model``, so that calls chain.

    Raises:
        TypeError: ``model`` is no ``PreTrainedModel``; an option has the wrong type; a checkpoint keyword
            argument is unknown to ``torch.utils.checkpoint.checkpoint``.
        ValueError: an option is out of range (``every_n_layers`` below 1, a layer index past the last block),
            two options select blocks in different ways, or the model's class sets
            ``supports_gradient_checkpointing = False``.

    Adapters: input grads are turned on where the recompute needs them (reentrant checkpointing, PEFT adapters),
    so LoRA weights get gradients whichever order the model was wrapped and enabled in.
    """
    if (budget is None) != (sample_inputs is None):
        raise ValueError("budget and sample_inputs go together: the budget is fitted by profiling sample_inputs")
    if budget is not None:
        if plan is not None:
            raise ValueError("give either plan or budget (which makes a plan), not both")
        from .planner import plan as make_plan

        plan = make_plan(model, sample_inputs, budget, policy=policy, **checkpoint_kwargs)
        policy = policy if "selective" in plan.strategies else None
    config = CheckpointConfig.from_arguments(
        checkpoint_kwargs,
        dict_name="checkpoint_kwargs",
        every_n_layers=every_n_layers,
        layers=layers,
        num_layers=num_layers,
        method=method,
        strategy=None if strategy == "full" else strategy,
        policy=policy,
        plan=plan,
        offload=offload,
    )
    return apply_config(model, config)


def disable(model: nn.Module) -> nn.Module:
    """Disable activation checkpointing and restore the model as it was before :func:`enable`.

    No block is recomputed afterwards, the hooks and attributes ``enable`` added are gone, and a model that was
    never enabled is simply switched off (as ``gradient_checkpointing_disable`` does upstream).
    """
    return remove(model)


def checkpointed_layers(model: nn.Module) -> list[int]:
    """Indices of the repeated blocks that will be recomputed in backward, in global order.

    Blocks are counted as :func:`hf_ckpt.enable`'s ``every_n_layers`` counts them: encoder blocks, then decoder
    blocks. Works whoever enabled checkpointing (hf_ckpt, upstream ``gradient_checkpointing_enable``, or the
    model's legacy ``_set_gradient_checkpointing``), and counts blocks under a checkpoint wrapper
    (:func:`hf_ckpt.distributed.apply`, ``torch.distributed``'s ``checkpoint_wrapper``).
    """
    from .distributed.wrapper import wrapped_layers

    target = _target_model(model)
    state = target.__dict__.get(_STATE_ATTRIBUTE)
    uncontrolled = set(state.uncontrolled) if state is not None else set()
    inert = set(state.inert) if state is not None else set()
    wrapped = set(wrapped_layers(target))  # hf_ckpt.distributed.apply, or anyone's checkpoint_wrapper
    return [
        block.index
        for block in find_blocks(target)
        if block.index not in inert
        and (block.index in uncontrolled or block.index in wrapped or is_block_checkpointed(block))
    ]
