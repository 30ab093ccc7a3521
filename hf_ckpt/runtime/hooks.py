"""The forward hooks hf_ckpt may add to a model, and nothing else.

* **Input grads.** With reentrant checkpointing, or with frozen embeddings under PEFT adapters, the hidden states
  entering the first checkpointed block must require grad, or the adapters get no gradient ("element 0 of
  tensors does not require grad"). As upstream's ``enable_input_require_grads`` does, a hook marks the output of
  the input embeddings of *every* ``PreTrainedModel`` inside the model: the language model and each tower of a
  multimodal model (a vision tower's LoRA weights need it as much as the text model's).
* **use_cache.** A cache cannot be built while blocks are recomputed. In training forward passes (module in
  training mode, grad enabled) the hook passes ``use_cache=False``. It warns once, at the user's line, only when
  the *caller* asked for ``use_cache=True``; the config's default is not a request, and models without a cache
  (encoder-only BERT) never warn.
* **No grad, no checkpointing.** Under ``torch.no_grad``/``inference_mode`` there is nothing to recompute, so a
  forward (``generate`` in training mode included) must run exactly as without checkpointing. Models read their
  checkpointing flag to drop the cache; a pre-hook on each stack turns its flags off for such forwards and a
  forward hook turns them back on.

Every hook is a module-level function bound with ``functools.partial``, so a model with hooks still pickles.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn

from hf_ckpt.runtime.binding import Binding
from hf_ckpt.runtime.util.compat import has_peft_adapters
from hf_ckpt.runtime.probe import RecomputeProbe
from hf_ckpt.runtime.state import STATE_ATTRIBUTE, CheckpointState, Hooks, clear_state, warn_stale
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.runtime.blocks import Block


def _mark_output_requires_grad(module: nn.Module, inputs: Any, output: Any) -> None:
    if isinstance(output, torch.Tensor) and output.is_floating_point() and not output.requires_grad:
        output.requires_grad_(True)


def input_embeddings(model: nn.Module) -> list[nn.Module]:
    """The input embeddings of every ``PreTrainedModel`` in ``model`` (each once), outermost first."""
    from transformers import PreTrainedModel

    found: dict[int, nn.Module] = {}
    for module in model.modules():
        if not isinstance(module, PreTrainedModel):
            continue
        try:
            embeddings = module.get_input_embeddings()
        except (AttributeError, NotImplementedError):
            continue
        if isinstance(embeddings, nn.Module):
            found.setdefault(id(embeddings), embeddings)
    return list(found.values())


def add_input_grads_hooks(hooks: Hooks, model: nn.Module) -> int:
    """Make the output of every input embedding in ``model`` require grad; returns how many were hooked."""
    embeddings = input_embeddings(model)
    for module in embeddings:
        hooks.add(module, "register_forward_hook", _mark_output_requires_grad)
    return len(embeddings)


def _turn_off_use_cache(owner: nn.Module, module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
    if not (module.training and torch.is_grad_enabled()):
        return None
    requested = kwargs.get("use_cache")
    if requested:
        warn_once(
            f"use_cache=True cannot take effect in a training step with activation checkpointing: hf_ckpt passes "
            f"use_cache=False to {type(owner).__name__} in training forward passes with grad enabled (evaluation, "
            "generation and torch.no_grad forwards keep the cache).",
            key="use_cache",
            owner=owner,
        )
    elif requested is None:
        config = getattr(module, "config", None) or getattr(owner, "config", None)
        if not getattr(config, "use_cache", False):
            return None
    else:
        return None
    kwargs["use_cache"] = False
    return args, kwargs


def add_use_cache_hooks(hooks: Hooks, model: nn.Module, blocks: tuple[Block, ...]) -> None:
    """Hook every module whose ``forward`` takes ``use_cache``, except the blocks and their insides.

    Several levels are hooked (``LlamaForCausalLM`` and ``LlamaModel``) because PEFT calls the inner
    ``forward`` directly, bypassing the outer module's hooks.
    """
    skipped = {id(m) for block in blocks for m in block.module.modules()}
    for module in model.modules():
        if id(module) in skipped:
            continue
        try:
            parameters = inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            continue
        if "use_cache" in parameters:
            hooks.add(module, "register_forward_pre_hook", functools.partial(_turn_off_use_cache, model), with_kwargs=True)


def _flags_off(state: CheckpointState, flagged: tuple[nn.Module, ...], saved: list, module: nn.Module,
               args: Any) -> None:
    if torch.is_grad_enabled():
        return
    saved.append([m.__dict__.get("gradient_checkpointing") for m in flagged])
    state.lend(flagged)  # off for this forward by hf_ckpt's own doing: the record stays current
    for m in flagged:
        m.__dict__["gradient_checkpointing"] = False


def _flags_back(state: CheckpointState, flagged: tuple[nn.Module, ...], saved: list, module: nn.Module, args: Any,
                output: Any) -> None:
    if torch.is_grad_enabled() or not saved:
        return
    for m, value in zip(flagged, saved.pop()):
        if value is None:
            m.__dict__.pop("gradient_checkpointing", None)
        else:
            m.__dict__["gradient_checkpointing"] = value
    state.take_back_lent(flagged)


def stacks_of(blocks: tuple[Block, ...]) -> list[nn.Module]:
    """The modules that run the blocks: each stack-flag owner, and the parent of each block list."""
    stacks: dict[int, nn.Module] = {}
    for block in blocks:
        if not block.layer_flag:
            stacks.setdefault(id(block.owner), block.owner)
    return list(stacks.values())


def add_no_grad_hooks(state: CheckpointState, model: nn.Module, blocks: tuple[Block, ...]) -> None:
    """Under ``torch.no_grad``, run every stack (and the model's top level) with its checkpointing flags off, lent
    by ``state`` (:meth:`~hf_ckpt.runtime.state.CheckpointState.lend`) and put back when the forward ends."""
    hooks = state.hooks
    flagged = tuple(m for m in model.modules() if m.__dict__.get("gradient_checkpointing") is True)
    if not flagged:
        return
    parents = [model] + stacks_of(blocks) + _block_list_parents(model, blocks)
    seen: set[int] = set()
    for parent in parents:
        if id(parent) in seen:
            continue
        seen.add(id(parent))
        inside = {id(m) for m in parent.modules()}
        mine = tuple(m for m in flagged if id(m) in inside)
        saved: list = []
        hooks.add(parent, "register_forward_pre_hook", functools.partial(_flags_off, state, mine, saved))
        hooks.add(parent, "register_forward_hook", functools.partial(_flags_back, state, mine, saved), always_call=True)


def _block_list_parents(model: nn.Module, blocks: tuple[Block, ...]) -> list[nn.Module]:
    """The module holding each ``ModuleList`` of blocks (``LlamaModel`` for ``model.layers``)."""
    block_ids = {id(block.module) for block in blocks}
    parents = []
    for module in model.modules():
        for child in module.children():
            if isinstance(child, nn.ModuleList) and any(id(b) in block_ids for b in child):
                parents.append(module)
                break
    return parents


def _drop_if_stale(state: CheckpointState, target: nn.Module, module: nn.Module, args: Any) -> None:
    """The last of the record's pre-hooks: a record changed behind hf_ckpt's back (upstream's disable without the
    patch) is dropped, with one warning naming the change, before the forward runs, so none of its hooks acts on a
    setting that is gone (the record's earlier pre-hooks see it stale and stand aside). Last, because torch looks up
    the pre-hooks after it by their handles, which dropping removes. hf_ckpt's own changes (flags lent to a no-grad
    forward) never make it stale."""
    if target.__dict__.get(STATE_ATTRIBUTE) is state and not state.is_current():
        warn_stale(target, state)
        clear_state(target)


def add_stale_check(state: CheckpointState, target: nn.Module) -> None:
    """:func:`_drop_if_stale` on ``target``, after the record's other pre-hooks."""
    state.hooks.add(target, "register_forward_pre_hook", functools.partial(_drop_if_stale, state, target))


def _went_stale(state: CheckpointState, target: nn.Module) -> bool:
    """Whether the setting the probe measured was changed behind hf_ckpt's back (upstream's enable/disable between
    the setting and its first step, as TRL's GRPO does around generation); one warning says what changed."""
    if state.is_current():
        return False
    warn_stale(target, state)
    return True


def _record_measurement(state: CheckpointState, blocks: tuple[int, ...]) -> None:
    state.measured = blocks
    state.hooks.discard("probe")
    # A finished probe's cancel does nothing: it leaves the record too, so nothing of the probe outlives its step.
    state.undo[:] = [action for action in state.undo if not _finished_probe(action)]


def _finished_probe(action: Any) -> bool:
    probe = getattr(action, "__self__", None)
    return isinstance(probe, RecomputeProbe) and probe.done


def add_probe(state: CheckpointState, target: nn.Module, binding: Binding) -> None:
    """Measure the blocks the first training step recomputes (:mod:`hf_ckpt.runtime.probe`), into ``state.measured``.

    Once it has measured, its hooks are removed and its ``cancel`` leaves ``state.undo``: a later step runs none of
    it."""
    probe = RecomputeProbe(
        target, binding.blocks, binding.selected, binding.config.describe(),
        functools.partial(_record_measurement, state), functools.partial(_went_stale, state, target),
    )
    probe.watch(functools.partial(_add_to_group, state.hooks, "probe"))
    state.undo.append(probe.cancel)  # a setting taken back mid-step must not report on a step it did not see


def _add_to_group(hooks: Hooks, group: str, module: nn.Module, register: str, function: Any) -> None:
    hooks.add(module, register, function, group=group)


def add_checkpointing_hooks(
    state: CheckpointState, target: nn.Module, binding: Binding, *, needs_input_grads: bool
) -> None:
    """Every hook a checkpointed model needs, recorded in ``state``: input grads where the recompute needs them
    (reentrant checkpointing, a custom ``checkpoint_fn``, a wrapper such as PEFT or DDP around the model, adapters
    inside it), ``use_cache``
    off in training steps, checkpointing off under ``no_grad``, and the first-step probe."""
    config = binding.config
    if needs_input_grads or config.use_reentrant or config.checkpoint_fn is not None or has_peft_adapters(target):
        add_input_grads_hooks(state.hooks, target)
    add_use_cache_hooks(state.hooks, target, binding.blocks)
    add_no_grad_hooks(state, target, binding.blocks)
    add_probe(state, target, binding)
