"""``estimate`` and ``plan_for``: trace the reduced model once, scale to the full depth, compose strategies."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import nn

from hf_ckpt.runtime import head as _head
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.strategies import kind_class
from hf_ckpt.estimate import _arguments as arguments
from hf_ckpt.estimate._attention import attention_model
from hf_ckpt.estimate._model import (
    blocks_of,
    build_on_meta,
    load_config,
    map_blocks,
    model_class,
    reduced_config,
)
from hf_ckpt.estimate._result import MemoryEstimate
from hf_ckpt.estimate._sharding import check_sharding, shard_estimate
from hf_ckpt.estimate._trace import TRACED, Trace, fake_mode, to_fake, trace

#: The row of every block checkpointed whole: the chunked head's row (``full+head:<chunk>``) builds on it.
EVERY_BLOCK_ROW = "full"
#: The prefixes of the rows that are no kind: every n-th block full, every block full with the head in chunks.
EVERY_N_ROW, CHUNKED_HEAD_ROW = "every_n:", f"{EVERY_BLOCK_ROW}+head:"
DEFAULT_STRATEGIES = ("none", EVERY_BLOCK_ROW, "every_n:2", "selective")

_NOTES = (
    "activations: bytes of tensor storages alive when forward returns, traced on fake tensors (allocator "
    "rounding and fragmentation not included)",
    "batches without padding mask (causal attention via is_causal); labels of seq_len tokens",
    "peak: fixed states + activations + the largest transient of the step; gradients counted whole "
    "throughout backward; optimizer-step temporaries (foreach buffers) not included",
)
#: What is held into backward besides the activations, by ``keep_outputs``: the note each estimate carries.
OUTPUTS_NOTES = {
    False: "outputs: dropped once the loss is computed, as the Trainer's step does (only the loss is held into "
    "backward); a loop that keeps `outputs = model(**batch)` through backward holds more: keep_outputs=True",
    True: "outputs: kept through backward, as a loop holding `outputs = model(**batch)` does (logits and all the "
    "output object holds, in their dtype, counted with the activations)",
}


def _source(model_or_config: Any, dtype: torch.dtype) -> tuple[Any, type, nn.Module | None, Any]:
    """(config, model class, full meta model or None, peft config found on a PEFT model)."""
    from transformers import PretrainedConfig

    if isinstance(model_or_config, nn.Module):
        model, peft = model_or_config, None
        if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
            configs = model.peft_config
            peft = configs.get(getattr(model, "active_adapter", "default")) or next(iter(configs.values()))
            model = model.get_base_model()
        config = getattr(model, "config", None)
        if config is None:
            raise ValueError("model_or_config: the model has no .config (a transformers PreTrainedModel is needed)")
        return config, type(model), model, peft
    config = model_or_config if isinstance(model_or_config, PretrainedConfig) else load_config(model_or_config)
    return config, model_class(config), None, None


def _with_peft(model: nn.Module, peft_config: Any) -> nn.Module:
    if peft_config is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, copy.deepcopy(peft_config))


def _inputs(model: nn.Module, batch_size: int, seq_len: int, mode: Any) -> dict[str, torch.Tensor]:
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    with mode:
        ids = torch.zeros((batch_size, seq_len), dtype=torch.long)
        if isinstance(vocab, int) and vocab > 0:
            ids = ids % vocab
    return {"input_ids": ids, "labels": ids}


def _traced_name(full_blocks: list, traced_blocks: list, representative: Sequence[int]):
    """Maps a parameter name of the full model to the name of its counterpart in the traced model."""
    prefixes = [(block.name + ".", traced_blocks[representative[i]].name + ".") for i, block in enumerate(full_blocks)]
    prefixes.sort(key=lambda pair: len(pair[0]), reverse=True)

    def rename(name: str) -> str:
        for full_prefix, traced_prefix in prefixes:
            if name.startswith(full_prefix) or f".{full_prefix}" in name:
                return name.replace(full_prefix, traced_prefix, 1)
        return name

    return rename


def row_options(row: str) -> dict[str, Any]:
    """The ``hf_ckpt.enable`` options that set a model up as the estimate's row ``row`` says ({} for ``none``)."""
    if row.startswith(EVERY_N_ROW):
        return {"every_n_layers": int(row.split(":", 1)[1])}
    if row.startswith(CHUNKED_HEAD_ROW):
        return {"head_chunk_size": int(row.split(":", 1)[1])}
    return {"strategy": row} if kind_class(row).recomputes else {}


