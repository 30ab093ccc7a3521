"""What the distributed engines left on a model, detected by what they *have*, never by version strings.

* DDP (``torch.nn.parallel.DistributedDataParallel``) and FSDP1 (``FullyShardedDataParallel``) wrap a module
  and keep it as ``.module``; FSDP1 units keep theirs as ``_fsdp_wrapped_module``.
* FSDP2 (``fully_shard``) changes the class of a module in place, so the model stays a ``PreTrainedModel``.
* ``torch.distributed``'s ``CheckpointWrapper`` (``checkpoint_wrapper`` / ``apply_activation_checkpointing``,
  which accelerate's FSDP plugin uses for ``activation_checkpointing=True``) keeps the module as
  ``_checkpoint_wrapped_module``; the composable ``checkpoint(module)`` API records itself in the module's
  composable registry.

Everything here imports ``torch.distributed`` lazily, so that ``import hf_ckpt`` stays cheap and works on builds
without distributed support.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from torch import nn

from hf_ckpt.runtime import _torch
from hf_ckpt.runtime.util.compat import is_gradient_checkpointing_layer
from hf_ckpt.runtime.state import ACTIVE_ATTRIBUTE
from hf_ckpt.runtime.blocks import Block, find_blocks

#: Attributes under which engine and checkpoint wrappers keep the module they wrap.
_WRAPPED_ATTRIBUTES = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def checkpoint_wrapper_module() -> Any | None:
    """torch.distributed's checkpoint_wrapper module, or None where it cannot be imported (:mod:`hf_ckpt.runtime._torch`)."""
    return _torch.checkpoint_wrapper_module()


def innermost(module: nn.Module) -> nn.Module:
    """The module at the bottom of a chain of FSDP1 units and checkpoint wrappers (``module`` when unwrapped)."""
    while True:
        for name in _WRAPPED_ATTRIBUTES:
            inner = _torch.child_modules(module).get(name)
            if isinstance(inner, nn.Module):
                module = inner
                break
        else:
            return module


def blocks_of(model: nn.Module) -> list[Block]:
    """:func:`hf_ckpt.runtime.blocks.find_blocks`, seeing through FSDP1 units and checkpoint wrappers.

    Around a layer-flag block (``GradientCheckpointingLayer``) such a wrapper is what the stack's
    ``ModuleList`` holds, and it forwards attribute reads to the block, so it can pass for a stack-flag block.
    The block returned is then the layer inside, which carries its own flag.
    """
    found = []
    for block in find_blocks(model):
        inner = innermost(block.module)
        if not block.layer_flag and inner is not block.module and is_gradient_checkpointing_layer(inner):
            block = Block(index=block.index, name=block.name, module=inner, owner=inner)
        found.append(block)
    return found


def wrapped_blocks(target: nn.Module) -> list[int]:
    """Indices of the blocks of ``target`` that an active checkpoint wrapper covers, in global order.

    Counts hf_ckpt's own active wrappers (``hf_ckpt.distributed.apply``), ``torch.distributed``'s
    ``CheckpointWrapper`` from anyone (``apply_activation_checkpointing``, accelerate's FSDP plugin) and the
    composable ``checkpoint``.
    """
    covered: set[int] = set()
    for module in target.modules():
        active = (is_checkpoint_wrapper(module) and module.__dict__.get(ACTIVE_ATTRIBUTE, True)) or (
            has_composable_checkpoint(module)
        )
        if active:
            covered.update(id(m) for m in module.modules())
    return [
        block.index
        for block in blocks_of(target)
        if id(block.module) in covered or id(innermost(block.module)) in covered
    ]


def is_checkpoint_wrapper(module: nn.Module) -> bool:
    """True for ``torch.distributed``'s ``CheckpointWrapper`` (and subclasses, hf_ckpt's own included)."""
    wrappers = checkpoint_wrapper_module()
    return wrappers is not None and isinstance(module, wrappers.CheckpointWrapper)


def has_composable_checkpoint(module: nn.Module) -> bool:
    """True when torch.distributed's composable ``checkpoint(module)`` was applied to ``module``."""
    return _torch.composable_checkpoint_applied(module)


def active_ddp() -> nn.Module | None:
    """The ``DistributedDataParallel`` whose forward is running now, or None.

    DDP records itself for the duration of its forward (``_get_active_ddp_module``, which TorchDynamo reads); a
    forward hook of the wrapped model therefore sees its DDP, whoever created it (a training loop, accelerate,
    the ``Trainer``).
    """
    return _torch.active_ddp_module()


def accelerate_fsdp_activation_checkpointing() -> bool:
    """Whether accelerate's FSDP plugin is set to add its own activation checkpointing.

    Read from the initialized ``AcceleratorState`` when there is one, else from the environment that
    ``accelerate launch`` sets from a config file (``ACCELERATE_USE_FSDP``, ``FSDP_ACTIVATION_CHECKPOINTING``).
    Never imports accelerate when it has not been imported.
    """
    import sys

    state_module = sys.modules.get("accelerate.state")
    if state_module is not None:
        shared = getattr(state_module.AcceleratorState, "_shared_state", None)
        plugin = shared.get("fsdp_plugin") if hasattr(shared, "get") else None
        if plugin is not None:
            return bool(getattr(plugin, "activation_checkpointing", False))
    return (
        os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        and os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true"
    )


def uses_reentrant(function: Any) -> bool:
    """Whether a bound checkpoint function (a chain of ``functools.partial``) passes ``use_reentrant=True``."""
    pending = [function]
    while pending:
        current = pending.pop()
        if isinstance(current, functools.partial):
            if "use_reentrant" in current.keywords:
                return bool(current.keywords["use_reentrant"])
            pending.append(current.func)
            pending.extend(current.args)
    return False
