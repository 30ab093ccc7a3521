"""The checkpoint functions hf_ckpt binds to a model's ``_gradient_checkpointing_func``.

* Layer-flag blocks get ``functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=..., **kwargs)``
  (or its offloading twin), exactly like upstream, so nothing changes in how a block runs.
* Stacks get :func:`checkpoint_selected_blocks` in front of the same partial: a stack calls its one function
  for every block, so the function itself looks at which block it was handed and runs unselected blocks
  directly. That is how ``every_n_layers`` works on stack-flag models, which upstream ignores.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_ckpt.runtime.blocks import SELECTED_ATTRIBUTE, module_of
from hf_ckpt.runtime.config import CheckpointConfig, checkpoint_fn_keywords
from hf_ckpt.runtime.offload import OverlappedOffload
from hf_ckpt.runtime.kinds import Strategy


def offloaded_checkpoint(
    function: Callable[..., Any], *args: Any, offloader: OverlappedOffload, **kwargs: Any
) -> Any:
    """``torch.utils.checkpoint.checkpoint`` whose saved inputs are kept in host memory.

    The inputs that checkpointing keeps for the recompute (and nothing else: the block's own activations are not
    saved at all) go to host memory through ``offloader`` (an :class:`~hf_ckpt.runtime.offload.OverlappedOffload`), whose
    copies run on side streams, and come back, prefetched, when backward recomputes the block.
    """
    with offloader:
        return checkpoint(function, *args, **kwargs)


def checkpoint_selected_blocks(
    checkpoint_function: Callable[..., Any], function: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Checkpoint ``function`` as its block's ``_hf_ckpt_selected`` attribute says.

    The attribute is False for a block to run directly, or the block's own checkpoint function (a selective
    block's differs from a full one's). The block is the one ``function`` is bound to or closes over, else the
    first argument that is a block (IDEFICS hands a nested ``vblock(decoder_layer, ...)`` the layer as its first
    argument). A function whose block cannot be told is checkpointed with ``checkpoint_function`` (the stack's flag
    asked for it).
    """
    module = module_of(function)
    choice = getattr(module, SELECTED_ATTRIBUTE, None) if module is not None else None
    if choice is None:
        choice = next((getattr(argument, SELECTED_ATTRIBUTE) for argument in args
                       if isinstance(argument, nn.Module) and hasattr(argument, SELECTED_ATTRIBUTE)), None)
    if choice is False:
        return function(*args, **kwargs)
    if callable(choice):
        return choice(function, *args, **kwargs)
    return checkpoint_function(function, *args, **kwargs)


def with_block_selection(checkpoint_function: Callable[..., Any]) -> functools.partial:
    """The function to bind to a stack: ``checkpoint_function`` behind :func:`checkpoint_selected_blocks`."""
    return functools.partial(checkpoint_selected_blocks, checkpoint_function)


def stack_checkpoints(stack: Any) -> bool:
    """Whether the blocks of ``stack`` are checkpointed: its flag is on, or hf_ckpt's selecting function is bound
    to it with the flag left off (a stack whose loop hard-codes torch's checkpoint, ``hf_ckpt.runtime.stacks.stack_code``: hf_ckpt
    wraps its selected blocks instead). Upstream's enable and disable both rebind the function, which ends the
    second case."""
    if getattr(stack, "gradient_checkpointing", False):
        return True
    bound = getattr(stack, "_gradient_checkpointing_func", None)
    return getattr(bound, "func", None) is checkpoint_selected_blocks


def build_checkpoint_function(
    checkpoint_kwargs: dict[str, Any], *, offloader: OverlappedOffload | None = None, checkpoint_fn: Any = None
) -> functools.partial:
    """``partial(checkpoint, **checkpoint_kwargs)``, or its offloading twin when an ``offloader`` is given, or
    ``partial(checkpoint_fn, **the checkpoint_kwargs it names)`` for a custom checkpoint function."""
    if checkpoint_fn is not None:
        accepted = checkpoint_fn_keywords(checkpoint_fn)
        return functools.partial(checkpoint_fn, **{k: v for k, v in checkpoint_kwargs.items() if k in accepted})
    if offloader is None:
        return functools.partial(checkpoint, **checkpoint_kwargs)
    return functools.partial(offloaded_checkpoint, offloader=offloader, **checkpoint_kwargs)


def build_block_functions(
    strategies: dict[int, Strategy], config: CheckpointConfig, *, offloader: OverlappedOffload | None
) -> dict[int, Any]:
    """One checkpoint function per checkpointed block; blocks of the same strategy share one.

    Each strategy builds its own (:meth:`~hf_ckpt.strategies.Strategy.checkpoint_function`), with offload and
    ``checkpoint_fn`` as the modifiers around ``torch.utils.checkpoint.checkpoint``.
    """

    def wrap(kwargs: dict[str, Any]) -> functools.partial:
        return build_checkpoint_function(kwargs, offloader=offloader, checkpoint_fn=config.checkpoint_fn)

    by_strategy = {
        strategy: strategy.checkpoint_function(config, config.checkpoint_kwargs, wrap)
        for strategy in set(strategies.values())
    }
    return {index: by_strategy[strategy] for index, strategy in strategies.items()}