def _per_block(strategy: Any, num_blocks: int) -> tuple[str, ...]:
    if isinstance(strategy, CheckpointPlan):
        strategy.check_fits(num_blocks)
        return strategy.strategies
    if strategy.startswith(EVERY_N_ROW):
        n = int(strategy.split(":", 1)[1])
        return tuple("full" if i % n == 0 else "none" for i in range(num_blocks))
    return (strategy,) * num_blocks


def retained_bytes(traced: Trace, representative: Sequence[int], per_block: Sequence[str]) -> int:
    """Bytes retained at the end of forward by the full model running ``per_block``: the base for its first
    block's strategy, plus each block's bytes given its own strategy and its neighbours'."""
    last = len(per_block) - 1
    total = traced.base_bytes[per_block[0]]
    full_of: dict[int, int] = {}  # a traced position -> the first full-model block it represents
    for i, traced_position in enumerate(representative):
        full_of.setdefault(traced_position, i)
    for i, strategy in enumerate(per_block):
        previous = per_block[i - 1] if i > 0 else None
        following = per_block[i + 1] if i < last else None
        head = traced.head_of(representative[i])
        head_strategy = per_block[full_of[head]] if head is not None and head in full_of else None
        total += traced.block_bytes(representative[i], previous, strategy, following, head_strategy)
    return total


def _bound(traced: Trace, representative: Sequence[int], i: int, strategy: str, usable: Sequence[str]) -> int:
    """Block ``i``'s bytes under ``strategy`` whatever its neighbours run (the largest): additive, for the solver."""
    return traced.largest(representative[i], strategy)


def _models(model_or_config: Any, torch_dtype: torch.dtype, peft_config: Any):
    """(config, class, the full model on meta, the reduced copy on meta), adapters added to both."""
    config, cls, full, found_peft = _source(model_or_config, torch_dtype)
    peft_config = peft_config if peft_config is not None else found_peft
    if full is None:
        full = build_on_meta(cls, config, torch_dtype)
    else:
        full = copy.deepcopy(full).to(dtype=torch_dtype).train()
        if hasattr(full, "tie_weights"):  # a model built on meta may not have tied its embeddings yet
            full.tie_weights()
    full = _with_peft(full, peft_config)
    reduced = _with_peft(build_on_meta(cls, reduced_config(config), torch_dtype), peft_config)
    return config, cls, full, reduced


def _per_strategy(traced: Trace, rep: Sequence[int], strategies: Sequence[Any], num_blocks: int,
                  block_flops: dict, none_flops: int, states: Any):
    """Activation, peak, recompute and step FLOPs and the FLOPs ratio of each strategy, and the unusable ones."""
    activation, peak, recompute, step, ratio = {}, {}, {}, {}, {}
    unusable = dict(traced.unusable)
    fixed, step_peak = states.peak_fixed_bytes, states.step_peak_bytes
    for strategy in dict.fromkeys(("none", *strategies)):
        name = arguments.strategy_name(strategy)
        per_block = _per_block(strategy, num_blocks)
        missing = [s for s in set(per_block) if s not in traced.strategies]
        if missing:
            unusable.setdefault(name, unusable.get(missing[0], f"{missing[0]} cannot run on this model"))
            continue
        activation[name] = retained_bytes(traced, rep, per_block)
        peak[name] = max(fixed + activation[name] + max(traced.transient[s] for s in set(per_block)), step_peak)
        recompute[name] = sum(block_flops[s][i] for i, s in enumerate(per_block))
        step[name] = none_flops + recompute[name]
        ratio[name] = step[name] / none_flops if none_flops else 1.0
    figures = activation, peak, recompute, step, ratio, unusable
    _with_chunked_head(traced, figures, fixed, step_peak)
    return figures


