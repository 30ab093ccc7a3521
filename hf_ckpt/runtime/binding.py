"""Which function checkpoints which block: resolved without touching the model, then bound to it.

:func:`resolve` turns a validated :class:`~hf_ckpt.CheckpointConfig` into a :class:`Binding` for one model: the
blocks, the checkpoint function of each selected block (full or selective, offloaded or not) and the function a
stack calls for blocks it cannot tell apart. It raises for anything that cannot work on this model (an index past
the last block, a plan for another block count, a model without checkpointing flags) *before* anything changes.
:func:`bind` then sets the flags and functions; :func:`block_function` reads back, from the flags alone, which
function checkpoints a block (the one place that decides it, for the core and for ``hf_ckpt.distributed``).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from torch import nn

from hf_ckpt.runtime.util.compat import current_accelerator, is_gradient_checkpointing_layer
from hf_ckpt.runtime.stacks.stack_code import hard_codes_checkpoint
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.runtime.blocks import SELECTED_ATTRIBUTE, Block, find_blocks
from hf_ckpt.runtime.config import CheckpointConfig
from hf_ckpt.runtime.functions import (
    build_block_functions,
    build_checkpoint_function,
    stack_checkpoints,
    with_block_selection,
)
from hf_ckpt.runtime.offload import OverlappedOffload


@dataclass(frozen=True)
class Binding:
    """What :func:`bind` will set on one model for one config.

    Attributes:
        config: The setting.
        blocks: The model's repeated blocks, in global order.
        functions: The checkpoint function of each selected block, by block index.
        default: The plain checkpoint function (what a stack uses for a block it cannot identify).
        legacy: The model defines the pre-4.35 ``_set_gradient_checkpointing(module, value)``.
    """

    config: CheckpointConfig
    blocks: tuple[Block, ...]
    functions: dict[int, Any]
    default: Any
    legacy: bool

    @property
    def selected(self) -> tuple[int, ...]:
        return tuple(sorted(self.functions))


def uses_legacy_signature(model: nn.Module) -> bool:
    """Remote-code models written before transformers 4.35 define ``_set_gradient_checkpointing(module, value)``."""
    return "value" in inspect.signature(model._set_gradient_checkpointing).parameters


def _overrides_set_gradient_checkpointing(model: nn.Module) -> bool:
    from transformers import PreTrainedModel

    return type(model)._set_gradient_checkpointing is not PreTrainedModel._set_gradient_checkpointing


def _offloader(model: nn.Module, config: CheckpointConfig) -> OverlappedOffload | None:
    if not config.offload:
        return None
    device = current_accelerator()
    if device is None:
        warn_once(
            "offload=True has no effect on this machine: there is no accelerator, so activations already live in "
            "host memory. Running plain activation checkpointing.",
            key="offload",
            owner=model,
            stacklevel="user",
        )
        return None
    return OverlappedOffload(device.type, pin_memory=device.type != "cpu")


def resolve(target: nn.Module, config: CheckpointConfig) -> Binding:
    """The :class:`Binding` of ``config`` on ``target``, or the error that stops it; ``target`` is not changed."""
    if not getattr(target, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"{type(target).__name__} does not support activation checkpointing: the class sets "
            "supports_gradient_checkpointing = False."
        )
    blocks = tuple(find_blocks(target))
    if not blocks and not any(hasattr(module, "gradient_checkpointing") for module in target.modules()):
        raise ValueError(
            f"{type(target).__name__} is not compatible with activation checkpointing: none of its modules has a "
            "`gradient_checkpointing` attribute, and it has no list of repeated blocks."
        )
    strategies = config.resolve(len(blocks))
    if config.plan is not None:
        config.plan.check_made_for(target)
    offloader = _offloader(target, config)
    return Binding(
        config=config,
        blocks=blocks,
        functions=build_block_functions(strategies, config, offloader=offloader),
        default=build_checkpoint_function(dict(config.checkpoint_kwargs), offloader=offloader,
                                          checkpoint_fn=config.checkpoint_fn),
        legacy=uses_legacy_signature(target),
    )


def run_model_logic(model: nn.Module, enable: bool, binding: Binding | None) -> None:
    """Let a model that customises ``_set_gradient_checkpointing`` run its own logic, in either signature."""
    if uses_legacy_signature(model):
        model.apply(functools.partial(model._set_gradient_checkpointing, value=enable))
    elif enable and binding is not None and _overrides_set_gradient_checkpointing(model):
        options: dict[str, Any] = {"enable": True, "gradient_checkpointing_func": binding.default}
        if "every_n_layers" in inspect.signature(model._set_gradient_checkpointing).parameters:
            options["every_n_layers"] = binding.config.every_n_layers
        model._set_gradient_checkpointing(**options)


def bind(target: nn.Module, binding: Binding) -> list[tuple[nn.Module, str, Any]]:
    """Set the flags and functions of ``binding`` on ``target``; returns every ``(module, name, value)`` set.

    Every module with a ``gradient_checkpointing`` flag gets a function: a block its own, a flag inside a block
    its block's (T5Attention reads it; a nested checkpointing layer stays off: never a checkpoint inside a
    checkpoint), a stack the selecting function, which runs unselected blocks directly.
    """
    run_model_logic(target, True, binding)
    block_of = {id(block.module): block for block in binding.blocks}
    enclosing = {id(m): block for block in binding.blocks for m in block.module.modules() if m is not block.module}
    stack_function = with_block_selection(binding.default)
    owners = {id(block.owner) for block in binding.blocks if not block.layer_flag}
    functions = binding.functions
    bound: list[tuple[nn.Module, str, Any]] = []

    def put(module: nn.Module, name: str, value: Any) -> None:
        setattr(module, name, value)
        bound.append((module, name, value))

    for block in binding.blocks:
        if not hasattr(block.owner, "gradient_checkpointing"):  # a model that only declares support: its flag
            put(block.owner, "gradient_checkpointing", True)
    for module in target.modules():
        if not hasattr(module, "gradient_checkpointing"):
            continue
        if binding.legacy and not module.gradient_checkpointing:
            continue  # the model's own `_set_gradient_checkpointing` left this module off
        block = block_of.get(id(module))
        if block is not None:
            put(module, "_gradient_checkpointing_func", functions.get(block.index, binding.default))
            put(module, "gradient_checkpointing", block.index in functions)
        elif id(module) in enclosing:
            index = enclosing[id(module)].index
            put(module, "_gradient_checkpointing_func", functions.get(index, binding.default))
            put(module, "gradient_checkpointing", index in functions and not is_gradient_checkpointing_layer(module))
        else:  # a stack; one whose loop hard-codes torch's checkpoint keeps its flag off (hf_ckpt.runtime.stacks.direct wraps)
            put(module, "_gradient_checkpointing_func", stack_function)
            put(module, "gradient_checkpointing", not (id(module) in owners and hard_codes_checkpoint(type(module))))
    for block in binding.blocks:
        if not block.layer_flag:
            put(block.module, SELECTED_ATTRIBUTE, functions.get(block.index, False))
    return bound


def is_block_checkpointed(block: Block) -> bool:
    """Whether ``block`` will be recomputed in backward, as the model's flags say."""
    if block.layer_flag:
        return bool(getattr(block.owner, "gradient_checkpointing", False))
    return stack_checkpoints(block.owner) and getattr(block.module, SELECTED_ATTRIBUTE, True) is not False


def block_function(block: Block) -> Any | None:
    """The function that checkpoints ``block`` as the flags stand; None when the flags leave it unchecked."""
    if not is_block_checkpointed(block):
        return None
    choice = getattr(block.module, SELECTED_ATTRIBUTE, None)
    if not block.layer_flag and callable(choice):
        return choice
    return getattr(block.owner, "_gradient_checkpointing_func", None)


def turn_block_off(block: Block, record: Any = setattr) -> None:
    """Stop checkpointing ``block`` through the flags (``record(module, name, value)`` sets the attribute)."""
    if block.layer_flag:
        record(block.module, "gradient_checkpointing", False)
    else:
        record(block.module, SELECTED_ATTRIBUTE, False)
