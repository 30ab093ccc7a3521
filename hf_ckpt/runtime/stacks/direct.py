"""Blocks whose stack calls them directly, checkpointed by hf_ckpt itself.

Some models keep a ``gradient_checkpointing`` flag on a stack (or inherit ``supports_gradient_checkpointing``) but
their loop calls the blocks directly and never hands them to a checkpoint function: Mllama's vision encoder,
HGNetV2's encoder (PP-OCRv5 server recognition), PP-LCNetV4's encoder (PP-OCRv6 small recognition), CLVP's
encoders from transformers 5.16. Setting their flags changes nothing; the first-step probe used to measure that no
block was recomputed. Others call ``torch.utils.checkpoint.checkpoint`` by name in their loop instead of their
bound ``_gradient_checkpointing_func`` (CLVP's encoders and decoder before 5.16): with the flag on they checkpoint
every block, with torch's default arguments, whatever was selected.

There, hf_ckpt does what torch's ``checkpoint_wrapper`` does: each block of such a stack gets an instance
``forward`` that runs the block's own ``forward`` under the block's checkpoint function, in training forwards with
grad (a stack that hard-codes torch's checkpoint keeps its own flag off: :mod:`hf_ckpt.runtime.binding`). It reads the
flags at every call (:func:`hf_ckpt.runtime.functions.stack_checkpoints` and the block's ``_hf_ckpt_selected``), so the
no-grad hooks, a suspended setting, upstream's ``gradient_checkpointing_disable`` and an unselected block all run
the block plainly; :func:`install` records an undo that puts the block's ``forward`` back, or, where another
library wrapped it since, leaves that wrapper in place (:mod:`hf_ckpt.runtime.stacks.wrapping`).

**Which stacks** (:mod:`hf_ckpt.runtime.stacks.stack_code`, read from the compiled code's names, not from source text): a stack
no method of which names ``_gradient_checkpointing_func`` or ``checkpoint``, and a stack that names torch's
``checkpoint`` but never its bound function. Every module between the stack and the block must never checkpoint,
so wrapping cannot checkpoint a block twice. Whether it worked is then measured as for every model: the first-step
probe counts the blocks backward reran, and :func:`hf_ckpt.checkpointed_layers` reports that.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn

from hf_ckpt.runtime.stacks.stack_code import hard_codes_checkpoint, never_checkpoints
from hf_ckpt.runtime.blocks import SELECTED_ATTRIBUTE, Block
from hf_ckpt.runtime.counting import in_backward
from hf_ckpt.runtime.functions import stack_checkpoints
from hf_ckpt.runtime.stacks.wrapping import wrap_forward


def _runs_unchecked(owner: nn.Module, names: dict[int, str], module: nn.Module) -> bool:
    """Whether no module from ``owner`` down to ``module``'s parent (the code that runs the block) checkpoints; the
    flag holder itself may hard-code torch's checkpoint (its flag stays off, so that code never runs)."""
    current = owner
    for part in names.get(id(module), "").split(".")[:-1]:
        if not _unchecked(owner, current):
            return False
        current = getattr(current, part)
    return _unchecked(owner, current)


def _unchecked(owner: nn.Module, module: nn.Module) -> bool:
    return never_checkpoints(type(module)) or (module is owner and hard_codes_checkpoint(type(owner)))


def directly_called(blocks: tuple[Block, ...]) -> list[Block]:
    """The stack-flag blocks among ``blocks`` that nothing between their flag holder and them ever checkpoints.

    The flag holder is not always the module whose loop runs the blocks: Fuyu's flag sits on the top model, its
    Persimmon language model's loop checkpoints the blocks; SEW-D's on ``SEWDEncoder``, whose nested DeBERTa-style
    encoder checkpoints them. Every module on the way from the holder to the block must never checkpoint, or
    wrapping would checkpoint a block twice."""
    names: dict[int, dict[int, str]] = {}
    for block in blocks:
        if not block.layer_flag and id(block.owner) not in names:
            names[id(block.owner)] = {id(module): name for name, module in block.owner.named_modules()}
    return [block for block in blocks if not block.layer_flag
            and _runs_unchecked(block.owner, names[id(block.owner)], block.module)]


def _checkpointed_forward(owner: nn.Module, module: nn.Module, forward: Any, *args: Any, **kwargs: Any) -> Any:
    """A directly called block's ``forward``: under its checkpoint function when the flags select it in a training
    forward with grad; as it was otherwise (and while backward recomputes it)."""
    choice = getattr(module, SELECTED_ATTRIBUTE, None)
    if (not callable(choice) or not stack_checkpoints(owner) or not module.training
            or not torch.is_grad_enabled() or in_backward()):
        return forward(*args, **kwargs)
    if kwargs and getattr(choice, "keywords", {}).get("use_reentrant"):  # reentrant checkpoint takes no keywords
        return _reentrant(choice, forward, args, kwargs)
    return choice(forward, *args, **kwargs)


def _reentrant(choice: Any, forward: Any, args: tuple, kwargs: dict) -> Any:
    """A call with keywords under reentrant checkpointing: passed by position where the signature allows; a
    keyword-only tensor that needs a gradient would get none, so that call runs plainly (the probe reports it)."""
    try:
        bound = inspect.signature(forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return forward(*args, **kwargs)
    bound.apply_defaults()
    if any(isinstance(value, torch.Tensor) and value.requires_grad for value in bound.kwargs.values()):
        return forward(*args, **kwargs)
    return choice(functools.partial(forward, **bound.kwargs), *bound.args)


def install(state: Any, blocks: tuple[Block, ...]) -> list[int]:
    """Wrap the ``forward`` of every directly called block in ``blocks`` (:func:`hf_ckpt.runtime.stacks.wrapping.wrap_forward`:
    its undo, in ``state.undo``, never removes a wrapper another library put on since). Returns the indices of the
    wrapped blocks."""
    wrapped = []
    for block in directly_called(blocks):
        state.undo.append(wrap_forward(block.module, functools.partial(_checkpointed_forward, block.owner, block.module)))
        wrapped.append(block.index)
    return wrapped
