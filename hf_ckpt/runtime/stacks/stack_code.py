"""What a stack's own code can call to checkpoint its blocks, read from its compiled code.

A stack (the module holding a ``gradient_checkpointing`` flag and looping over blocks) checkpoints a block in one of
three ways, told apart by the names its own methods use (nested functions and the functions behind decorators
included; ``object``'s, torch's and transformers' shared methods left out):

* through ``self._gradient_checkpointing_func``: hf_ckpt binds a function there that checkpoints the selected
  blocks and runs the others directly (the usual loop);
* through ``torch.utils.checkpoint.checkpoint`` named in its own code and never through that function
  (:func:`hard_codes_checkpoint`: CLVP's encoders and decoder before transformers 5.16): with its flag on it
  checkpoints **every** block with torch's default arguments, whatever was selected;
* not at all (:func:`never_checkpoints`: a flag its loop never reads, or one a model only declares).

In the last two cases hf_ckpt checkpoints the selected blocks itself by wrapping them (:mod:`hf_ckpt.runtime.stacks.direct`);
for a stack that hard-codes torch's checkpoint it also leaves the stack's own flag off (:mod:`hf_ckpt.runtime.binding`),
so that its loop calls every block plainly.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Iterator

#: The name of a stack's bound checkpoint function, and of torch's checkpoint function.
BOUND_NAME, TORCH_NAME = "_gradient_checkpointing_func", "checkpoint"


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
def checkpoint_names(stack_class: type) -> frozenset[str]:
    """Which of :data:`BOUND_NAME` and :data:`TORCH_NAME` the own methods of ``stack_class`` (and of its
    model-specific bases) use."""
    found: set[str] = set()
    for klass in stack_class.__mro__:
        if _generic(klass):
            continue
        for value in vars(klass).values():
            if _generic(getattr(value, "__func__", value)):
                continue  # a shared method assigned in the class body (``_set_gradient_checkpointing = ...``)
            for code in _codes(value):
                found |= {BOUND_NAME, TORCH_NAME} & _names(code)
    return frozenset(found)


def never_calls_bound_function(stack_class: type) -> bool:
    """Whether no own method of ``stack_class`` names its bound ``_gradient_checkpointing_func``: the stacks whose
    blocks hf_ckpt may wrap (:func:`never_checkpoints` and :func:`hard_codes_checkpoint` together)."""
    return BOUND_NAME not in checkpoint_names(stack_class)


def never_checkpoints(stack_class: type) -> bool:
    """Whether no own method of ``stack_class`` names a checkpoint function."""
    return not checkpoint_names(stack_class)


def hard_codes_checkpoint(stack_class: type) -> bool:
    """Whether ``stack_class``'s own code calls torch's ``checkpoint`` by name and never its bound
    ``_gradient_checkpointing_func``: with its flag on, its loop would checkpoint every block itself."""
    return checkpoint_names(stack_class) == {TORCH_NAME}
