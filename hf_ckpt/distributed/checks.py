"""Runtime checks for checkpointing inside distributed engines: never two checkpoints on one block, and no DDP trap.

:func:`guard` puts one forward pre-hook on the model. In each training forward (module in training mode, grad
enabled) it looks at what the engines did to the model since it last looked (cheaply: it re-examines the model
only when its modules or its hf_ckpt setting changed):

* **Double checkpointing.** A block may already be checkpointed by ``torch.distributed``'s ``CheckpointWrapper``
  (``apply_activation_checkpointing``; accelerate's FSDP plugin adds these in ``prepare()`` when its
  ``activation_checkpointing`` is on) or by the composable ``checkpoint(module)``. hf_ckpt's checkpointing on
  the same block would nest a second checkpoint inside the first: with reentrant checkpointing on either side the
  block runs three times per step instead of two; with non-reentrant on both, the inner one is redundant work.
  The engine's wrapper was built into the module tree (and, under FSDP, into the sharded state) and cannot be
  taken out safely, so the wrapper wins: hf_ckpt turns its own checkpointing off on those blocks and warns once,
  saying how to let hf_ckpt choose instead.
* **DDP and reentrant checkpointing.** Under ``DistributedDataParallel(find_unused_parameters=True)`` (without
  ``static_graph=True``) reentrant checkpointing fails in backward with DDP's "Expected to mark a variable ready
  only once". The guard raises before that, at the forward, with what to change.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hf_ckpt.runtime import _torch
from hf_ckpt.runtime.binding import block_function, is_block_checkpointed, turn_block_off
from hf_ckpt.runtime.state import ACTIVE_ATTRIBUTE, STATE_ATTRIBUTE, peek_state
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.runtime.blocks import Block
from hf_ckpt.distributed import _engines

DDP_REENTRANT_MESSAGE = (
    "Reentrant activation checkpointing (use_reentrant=True) cannot train under "
    "DistributedDataParallel(find_unused_parameters=True): DDP's search for unused parameters does not see the "
    "parameters of reentrant-checkpointed blocks, marks them ready at the end of forward, and backward then fails "
    "with \"Expected to mark a variable ready only once\". Use use_reentrant=False (hf_ckpt's default), or create "
    "DistributedDataParallel with find_unused_parameters=False or static_graph=True."
)


@dataclass
class _GuardCache:
    """What the hook last saw, so that it re-examines the model only when something changed."""

    signature: tuple = ()
    reentrant: bool = False
    checked_ddp: set = field(default_factory=set)


def is_hf_ckpt_wrapper(module: nn.Module) -> bool:
    return ACTIVE_ATTRIBUTE in module.__dict__


def _covered(model: nn.Module) -> tuple[dict[int, str], set[int]]:
    """Modules under a foreign checkpoint (id -> what checkpoints them), and modules under an active hf_ckpt wrapper."""
    foreign: dict[int, str] = {}
    ours: set[int] = set()
    for module in model.modules():
        if _engines.is_checkpoint_wrapper(module):
            if is_hf_ckpt_wrapper(module):
                if module.__dict__[ACTIVE_ATTRIBUTE]:
                    ours.update(id(m) for m in module.modules())
                continue
            source = "checkpoint_wrapper"
        elif _engines.has_composable_checkpoint(module):
            source = "composable"
        else:
            continue
        for inner in module.modules():
            foreign.setdefault(id(inner), source)
    return foreign, ours


def _ids(block: Block) -> tuple[int, int]:
    return id(block.module), id(_engines.innermost(block.module))


def _under(block: Block, covered: dict[int, str] | set[int]) -> bool:
    return any(key in covered for key in _ids(block))


def _our_wrapper_of(model: nn.Module, block: Block) -> nn.Module | None:
    for module in model.modules():
        if is_hf_ckpt_wrapper(module) and _engines.innermost(module) is _engines.innermost(block.module):
            return module
    return None


def _setter(target: nn.Module) -> Any:
    """How to change a checkpointing attribute: through hf_ckpt's record when there is one, so it stays current."""
    state = peek_state(target)  # in a forward: never dropped there
    return state.record if state is not None and state.is_current() else setattr


