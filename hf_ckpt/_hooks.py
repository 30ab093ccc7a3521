"""The two forward hooks hf_ckpt may add to a model, and nothing else.

* Input grads: with reentrant checkpointing, or with frozen embeddings under PEFT adapters, the hidden states
  entering the first checkpointed block must require grad, or the adapters get no gradient ("element 0 of
  tensors does not require grad"). A hook on the input embeddings marks their output.
* ``use_cache``: a cache cannot be built while blocks are recomputed. In training forward passes (module in
  training mode, grad enabled) the hook passes ``use_cache=False``, warning once per model.

Both are module-level functions bound with ``functools.partial`` so a model with hooks still pickles.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ._warnings import warn_once


def _mark_output_requires_grad(module: nn.Module, inputs: Any, output: Any) -> None:
    if isinstance(output, torch.Tensor) and output.is_floating_point() and not output.requires_grad:
        output.requires_grad_(True)


def add_input_grads_hook(model: nn.Module) -> RemovableHandle | None:
    """Make the input embeddings' output require grad; None when the model has no input embeddings."""
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if not isinstance(embeddings, nn.Module):
        return None
    return embeddings.register_forward_hook(_mark_output_requires_grad)


def _turn_off_use_cache(owner: nn.Module, module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
    if not (module.training and torch.is_grad_enabled()):
        return None
    requested = kwargs.get("use_cache")
    if requested is None:
        config = getattr(module, "config", None) or getattr(owner, "config", None)
        requested = getattr(config, "use_cache", False)
    if not requested:
        return None
    warn_once(
        f"use_cache=True is incompatible with activation checkpointing in training: hf_ckpt passes use_cache=False "
        f"to {type(owner).__name__} in training steps (evaluation and generation keep the cache).",
        key="use_cache",
        owner=owner,
        stacklevel=4,
    )
    kwargs["use_cache"] = False
    return args, kwargs


def add_use_cache_hooks(model: nn.Module, skip: list[nn.Module]) -> list[RemovableHandle]:
    """Hook every module whose ``forward`` takes ``use_cache``, except ``skip`` (the blocks) and their insides.

    Several levels are hooked (``LlamaForCausalLM`` and ``LlamaModel``) because PEFT calls the inner
    ``forward`` directly, bypassing the outer module's hooks.
    """
    skipped = {id(m) for block in skip for m in block.modules()}
    handles = []
    for module in model.modules():
        if id(module) in skipped:
            continue
        try:
            parameters = inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            continue
        if "use_cache" in parameters:
            hook = functools.partial(_turn_off_use_cache, model)
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return handles
