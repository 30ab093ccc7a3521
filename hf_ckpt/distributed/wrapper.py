"""``hf_ckpt.distributed.apply``: hf_ckpt's block selection, through ``torch.distributed``'s ``checkpoint_wrapper``.

Training loops built on FSDP's wrapper mechanism (``apply_activation_checkpointing``, as accelerate and
torchtitan-style loops use) expect checkpointing as modules in the tree, not as flags. :func:`apply` gives them
that with exactly the meaning of :func:`hf_ckpt.enable`: the same options, validated the same way, the same
blocks selected and the same checkpoint functions (full or selective, offloaded or not, reentrant or not), resolved
by the same :func:`hf_ckpt.runtime.binding.resolve`; this module only wraps. The record is made and the hooks go on
(a plan's ``outside_blocks`` and partitioned blocks included) by the one :func:`hf_ckpt.runtime.apply.install`, so
:func:`hf_ckpt.disable` and :func:`remove` take it all back.

Every block gets one :class:`HfCkptCheckpointWrapper` (a ``CheckpointWrapper`` subclass), active on the selected
blocks and a pass-through on the others, so that calling :func:`apply` again or :func:`remove` only flips
switches and never changes the module tree (which FSDP may already have sharded). A wrapper checkpoints only in
training with grad enabled, as ``GradientCheckpointingLayer`` does, so evaluation and ``generate`` run plainly.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_ckpt.runtime.apply import install
from hf_ckpt.runtime.binding import Binding
from hf_ckpt.runtime.state import ACTIVE_ATTRIBUTE, Source, get_state, take_back
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.blocks import Block
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.distributed import _engines
from hf_ckpt.distributed.checks import guard, is_hf_ckpt_wrapper

_wrappers = _engines.checkpoint_wrapper_module()


if _wrappers is not None:

    class HfCkptCheckpointWrapper(_wrappers.CheckpointWrapper):
        """``torch.distributed``'s ``CheckpointWrapper`` that checkpoints only while it is active.

        Active, it checkpoints its module in training forwards with grad enabled; otherwise (inactive, eval mode,
        ``torch.no_grad``) it calls the module directly. As with every ``CheckpointWrapper``, ``state_dict`` keys
        are those of the unwrapped model, while ``named_parameters`` of the model shows the
        ``_checkpoint_wrapped_module.`` level.
        """

        def __init__(self, module: nn.Module, checkpoint_fn: Any, *, reentrant: bool, active: bool) -> None:
            super().__init__(module, checkpoint_impl=_impl(reentrant), checkpoint_fn=checkpoint_fn)
            self.__dict__[ACTIVE_ATTRIBUTE] = active

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            if self.__dict__[ACTIVE_ATTRIBUTE] and self.training and torch.is_grad_enabled():
                return super().forward(*args, **kwargs)
            return self._checkpoint_wrapped_module(*args, **kwargs)


def _impl(reentrant: bool) -> Any:
    return _wrappers.CheckpointImpl.REENTRANT if reentrant else _wrappers.CheckpointImpl.NO_REENTRANT


def _require_distributed() -> None:
    if _wrappers is None:
        raise RuntimeError(
            "hf_ckpt.distributed.apply needs torch.distributed's checkpoint_wrapper, which this PyTorch build "
            "lacks (torch.distributed.is_available() is False). Use hf_ckpt.enable instead."
        )


def _our_wrappers(target: nn.Module) -> dict[int, nn.Module]:
    """hf_ckpt's wrappers in ``target``, by the id of the module each wraps (at the bottom of any FSDP1 unit)."""
    return {id(_engines.innermost(m)): m for m in target.modules() if is_hf_ckpt_wrapper(m)}


def _foreign_wrapped(target: nn.Module, blocks: list[Block]) -> list[int]:
    """Blocks under a checkpoint that is not hf_ckpt's: ``CheckpointWrapper`` or composable ``checkpoint``."""
    covered: set[int] = set()
    for module in target.modules():
        foreign = (_engines.is_checkpoint_wrapper(module) and not is_hf_ckpt_wrapper(module)) or (
            _engines.has_composable_checkpoint(module)
        )
        if foreign:
            covered.update(id(m) for m in module.modules())
    return [b.index for b in blocks if id(b.module) in covered or id(_engines.innermost(b.module)) in covered]