def head_chunk_for(tokens: int, hidden: int, vocab: int, seq_len: int | None = None) -> int:
    """The chunk (tokens) a chunked head is estimated with when none is given (:func:`hf_ckpt.runtime.head.default_chunk_size`,
    the planners' rule too): the tokens whose logits hold about as many values as the step's hidden states
    (``tokens / ceil(vocab / hidden)``), up to a power of two, but no fewer than 128 tokens or ``seq_len`` (default
    ``tokens``) where shorter."""
    return _head.default_chunk_size(tokens, tokens if seq_len is None else seq_len, hidden, vocab)


def _head_chunks(config: Any, batch_size: int, seq_len: int, given: int | None) -> tuple[int | None, int | None]:
    """(the chunk the head is estimated with, a smaller one to trace too or None): ``given``, else the default and,
    where its floor raised it, the memory rule's."""
    if given is not None:
        return given, None
    chunk = _head.default_chunk_of(config, batch_size, seq_len)
    smaller = _head.default_chunk_of(config, batch_size, seq_len, floor=False)
    return chunk, smaller if chunk is not None and smaller < chunk else None


def _with_chunked_head(traced: Trace, figures: tuple, fixed: int, step_peak: int) -> None:
    """Adds the row ``full+head:<chunk>`` (every block full, the head chunked) to the per-strategy figures."""
    activation, peak, recompute, step, ratio, unusable = figures
    if traced.head_chunk is None or EVERY_BLOCK_ROW not in activation:
        return
    name = f"full+head:{traced.head_chunk}"
    if traced.chunked_refused is not None or EVERY_BLOCK_ROW not in traced.chunked_base:
        unusable[name] = traced.chunked_refused or "the chunked head was not traced"
        return
    activation[name] = activation["full"] - traced.base_bytes["full"] + traced.chunked_base["full"]
    peak[name] = max(fixed + activation[name] + traced.chunked_transient["full"], step_peak)
    recompute[name] = recompute["full"] + traced.chunked_flops
    step[name] = step["full"] + traced.chunked_flops
    ratio[name] = ratio["full"] * step[name] / step["full"] if step["full"] else 1.0


def _head_fields(traced: Trace) -> dict[str, Any]:
    """The estimate's ``head_*`` fields: the chunked head as traced (and in a smaller chunk, where traced)."""
    fields = {"head_chunk_size": traced.head_chunk if traced.chunked_base else None,
              "head_base_bytes": max(traced.chunked_base.values(), default=0),
              "head_transient_bytes": dict(traced.chunked_transient), "head_recompute_flops": traced.chunked_flops}
    if traced.smaller_chunked and traced.smaller_chunked[0] and traced.chunked_base:
        base, transient, flops, _, chunk = traced.smaller_chunked
        fields.update(head_smaller_chunk_size=chunk, head_smaller_base_bytes=max(base.values()),
                      head_smaller_transient_bytes=dict(transient),
                      head_smaller_recompute_flops=flops)
    return fields


def _checked(model_or_config, batch_size, seq_len, dtype, autocast, device, optimizer, peft_config, strategies,
             keep_outputs, head_chunk_size=None):
    """Every argument of :func:`estimate`, checked at the call (each error names its argument)."""
    arguments.check_source(model_or_config)
    if head_chunk_size is not None:
        arguments.check_positive_int("head_chunk_size", head_chunk_size)
    return (
        arguments.check_positive_int("batch_size", batch_size),
        arguments.check_positive_int("seq_len", seq_len),
        arguments.check_dtype(dtype),
        arguments.check_autocast(autocast),
        arguments.check_device(device),
        arguments.check_optimizer(optimizer),
        arguments.check_peft_config(peft_config),
        arguments.check_strategies(strategies),
        arguments.check_bool("keep_outputs", keep_outputs),
    )


