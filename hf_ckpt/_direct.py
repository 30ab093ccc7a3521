"""Blocks whose stack calls them directly, checkpointed by hf_ckpt itself.

Some models keep a ``gradient_checkpointing`` flag on a stack (or inherit ``supports_gradient_checkpointing``) but
their loop calls the blocks directly and never hands them to a checkpoint function: CLVP's text and speech
encoders, Mllama's vision encoder, HGNetV2's encoder (PP-OCRv5 server recognition), PP-LCNetV4's encoder
(PP-OCRv6 small recognition). Setting their flags changes nothing; the first-step probe used to measure that no
block was recomputed.

There, hf_ckpt does what torch's ``checkpoint_wrapper`` does: each block of such a stack gets an instance
``forward`` that runs the block's own ``forward`` under the block's checkpoint function, in training forwards with
grad. It reads the flags at every call (:func:`hf_ckpt._binding.block_function`'s attributes: the stack's
``gradient_checkpointing`` and the block's ``_hf_ckpt_selected``), so the no-grad hooks, a suspended setting and an
unselected block all run the block plainly; :func:`install` records an undo that puts the block's ``forward`` back.

**Which stacks.** A stack qualifies when no method of its class (nor of its model-specific bases; nested
functions and the functions behind decorators included) names ``_gradient_checkpointing_func`` or ``checkpoint``:
read from the compiled code's names, not from source text. Such a stack has no way to checkpoint a block, so
wrapping cannot checkpoint one twice. Whether it worked is then measured as for every model: the first-step probe
counts the blocks backward reran, and :func:`hf_ckpt.checkpointed_layers` reports that.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Iterator

import torch
from torch import nn

from .blocks import SELECTED_ATTRIBUTE, Block
from .counting import in_backward

#: Names whose presence in a stack's code means it can checkpoint its blocks itself.
CHECKPOINT_NAMES = frozenset({"_gradient_checkpointing_func", "checkpoint"})



def _generic(owner: Any) -> bool:
    """A base or method that is not the stack's own loop: ``object``'s, torch's, transformers' shared ones
    (``PreTrainedModel`` and its mixins, which set ``_gradient_checkpointing_func`` on every module)."""
    name = getattr(owner, "__module__", None) or ""
    return owner is object or name in ("builtins", "torch") or name.startswith("torch.") or (
        name.startswith("transformers.") and not name.startswith("transformers.models."))


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names ``code`` and the code nested in it use."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


def _codes(function: Any) -> Iterator[types.CodeType]:
    """The code of ``function`` and of every function it wraps (``__wrapped__``, closures of decorators)."""
    seen: set[int] = set()
    pending = [getattr(function, "__func__", function)]
    while pending:
        current = pending.pop()
        code = getattr(current, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        yield code
        wrapped = getattr(current, "__wrapped__", None)
        if wrapped is not None:
            pending.append(wrapped)
        for cell in getattr(current, "__closure__", None) or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if inspect.isfunction(contents):
                pending.append(contents)


@functools.lru_cache(maxsize=None)
def never_checkpoints(stack_class: type) -> bool:
    """Whether no own method of ``stack_class`` names a checkpoint function (see the module docstring)."""
    for klass in stack_class.__mro__:
        if _generic(klass):
            continue
        for value in vars(klass).values():
            if _generic(getattr(value, "__func__", value)):
                continue  # a shared method assigned in the class body (``_set_gradient_checkpointing = ...``)
            if any(CHECKPOINT_NAMES & _names(code) for code in _codes(value)):
                return False
    return True


def _runs_unchecked(owner: nn.Module, names: dict[int, str], module: nn.Module) -> bool:
    """Whether no module from ``owner`` down to ``module``'s parent (the code that runs the block) checkpoints."""
    current = owner
    for part in names.get(id(module), "").split(".")[:-1]:
        if not never_checkpoints(type(current)):
            return False
        current = getattr(current, part)
    return never_checkpoints(type(current))


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
    if (not callable(choice) or not getattr(owner, "gradient_checkpointing", False) or not module.training
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


def _restore_forward(module: nn.Module, previous: Any) -> None:
    if previous is None:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = previous


def install(state: Any, blocks: tuple[Block, ...]) -> list[int]:
    """Wrap the ``forward`` of every directly called block in ``blocks``; recorded in ``state.undo``. Returns
    the indices of the wrapped blocks."""
    wrapped = []
    for block in directly_called(blocks):
        module = block.module
        previous = module.__dict__.get("forward")
        module.forward = functools.partial(_checkpointed_forward, block.owner, module, module.forward)
        state.undo.append(functools.partial(_restore_forward, module, previous))
        wrapped.append(block.index)
    return wrapped