def apply(model: nn.Module, **options: Any) -> nn.Module:
    """Checkpoint the blocks ``hf_ckpt.enable`` would select, through ``torch.distributed``'s ``checkpoint_wrapper``.

    Each repeated block is wrapped once in :class:`HfCkptCheckpointWrapper` (via
    ``apply_activation_checkpointing``); the selected blocks' wrappers checkpoint with the functions
    ``hf_ckpt.enable`` would bind, the others pass through. Calling it again replaces the previous setting (the
    wrappers stay, their switches and functions change), and it replaces checkpointing set by ``hf_ckpt.enable``.
    It also installs :func:`hf_ckpt.distributed.guard`.

    Order with the engines (all keep the block selection and the gradients of one process):

    * FSDP2 (``fully_shard``): before or after sharding. Before, shard the wrapped blocks
      (``fully_shard(model.model.layers[i])``): the checkpoint then sits inside the FSDP unit.
    * FSDP1 (``FullyShardedDataParallel``): after wrapping, on the FSDP model (the wrappers go inside the FSDP
      units, as accelerate does it), or before, with an auto-wrap policy on the block class.
    * DDP: before or after wrapping.

    Args:
        model: A ``PreTrainedModel``, a PEFT ``PeftModel``, or one wrapped by DDP / FSDP1 (``.module`` is used).
        **options: The options of :func:`hf_ckpt.enable` (``every_n_layers``, ``layers``, ``num_layers``, ...,
            ``offload``, and ``torch.utils.checkpoint.checkpoint``'s keyword arguments), with its defaults.

    Returns:
        ``model``, so that calls chain.

    Raises:
        RuntimeError: PyTorch was built without ``torch.distributed``.
        ValueError: blocks are already wrapped by another activation checkpointing (``checkpoint_wrapper``,
            accelerate's FSDP ``activation_checkpointing``), or an option is out of range (as in ``enable``).
        TypeError: ``model`` is no ``PreTrainedModel``, or an option has the wrong type (as in ``enable``).
    """
    _require_distributed()
    target = target_model(model)
    foreign = _foreign_wrapped(target, _engines.blocks_of(target))
    if foreign:
        raise ValueError(
            f"Blocks {foreign} are already wrapped by another activation checkpointing (torch.distributed's "
            "checkpoint_wrapper, e.g. from apply_activation_checkpointing or accelerate's FSDP plugin with "
            "activation_checkpointing=True); wrapping them again would checkpoint them twice. Turn that "
            "checkpointing off (accelerate: fsdp_activation_checkpointing: false) and call "
            "hf_ckpt.distributed.apply alone."
        )
    config = EnableRequest.parse(options, "checkpoint_kwargs", takes_budget=False).config  # parsed as enable's
    install(model, config, source=Source.DISTRIBUTED, wrappers=_wrap_blocks)
    guard(target)  # on the model until unguard: it outlives the setting
    return model


def _wrap_blocks(target: nn.Module, binding: Binding) -> tuple[list[tuple[nn.Module, str, Any]], list[Any]]:
    """Bind ``binding`` through one :class:`HfCkptCheckpointWrapper` per block (the wrappers a previous call made
    get new switches and functions): ``(bound, undo)`` for :func:`hf_ckpt.runtime.apply.install`."""
    functions = binding.functions
    plain = functools.partial(checkpoint, **binding.config.checkpoint_kwargs)  # what a pass-through wrapper holds
    reentrant = binding.config.use_reentrant
    bound: list[tuple[nn.Module, str, Any]] = []
    for module in target.modules():  # the wrappers checkpoint now: no flag may checkpoint a second time
        if module.__dict__.get("gradient_checkpointing") is True:
            module.gradient_checkpointing = False
            bound.append((module, "gradient_checkpointing", False))
    existing = _our_wrappers(target)
    pending: dict[int, Block] = {}
    for block in _engines.blocks_of(target):
        inner = _engines.innermost(block.module)
        wrapper = existing.get(id(inner))
        if wrapper is None:
            pending[id(inner)] = block
            continue
        wrapper.checkpoint_fn = functions.get(block.index, plain)
        wrapper.checkpoint_impl = _impl(reentrant)
        wrapper.__dict__[ACTIVE_ATTRIBUTE] = block.index in functions

    def wrap(module: nn.Module) -> nn.Module:
        index = pending[id(module)].index
        return HfCkptCheckpointWrapper(
            module, functions.get(index, plain), reentrant=reentrant, active=index in functions
        )

    if pending:
        _wrappers.apply_activation_checkpointing(
            target, checkpoint_wrapper_fn=wrap, check_fn=lambda module: id(module) in pending
        )
    wrappers = list(_our_wrappers(target).values())
    bound.extend((w, ACTIVE_ATTRIBUTE, w.__dict__[ACTIVE_ATTRIBUTE]) for w in wrappers)
    return bound, [functools.partial(_switch_off, wrappers)]


def _switch_off(wrappers: list[nn.Module]) -> None:
    for wrapper in wrappers:
        wrapper.__dict__[ACTIVE_ATTRIBUTE] = False


def remove(model: nn.Module) -> nn.Module:
    """Undo :func:`apply`: every hf_ckpt wrapper passes its block through, and the hooks ``apply`` added go.

    The wrappers themselves stay in the module tree (FSDP may have sharded it), as pass-throughs. Nothing
    happens on a model :func:`apply` never touched.
    """
    target = target_model(model)
    state = get_state(target)
    if state is not None and state.source is Source.DISTRIBUTED:
        take_back(target)
    _switch_off(list(_our_wrappers(target).values()))
    return model


def wrapped_layers(model: nn.Module) -> list[int]:
    """Indices of the blocks an active checkpoint wrapper covers, in global order.

    Counts hf_ckpt's own active wrappers (:func:`apply`), ``torch.distributed``'s ``CheckpointWrapper`` from
    anyone (``apply_activation_checkpointing``, accelerate's FSDP plugin) and the composable ``checkpoint``.
    Flag-based checkpointing (``hf_ckpt.enable``) is what :func:`hf_ckpt.checkpointed_layers` reports.
    """
    return _engines.wrapped_blocks(target_model(model))