def _wrapper_reentrant(module: nn.Module) -> bool:
    wrappers = _engines.checkpoint_wrapper_module()
    impl = getattr(module, "checkpoint_impl", None)
    return impl is wrappers.CheckpointImpl.REENTRANT or _engines.uses_reentrant(getattr(module, "checkpoint_fn", None))


def _describe_source(sources: set[str]) -> str:
    if "checkpoint_wrapper" in sources and _engines.accelerate_fsdp_activation_checkpointing():
        return (
            "accelerate's FSDP plugin (activation_checkpointing=True wraps every block in torch.distributed's "
            "checkpoint_wrapper)"
        )
    names = {
        "checkpoint_wrapper": "torch.distributed's checkpoint_wrapper",
        "composable": "torch.distributed's composable checkpoint()",
    }
    return " and ".join(names[source] for source in sorted(sources))


def settle(model: nn.Module) -> list[int]:
    """Make sure no block of ``model`` is checkpointed twice; return the blocks where hf_ckpt stepped back.

    Where a foreign checkpoint (``CheckpointWrapper``, composable ``checkpoint``) covers a block that hf_ckpt also
    checkpoints (its flags, or an active :func:`hf_ckpt.distributed.apply` wrapper), hf_ckpt's checkpointing of
    that block is turned off and one warning per model says so. Between hf_ckpt's own two ways, the later call
    wins: ``hf_ckpt.enable`` after :func:`hf_ckpt.distributed.apply` turns every wrapper of ``apply`` off, and
    flags set another way (upstream's ``gradient_checkpointing_enable``) turn off the wrappers of the blocks they
    flag, with a warning.
    """
    target = target_model(model)
    record = _setter(target)
    foreign, ours = _covered(target)
    stepped_back: list[int] = []
    sources: set[str] = set()
    replaced_wrapper: list[int] = []
    for block in _engines.blocks_of(target):
        flagged = is_block_checkpointed(block)
        wrapped_by_us = _under(block, ours)
        if _under(block, foreign) and (flagged or wrapped_by_us):
            if flagged:
                turn_block_off(block, record)
            if wrapped_by_us:
                record(_our_wrapper_of(target, block), ACTIVE_ATTRIBUTE, False)
            stepped_back.append(block.index)
            sources.update(foreign[key] for key in _ids(block) if key in foreign)
        elif flagged and wrapped_by_us:
            record(_our_wrapper_of(target, block), ACTIVE_ATTRIBUTE, False)
            replaced_wrapper.append(block.index)
    if stepped_back:
        source = _describe_source(sources)
        warn_once(
            f"Blocks {stepped_back} are already checkpointed by {source}; checkpointing them with hf_ckpt as well "
            "would nest a second checkpoint in the first. hf_ckpt turned its own checkpointing off on these "
            "blocks and leaves them to the wrapper, so hf_ckpt's block selection does not apply to them. To let "
            "hf_ckpt choose, turn the other activation checkpointing off (accelerate: "
            "fsdp_activation_checkpointing: false) and call hf_ckpt.enable, or use hf_ckpt.distributed.apply, "
            "which checkpoints through checkpoint_wrapper with hf_ckpt's selection.",
            key=f"double-checkpointing:{stepped_back}",
            owner=target,
            stacklevel=4,
        )
    if replaced_wrapper:
        warn_once(
            f"Blocks {replaced_wrapper} were checkpointed both by hf_ckpt.distributed.apply's wrappers and by "
            "flags set later (gradient_checkpointing_enable); the flags win on these blocks and their wrappers "
            "pass them through. Call hf_ckpt.enable or hf_ckpt.distributed.apply to choose one way for the whole "
            "model.",
            key=f"replaced-apply:{replaced_wrapper}",
            owner=target,
            stacklevel=4,
        )
    return stepped_back


