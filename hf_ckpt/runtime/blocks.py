"""Finding the repeated per-layer blocks of a model, in global order.

Two styles of model exist, and hf_ckpt treats both the same way:

* **layer-flag** models (``GradientCheckpointingLayer``, transformers >= 4.52): each block carries its own
  ``gradient_checkpointing`` flag and ``_gradient_checkpointing_func``.
* **stack-flag** models (``LlamaModel`` <= 4.51, ``GPT2Model``, ``BertEncoder``, ``T5Stack`` <= 4.52 and many
  remote-code models): the flag lives on the stack, whose loop calls
  ``self._gradient_checkpointing_func(layer.__call__, ...)``. The blocks are the elements of the stack's
  ``nn.ModuleList``.

Where a stack holds layer-flag blocks, those are its blocks: the other modules it runs directly (MobileViT's
MobileNet layers beside its transformer layers, MusicGen's per-codebook embedding list, GroupViT's stages around
their layers) are not, since nothing ever checkpoints them.

A third kind only **declares** support: the model class sets ``supports_gradient_checkpointing = True`` but no module
of it has a flag or is a ``GradientCheckpointingLayer`` (Gemma 3n's and Gemma 4's audio encoders, PP-LCNetV4,
VAN on transformers 4.45). Its blocks are its stack's list (the largest ``nn.ModuleList``), owned by the model
itself; hf_ckpt gives the model the flag and checkpoints them by wrapping (``hf_ckpt.runtime.stacks.direct``).

Blocks are numbered in module registration order, which is encoder blocks then decoder blocks for
encoder-decoder models.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from hf_ckpt.runtime.util.compat import is_gradient_checkpointing_layer
from hf_ckpt.runtime._torch import child_modules

#: Attribute hf_ckpt sets on the blocks of a stack-flag model to say whether the stack should recompute them.
SELECTED_ATTRIBUTE = "_hf_ckpt_selected"

#: Where wrappers keep the module they wrap: FSDP1 units, ``torch.distributed``'s ``CheckpointWrapper``.
_WRAPPED_ATTRIBUTES = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")


@dataclass(frozen=True)
class Block:
    """One repeated per-layer block.

    Attributes:
        index: Position in global order (encoder blocks first, then decoder blocks).
        name: Qualified module name inside the model, for example ``model.layers.3``.
        module: The block itself.
        owner: The module whose ``gradient_checkpointing`` flag governs the block: the block itself for
            layer-flag models, the stack for stack-flag models.
    """

    index: int
    name: str
    module: nn.Module
    owner: nn.Module

    @property
    def layer_flag(self) -> bool:
        return self.owner is self.module


def _is_inside(name: str, prefixes: list[str]) -> bool:
    return any(name.startswith(prefix + ".") for prefix in prefixes)


def unwrapped(module: nn.Module) -> nn.Module:
    """The module inside FSDP1 units and checkpoint wrappers (``module`` itself when it wraps nothing).

    Such wrappers forward attribute reads to the module they wrap, so without this a wrapper around a
    ``GradientCheckpointingLayer`` would pass for a stack-flag block, and one around a block for a stack.
    """
    while True:
        children = child_modules(module)
        inner = next(
            (children[name] for name in _WRAPPED_ATTRIBUTES if isinstance(children.get(name), nn.Module)),
            None,
        )
        if inner is None:
            return module
        module = inner


def _stack_block_list(stack: nn.Module) -> nn.ModuleList | None:
    """The ``ModuleList`` of repeated blocks a stack iterates over: its largest direct ``ModuleList`` child,
    else the largest one below it; none where a direct one holds layer-flag blocks. Of lists as long as each other
    the one with more parameters: a stack that keeps a norm per block beside its blocks (CLVP's conditioning
    encoder: ``group_norms`` and ``mel_attn_blocks``) iterates over both, and the blocks are the heavier."""
    direct = [child for child in stack.children() if isinstance(child, nn.ModuleList) and len(child) > 0]
    if any(is_gradient_checkpointing_layer(unwrapped(block)) for child in direct for block in child
           if block is not None):
        return None  # its blocks flag themselves; another list (MusicGen's per-codebook embeddings) is no stack
    candidates = direct or [m for m in stack.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return max(candidates, key=lambda blocks: (len(blocks), sum(p.numel() for p in blocks.parameters())), default=None)


def find_blocks(model: nn.Module) -> list[Block]:
    """All repeated per-layer blocks of ``model``, in global order."""
    modules = list(model.named_modules())
    layer_names = [
        name for name, module in modules if is_gradient_checkpointing_layer(module)
    ]
    outermost_layers = {name for name in layer_names if not _is_inside(name, layer_names)}

    owner_of: dict[int, nn.Module] = {}
    for name, module in modules:
        if name in outermost_layers:
            owner_of[id(module)] = module
    for name, module in modules:
        if not hasattr(module, "gradient_checkpointing") or is_gradient_checkpointing_layer(module):
            continue
        if unwrapped(module) is not module:
            continue  # a wrapper, not a stack: its flag is the wrapped module's
        if _is_inside(name, sorted(outermost_layers)):
            continue
        block_list = _stack_block_list(module)
        if block_list is None:
            continue
        for block in block_list:
            if block is None:
                continue  # a list padded with None (Informer's encoder: one distilling conv fewer than layers)
            inner = unwrapped(block)
            if id(inner) not in owner_of and not is_gradient_checkpointing_layer(inner):
                owner_of[id(block)] = module

    blocks: list[Block] = []
    for name, module in modules:
        owner = owner_of.get(id(module))
        if owner is not None and owner is not module and any(_is_inside(layer, [name]) for layer in outermost_layers):
            continue  # a stack's element holding layer-flag blocks (GroupViT's stages): those are the blocks
        if owner is not None and not _is_inside(name, [b.name for b in blocks]):
            blocks.append(Block(index=len(blocks), name=name, module=module, owner=owner))
    return blocks or _declared_blocks(model, modules)


def _declared_blocks(model: nn.Module, modules: list[tuple[str, nn.Module]]) -> list[Block]:
    """The blocks of a model that declares ``supports_gradient_checkpointing`` but has no flag anywhere: its stack's
    list, at least two blocks long, owned by the model (see the module docstring)."""
    if getattr(model, "supports_gradient_checkpointing", False) is not True or any(
            hasattr(module, "gradient_checkpointing") for _, module in modules):
        return []
    block_list = _stack_block_list(model)
    if block_list is None or len(block_list) < 2:
        return []
    members = {id(block) for block in block_list}
    named = [(name, module) for name, module in modules if id(module) in members]
    return [Block(index=i, name=name, module=module, owner=model) for i, (name, module) in enumerate(named)]


def module_of(function: Callable[..., Any]) -> nn.Module | None:
    """The module a stack handed to its checkpoint function, or None when it cannot be told.

    Stacks pass ``layer.__call__`` or ``layer.forward`` (bound methods), ``partial(forward, layer, ...)``
    (transformers >= 5.23), a closure over the layer (``create_custom_forward(layer)`` in remote code), or the
    layer itself (``torch.distributed``'s ``CheckpointWrapper``, so ``hf_ckpt.distributed.apply``).
    """
    if isinstance(function, nn.Module):
        return function
    while isinstance(function, functools.partial):
        for argument in function.args:
            if isinstance(argument, nn.Module):
                return argument
        function = function.func
    owner = getattr(function, "__self__", None)
    if isinstance(owner, nn.Module):
        return owner
    for cell in getattr(function, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(contents, nn.Module):
            return contents
    return None