def _trace_reduced(reduced: nn.Module, traced_blocks: list, strategies: Sequence[Any], num_blocks: int,
                   batch_size: int, seq_len: int, device: str, autocast: torch.dtype | None,
                   keep_outputs: bool = False, head_chunks: tuple[int | None, int | None] = (None, None)) -> Trace:
    """The reduced model traced on fake tensors under every per-block strategy the asked strategies use."""
    mode = fake_mode()
    to_fake(reduced, mode)
    needed = {s for strategy in strategies for s in _per_block(strategy, num_blocks)} | {"none"}
    mixed = any(len(set(_per_block(strategy, num_blocks))) > 1 for strategy in strategies) or set(TRACED) <= needed
    return trace(reduced, traced_blocks, _inputs(reduced, batch_size, seq_len, mode), mode, device,
                 tuple(s for s in TRACED if s in needed), mixed=mixed, autocast=autocast, keep_outputs=keep_outputs,
                 head_chunk=head_chunks[0], smaller_chunk=head_chunks[1])


def estimate(
    model_or_config: Any,
    *,
    batch_size: int,
    seq_len: int,
    dtype: str | torch.dtype = "bfloat16",
    autocast: str | torch.dtype | None = None,
    device: str = "cuda",
    optimizer: str = "adamw",
    peft_config: Any = None,
    strategies: Sequence[Any] = DEFAULT_STRATEGIES,
    keep_outputs: bool = False,
    world_size: int = 1,
    shard: str = "none",
    offload_optimizer: bool = False,
    offload_parameters: bool = False,
    head_chunk_size: int | None = None,
) -> MemoryEstimate:
    """Estimate one training step's memory and compute, per checkpointing strategy, without allocating.

    The model is built on the meta device (parameter counts); a copy with at most two blocks of each block
    type is traced on fake tensors under each strategy, and its per-block figures are scaled to the full depth.

    Args:
        model_or_config: A ``transformers.PretrainedConfig``, a path to a ``config.json`` (or its folder), or a
            model built on the meta device (a PEFT model too).
        batch_size: Sequences per step (per device).
        seq_len: Tokens per sequence.
        dtype: Training dtype: ``"bfloat16"``, ``"float16"`` or ``"float32"`` (or ``bf16``/``fp16``/``fp32``):
            of the parameters, gradients and, without ``autocast``, the activations.
        autocast: Mixed precision: the step runs under ``torch.autocast`` to ``"bfloat16"`` or ``"float16"``
            (the ``Trainer``'s ``bf16=True``/``fp16=True`` over ``dtype="float32"`` weights); None: no autocast.
            Traced with CPU autocast's op lists (see :mod:`hf_ckpt.estimate._trace`).
        device: ``"cuda"`` (attention kernels modelled, see :mod:`hf_ckpt.estimate._attention`) or ``"cpu"``.
        optimizer: ``"adamw"``, ``"adam"``, ``"sgd_momentum"`` or ``"sgd"``.
        peft_config: A ``peft.PeftConfig`` (e.g. ``LoraConfig(r=16)``): only the adapters train.
        strategies: The settings to report, in ``hf-ckpt bench --settings``'s vocabulary: ``none``, ``full``,
            ``selective``, ``every_n:K``, or a :class:`~hf_ckpt.CheckpointPlan`. ``none`` is always included
            (ratios are relative to it).
        keep_outputs: Which training loop is estimated. False (the default): the ``Trainer``'s, whose step keeps
            only the loss, the model's outputs dropped before backward. True: a loop that keeps the outputs alive
            through backward (``outputs = model(**batch); accelerator.backward(outputs.loss)``, as transformers'
            and accelerate's ``no_trainer`` examples do): the logits and everything else the output object holds
            are counted, in their dtype, with the activations (outside the blocks), and in the peak.
        world_size: Devices the states are sharded over (1: one device holds the whole model).
        shard: How: ``"fsdp-full"``, ``"fsdp-grad-op"`` (FSDP2 ``reshard_after_forward`` True / False),
            ``"zero1"``, ``"zero2"`` or ``"zero3"`` (DeepSpeed), or ``"none"``: bytes per device, the peak with the
            engine's gathers and buffers (see ``_sharding``).
        offload_optimizer: DeepSpeed's ``offload_optimizer`` (zero1/2/3): optimizer states on the host
            (``host_bytes``).
        offload_parameters: DeepSpeed's ``offload_param`` (zero3), or FSDP's ``CPUOffloadPolicy``: parameters on
            the host (``host_bytes``).
        head_chunk_size: The chunk (tokens) the chunked head (``hf_ckpt.enable(head_chunk_size=...)``) is
            estimated with, as the row ``full+head:<chunk>`` and the ``head_*`` fields; None: chosen by
            :func:`head_chunk_for` (at least 128 tokens, or ``seq_len`` where shorter), and where that floor raised
            it, the memory rule's smaller chunk traced too (the ``head_smaller_*`` fields), for plans whose budget
            needs its smaller transients. Not estimated where the model refuses it (the reason is in ``unusable``).

    Returns:
        A :class:`MemoryEstimate`.

    Raises:
        ValueError: an argument is invalid (the message names it and what it accepts), or the model cannot be
            traced.
    """
    batch_size, seq_len, torch_dtype, autocast_dtype, device, optimizer, peft_config, strategies, keep_outputs = \
        _checked(model_or_config, batch_size, seq_len, dtype, autocast, device, optimizer, peft_config, strategies,
                 keep_outputs, head_chunk_size)
    sharding = check_sharding(world_size, shard, offload_optimizer, offload_parameters)
    config, cls, full, reduced = _models(model_or_config, torch_dtype, peft_config)
    full_blocks, traced_blocks = blocks_of(full), blocks_of(reduced)
    if not full_blocks:
        raise ValueError(f"model_or_config: {cls.__name__} has no repeated blocks to checkpoint")
    mapping = map_blocks(full_blocks, traced_blocks)
    num_blocks = len(full_blocks)
    traced = _trace_reduced(reduced, traced_blocks, strategies, num_blocks, batch_size, seq_len, device,
                            autocast_dtype, keep_outputs, _head_chunks(config, batch_size, seq_len, head_chunk_size))
    renamed = _traced_name(full_blocks, traced_blocks, mapping.representative)
    per_device = shard_estimate(full, full_blocks, sharding, optimizer, device,
                                lambda name: renamed(name) in traced.used_parameters)
    del full
    rep, usable = mapping.representative, traced.strategies
    block_bytes = {s: tuple(_bound(traced, rep, i, s, usable) for i in range(num_blocks)) for s in usable}
    block_flops = {s: tuple(traced.recompute_flops[s][r] for r in rep) for s in usable}
    none_flops = traced.step_flops + sum(traced.block_flops[r] for r in rep) - sum(traced.block_flops)

    activation, peak, recompute, step, ratio, unusable = _per_strategy(
        traced, rep, strategies, num_blocks, block_flops, none_flops, per_device
    )

    attention = attention_model(device, autocast_dtype or torch_dtype)
    return MemoryEstimate(
        model_type=getattr(config, "model_type", None),
        model_class=cls.__name__,
        device=device,
        dtype=str(torch_dtype).removeprefix("torch."),
        autocast=str(autocast_dtype).removeprefix("torch.") if autocast_dtype is not None else None,
        batch_size=batch_size,
        seq_len=seq_len,
        optimizer=optimizer,
        peft=str(getattr(peft_config, "peft_type", "")).split(".")[-1] or None if peft_config is not None else None,
        parameters=per_device.whole.parameters,
        trainable_parameters=per_device.whole.trainable_parameters,
        parameters_bytes=per_device.parameters_bytes,
        gradients_bytes=per_device.gradients_bytes,
        optimizer_bytes=per_device.optimizer_bytes,
        activation_bytes=activation,
        peak_bytes=peak,
        recompute_flops=recompute,
        step_flops=step,
        flops_ratio=ratio,
        num_blocks=num_blocks,
        traced_blocks=mapping.traced_blocks,
        block_bytes=block_bytes,
        block_recompute_flops=block_flops,
        base_bytes=max(traced.base_bytes.values()),
        representative=rep,
        transient_bytes={s: traced.transient[s] for s in traced.transient},
        unusable=unusable,
        attention={"device": attention.device, "modelled": attention.modelled, "kernel": attention.kernel,
                   "note": attention.note},
        notes=(*_NOTES, OUTPUTS_NOTES[keep_outputs]),
        keep_outputs=keep_outputs, **_head_fields(traced),
        **per_device.fields(),
    )