def _uses_reentrant_anywhere(model: nn.Module) -> bool:
    """Whether any block of ``model`` is checkpointed reentrantly now, by flags or by a wrapper."""
    for module in model.modules():
        if _engines.is_checkpoint_wrapper(module) and module.__dict__.get(ACTIVE_ATTRIBUTE, True):
            if _wrapper_reentrant(module):
                return True
    return any(
        is_block_checkpointed(block) and _engines.uses_reentrant(block_function(block))
        for block in _engines.blocks_of(model)
    )


def check_ddp(model: nn.Module, ddp: nn.Module | None = None) -> None:
    """Raise when reentrant checkpointing meets ``DistributedDataParallel(find_unused_parameters=True)``.

    ``ddp`` defaults to the DDP whose forward is running now (None outside a DDP forward: nothing to check).
    """
    ddp = ddp if ddp is not None else _engines.active_ddp()
    if ddp is None or getattr(ddp, "static_graph", False) or not getattr(ddp, "find_unused_parameters", False):
        return
    if _uses_reentrant_anywhere(target_model(model)):
        raise RuntimeError(DDP_REENTRANT_MESSAGE)


def _signature(model: nn.Module) -> tuple:
    """Changes when modules are added or replaced (wrappers, FSDP1 units) or a checkpointing setting is replaced."""
    count = sum(1 for _ in model.modules())
    return count, id(model.__dict__.get(STATE_ATTRIBUTE))


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def _pre_forward(cache: _GuardCache, module: nn.Module, args: Any) -> None:
    if not (module.training and torch.is_grad_enabled()) or _compiling():
        return
    signature = _signature(module)
    if signature != cache.signature:
        settle(module)
        cache.signature = _signature(module)
        cache.reentrant = _uses_reentrant_anywhere(module)
        cache.checked_ddp.clear()
    if not cache.reentrant:
        return
    ddp = _engines.active_ddp()
    if ddp is not None and id(ddp) not in cache.checked_ddp:
        check_ddp(module, ddp)
        cache.checked_ddp.add(id(ddp))


def _is_guard(hook: Any) -> bool:
    hook = getattr(hook, "__wrapped__", hook)  # one of a record's hooks (hf_ckpt.runtime.state.Hooks)
    return isinstance(hook, functools.partial) and hook.func is _pre_forward


def _installed(target: nn.Module) -> bool:
    return any(_is_guard(hook) for hook in _torch.forward_pre_hooks(target).values())


def new_hook(target: nn.Module) -> functools.partial | None:
    """The guard's forward pre-hook for ``target`` (a ``PreTrainedModel``), to register; None when it is there
    already."""
    if _installed(target):
        return None
    return functools.partial(_pre_forward, _GuardCache())


def install(target: nn.Module) -> RemovableHandle | None:
    """Put the guard's hook on ``target`` (a ``PreTrainedModel``); None when it is there already."""
    hook = new_hook(target)
    return None if hook is None else target.register_forward_pre_hook(hook)


def guard(model: nn.Module) -> nn.Module:
    """Check, at every training forward of ``model``, that no block is checkpointed twice and that DDP can train it.

    :func:`hf_ckpt.distributed.apply` installs the guard itself. Call it for a model checkpointed another way
    (``hf_ckpt.enable``, upstream's ``gradient_checkpointing_enable``) before handing it to an engine that may
    add its own activation checkpointing (accelerate's FSDP plugin, ``apply_activation_checkpointing``). Calling
    it again does nothing; :func:`unguard` removes it.

    Args:
        model: A ``PreTrainedModel``, a PEFT ``PeftModel``, or one wrapped by DDP / FSDP1 (``.module`` is used).

    Returns:
        ``model``, so that calls chain.
    """
    install(target_model(model))
    return model


def unguard(model: nn.Module) -> nn.Module:
    """Remove the hook :func:`guard` installed (nothing happens when there is none)."""
    target = target_model(model)
    hooks = _torch.forward_pre_hooks(target)
    for key, hook in list(hooks.items()):
        if _is_guard(hook):
            del hooks[key]
    return model
