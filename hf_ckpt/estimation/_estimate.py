"""``estimate`` and ``plan_for``: trace the reduced model once, scale to the full depth, compose strategies."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Sequence

import torch
from torch import nn

from hf_ckpt.runtime import _torch
from hf_ckpt.runtime import head as _head
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.strategies import kind_class
from hf_ckpt.estimation import _arguments as arguments
from hf_ckpt.estimation._attention import attention_model
from hf_ckpt.estimation._model import (
    blocks_of,
    build_on_meta,
    load_config,
    map_blocks,
    model_class,
    reduced_config,
)
from hf_ckpt.estimation._labels import batch_for, check_text_model
from hf_ckpt.estimation._quantized import as_traced, check_quantization, dequantized_bytes, quantized_weights
from hf_ckpt.estimation._result import MemoryEstimate
from hf_ckpt.estimation._sharding import check_sharding, shard_estimate
from hf_ckpt.estimation._timeline import StepPeaks, backward_held, held_above, step_peaks
from hf_ckpt.estimation._trace import TRACED, Trace, fake_mode, to_fake, trace

#: The row of every block checkpointed whole: the chunked head's row (``full+head:<chunk>``) builds on it.
EVERY_BLOCK_ROW = "full"
#: The prefixes of the rows that are no kind: every n-th block full, every block full with the head in chunks.
EVERY_N_ROW, CHUNKED_HEAD_ROW = "every_n:", f"{EVERY_BLOCK_ROW}+head:"
DEFAULT_STRATEGIES = ("none", EVERY_BLOCK_ROW, "every_n:2", "selective")

_NOTES = (
    "activations: bytes of tensor storages alive when forward returns, traced on fake tensors (allocator "
    "rounding and fragmentation not included)",
    "batches without padding mask (causal attention via is_causal); labels of the head's shape (seq_len tokens, "
    "one per sequence for classification, answer start and end for question answering)",
    "peak: the step as a timeline, a steady step's (first_step_peak_bytes: the first, before the optimizer's "
    "states exist): gradients appear in backward as the activations are freed, the optimizer step's temporaries "
    "counted; with gradient accumulation or a sharded engine every gradient is held through backward",
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

    try:
        wrapped = get_peft_model(model, copy.deepcopy(peft_config))
    except ValueError as error:  # peft's own words (a target module not in the model, ...), the argument named
        raise ValueError(f"peft_config: {error}") from None
    saved = [name for name, module in wrapped.named_modules() if type(module).__name__ == "ModulesToSaveWrapper"]
    missing = [key for key in getattr(peft_config, "modules_to_save", None) or ()
               if not any(name == key or name.endswith("." + key) for name in saved)]
    if missing:  # peft skips them without a word
        raise ValueError(f"peft_config: modules_to_save {', '.join(missing)} not found in the model")
    return wrapped


def _inputs(model: nn.Module, batch_size: int, seq_len: int, mode: Any) -> dict[str, torch.Tensor]:
    with mode:
        return batch_for(model, batch_size, seq_len)


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
    base, blocks = _retained(traced, representative, per_block)
    return base + sum(blocks)


def _retained(traced: Trace, representative: Sequence[int], per_block: Sequence[str]) -> tuple[int, list[int]]:
    """(:func:`retained_bytes` outside the blocks, each block's)."""
    last = len(per_block) - 1
    full_of: dict[int, int] = {}  # a traced position -> the first full-model block it represents
    for i, traced_position in enumerate(representative):
        full_of.setdefault(traced_position, i)
    blocks = []
    for i, strategy in enumerate(per_block):
        previous = per_block[i - 1] if i > 0 else None
        following = per_block[i + 1] if i < last else None
        head = traced.head_of(representative[i])
        head_strategy = per_block[full_of[head]] if head is not None and head in full_of else None
        blocks.append(traced.block_bytes(representative[i], previous, strategy, following, head_strategy))
    return traced.base_bytes[per_block[0]], blocks


def _bound(traced: Trace, representative: Sequence[int], i: int, strategy: str, usable: Sequence[str]) -> int:
    """Block ``i``'s bytes under ``strategy`` whatever its neighbours run (the largest): additive, for the solver."""
    return traced.largest(representative[i], strategy)


#: ``attn_implementation`` values: None (the model's default, SDPA), or the one named.
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash")


def _check_attn(value: Any, device: str, given_model: bool) -> str | None:
    if value is not None and value not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation must be one of {', '.join(ATTN_IMPLEMENTATIONS)} (or None: the "
                         f"model's default); got {value!r}")
    if value == "flash" and device != "cuda":
        raise ValueError("attn_implementation: flash (flash_attention_2) runs on CUDA only; use device='cuda'")
    if value is not None and given_model:
        raise ValueError("attn_implementation: a model built on the meta device keeps its own attention; pass its "
                         "config instead")
    return value


def _attention(device: str, dtype: torch.dtype, attn: str | None) -> dict[str, Any]:
    """The estimate's ``attention`` field: eager attention is traced as written on every device."""
    if attn == "eager":
        return {"device": device, "modelled": False, "note": "traced: eager attention runs its own ops on any device",
                "kernel": "eager (keeps the attention probabilities, batch x heads x seq x seq)"}
    model = attention_model(device, dtype)
    return {"device": model.device, "modelled": model.modelled, "kernel": model.kernel, "note": model.note}


def _models(model_or_config: Any, torch_dtype: torch.dtype, peft_config: Any, quant: Any = None,
            attn: str | None = None, traced_dtype: torch.dtype | None = None):
    """(config, class, the full model on meta, the reduced copy on meta, the quantized weights' stored bytes by
    ``id`` and the largest dequantized weight), adapters added to both; ``attn="eager"``: eager attention. The
    reduced copy is in ``traced_dtype`` where given (FSDP2's mixed precision computes in it)."""
    config, cls, full, found_peft = _source(model_or_config, torch_dtype)
    if attn == "eager":
        config = copy.deepcopy(config)
        config._attn_implementation = "eager"
    peft_config = peft_config if peft_config is not None else found_peft
    if quant is not None and peft_config is None:
        raise ValueError("quantization_config: a quantized base trains only adapters; pass peft_config (e.g. "
                         "peft.LoraConfig: QLoRA)")
    if full is None:
        full = _built(cls, config, torch_dtype)
    else:
        full = copy.deepcopy(full).to(dtype=torch_dtype).train()
        if hasattr(full, "tie_weights"):  # a model built on meta may not have tied its embeddings yet
            full.tie_weights()
    check_text_model(full)
    stored = quantized_weights(full, quant) if quant is not None else {}
    dequantized = dequantized_bytes(full, stored, quant) if quant is not None else 0
    full = _with_peft(full, peft_config)
    reduced = build_on_meta(cls, reduced_config(config), traced_dtype or torch_dtype)
    as_traced(reduced, quant)
    reduced = _with_peft(reduced, peft_config)
    return config, cls, full, reduced, stored, dequantized


def _built(cls: type, config: Any, torch_dtype: torch.dtype) -> nn.Module:
    """:func:`build_on_meta`; where the class cannot be built (an optional dependency not installed, a config its
    own ``__init__`` rejects) the estimate is refused in one line, with the first sentence of the model's reason."""
    try:
        return build_on_meta(cls, config, torch_dtype)
    except ImportError as error:  # transformers' placeholder of a missing backend (timm): its message is a paragraph
        reason = " ".join(str(error).split()).split(". ")[0]
        raise ValueError(f"model_or_config: {cls.__name__} cannot be built here: {reason}") from None
    except (AttributeError, TypeError, KeyError, IndexError) as error:  # the model's __init__ on this config
        reason = " ".join(str(error).split())[:200]
        raise ValueError(f"model_or_config: {cls.__name__} cannot be built from this config: "
                         f"{type(error).__name__}: {reason}") from None


def _quantization(value: Any, dtype: torch.dtype, sharding: Any):
    """``quantization_config`` checked (:func:`check_quantization`); single device only."""
    quant = check_quantization(value, dtype)
    if quant is not None and sharding.shard != "none":
        raise ValueError(f"quantization_config: a quantized base under shard={sharding.shard!r} is not modelled; "
                         "estimate it with shard='none'")
    return quant


def _with_dequantized(traced: Trace, dequantized: int) -> None:
    """Each transient at least the largest dequantized weight of a quantized base (forward and backward of its
    layers make it while the activations are held)."""
    if not dequantized:
        return
    transients = [traced.transient, traced.chunked_transient]
    if traced.smaller_chunked:
        transients.append(traced.smaller_chunked[1])
    for transient in transients:
        for strategy, value in transient.items():
            transient[strategy] = max(value, dequantized)
    for key, line in traced.timelines.items():
        traced.timelines[key] = replace(line, head_rise=max(line.head_rise, dequantized),  # the forward's too
                                        forward_rise=max(line.forward_rise, dequantized),
                                        block_rises=tuple(max(r, dequantized) for r in line.block_rises))


def _row_peaks(states: Any, accumulation: int, base: int, blocks: Sequence[int], transient: int,
               lines: Sequence[Any], rep: Sequence[int], back: Sequence[int] | None = None) -> StepPeaks:
    """A row's peaks (:func:`~hf_ckpt.estimation._timeline.step_peaks`): ``base`` and ``blocks`` retained,
    ``lines`` the timeline of each block's strategy, ``back`` what an activation offload brings back per block."""
    backward = backward_held(lines, base, blocks, rep, back=back)
    in_flight = (2 * max(back) if len(back) > 1 else max(back)) if back else 0  # gradients held whole: the most
    kept = max((line.after_backward for line in lines if line is not None), default=0)
    return step_peaks(states, base + sum(blocks), transient + in_flight, backward, accumulation, kept)


def _held_for_planners(traced: Trace, rep: Sequence[int], states: Any, accumulation: int) -> dict[str, int]:
    """:attr:`MemoryEstimate.held_above_bytes`: per head setting, the timeline's bound
    (:func:`~hf_ckpt.estimation._timeline.held_above`) over the planned strategies, or, where the backward counts
    the gradients whole, the fixed part and the largest transient."""
    planned = [s for s in TRACED if s in traced.transient]
    settings = [("", traced.transient, traced.base_bytes, "")]
    if traced.head_chunk is not None and traced.chunked_base:
        settings.append((f"head:{traced.head_chunk}", traced.chunked_transient, traced.chunked_base,
                         f"+head:{traced.head_chunk}"))
    if traced.smaller_chunked and traced.smaller_chunked[0]:
        base, transient, _flops, _refused, chunk = traced.smaller_chunked
        settings.append((f"head:{chunk}", transient, base, f"+head:{chunk}"))
    held = {}
    for key, transient, base, suffix in settings:
        names = [s for s in planned if s in transient]
        lines = [traced.timelines.get(s + suffix) for s in names]
        above = held_above(lines, max(base.values()), rep) if states.sharded is None and accumulation == 1 else None
        held[key] = (states.peak_fixed_bytes + max(transient[s] for s in names) if above is None
                     else states.parameters_bytes + states.optimizer_bytes + above)
    return held


def _timeline_fields(traced: Trace, rep: Sequence[int], states: Any, accumulation: int, timing: dict) -> dict:
    """The :class:`MemoryEstimate` fields of the step's timeline."""
    return dict(gradient_accumulation_steps=accumulation, first_step_peak_bytes={n: t.first for n, t in timing.items()},
                peak_phase={n: t.where for n, t in timing.items()},
                optimizer_step_bytes=states.whole.step_bytes if states.sharded is None else 0,
                held_above_bytes=_held_for_planners(traced, rep, states, accumulation))


def _per_strategy(traced: Trace, rep: Sequence[int], strategies: Sequence[Any], num_blocks: int,
                  block_flops: dict, none_flops: int, states: Any, accumulation: int = 1):
    """Activation, recompute and step FLOPs, the FLOPs ratio, the unusable strategies and each row's
    :class:`StepPeaks` (its peaks)."""
    activation, recompute, step, ratio, timing = {}, {}, {}, {}, {}
    unusable = dict(traced.unusable)
    for strategy in dict.fromkeys(("none", *strategies)):
        name = arguments.strategy_name(strategy)
        per_block = _per_block(strategy, num_blocks)
        missing = [s for s in set(per_block) if s not in traced.strategies]
        if missing:
            unusable.setdefault(name, unusable.get(missing[0], f"{missing[0]} cannot run on this model"))
            continue
        base, blocks = _retained(traced, rep, per_block)
        activation[name] = base + sum(blocks)
        timing[name] = _row_peaks(states, accumulation, base, blocks, max(traced.transient[s] for s in set(per_block)),
                                  [traced.timelines.get(s) for s in per_block], rep)
        recompute[name] = sum(block_flops[s][i] for i, s in enumerate(per_block))
        step[name] = none_flops + recompute[name]
        ratio[name] = step[name] / none_flops if none_flops else 1.0
    figures = activation, recompute, step, ratio, unusable, timing
    _with_chunked_head(traced, rep, num_blocks, figures, states, accumulation)
    _with_chunked_mlp(traced, rep, num_blocks, figures, states, accumulation)
    return figures


def mlp_row_name(mlp_chunk: int, head_chunk: int | None = None) -> str:
    """The estimate's row with every block full and the MLP in chunks of ``mlp_chunk`` tokens:
    ``full+mlp:<m>``, or ``full+head:<c>+mlp:<m>`` with the head in chunks of ``head_chunk``."""
    return f"{CHUNKED_HEAD_ROW}{head_chunk}+mlp:{mlp_chunk}" if head_chunk else f"{EVERY_BLOCK_ROW}+mlp:{mlp_chunk}"


def _with_chunked_mlp(traced: Trace, rep: Sequence[int], num_blocks: int, figures: tuple, states: Any,
                      accumulation: int) -> None:
    """Adds the rows of :func:`mlp_row_name` (every block full, the MLP chunked; the head whole and chunked) to the
    per-strategy figures: the traced base and blocks scaled to the full depth, the traced transient (one block's
    recompute, its MLP one chunk at a time), the FLOPs of the MLP's second recompute scaled by the blocks."""
    activation, recompute, step, ratio, unusable, timing = figures
    if traced.mlp_chunk is None or EVERY_BLOCK_ROW not in activation:
        return
    if traced.mlp_refused is not None or not traced.mlp_rows:
        unusable[mlp_row_name(traced.mlp_chunk)] = traced.mlp_refused or "the chunked MLP was not traced"
        return
    traced_count = len(traced.block_flops)
    for head_chunk, (base, per_block, transient, added) in traced.mlp_rows.items():
        name = mlp_row_name(traced.mlp_chunk, head_chunk)
        blocks = [per_block[r] for r in rep]
        activation[name] = base + sum(blocks)
        timing[name] = _row_peaks(states, accumulation, base, blocks, transient,
                                  [traced.timelines.get(_timeline_key(name))] * num_blocks, rep)
        head_flops = traced.chunked_flops if head_chunk else 0
        recompute[name] = recompute["full"] + head_flops + (added * num_blocks) // max(1, traced_count)
        step[name] = step["full"] + recompute[name] - recompute["full"]
        ratio[name] = ratio["full"] * step[name] / step["full"] if step["full"] else 1.0


#: The suffix of a row whose checkpointed block inputs are offloaded (``offload_activations``).
OFFLOAD_SUFFIX = "+offload"


def _checkpoint_inputs(block_bytes: Sequence[int], device: str) -> list[int]:
    """The bytes of each ``full`` block's checkpointed input, what the offload moves: a block's bytes but, on the
    CPU, the generator state its checkpoint keeps beside them (a Python-side copy no saved-tensor hook sees)."""
    kept = torch.get_rng_state().numel() if device == "cpu" else 0
    return [max(0, value - kept) for value in block_bytes]


def _with_offload(figures: tuple, traced: Trace, rep: Sequence[int], device: str, states: Any,
                  accumulation: int) -> dict:
    """Adds ``<row>+offload`` for every row with every block full: its checkpointed inputs in host memory, but the
    two the overlapped offload holds on the device in flight (:mod:`hf_ckpt.runtime.offload`: one copied back while
    the one before it is recomputed), counted in every backward phase; the FLOPs unchanged. Returns each new row's
    host bytes."""
    activation, recompute, step, ratio, _unusable, timing = figures
    if EVERY_BLOCK_ROW not in traced.strategies:
        return {}
    base, blocks = _retained(traced, rep, (EVERY_BLOCK_ROW,) * len(rep))
    inputs = _checkpoint_inputs(blocks, device)
    moved = sum(inputs)
    kept = [b - i for b, i in zip(blocks, inputs)]
    host = {}
    for name in [n for n in activation if n == EVERY_BLOCK_ROW or n.startswith(EVERY_BLOCK_ROW + "+")]:
        offloaded = name + OFFLOAD_SUFFIX
        activation[offloaded] = activation[name] - moved
        lines, transient = _row_parts(traced, name, len(rep))
        timing[offloaded] = _row_peaks(states, accumulation, activation[name] - sum(blocks), kept, transient, lines,
                                       rep, inputs)
        recompute[offloaded], step[offloaded], ratio[offloaded] = recompute[name], step[name], ratio[name]
        host[offloaded] = moved
    return host


def _row_parts(traced: Trace, name: str, num_blocks: int) -> tuple[list, int]:
    """(each block's timeline, transient) of a row with every block full: ``full``, ``full+head:<c>``, an MLP row."""
    if "+mlp:" in name:
        transient = traced.mlp_rows[traced.head_chunk if name.startswith(CHUNKED_HEAD_ROW) else None][2]
    else:
        transient = (traced.chunked_transient if name != EVERY_BLOCK_ROW else traced.transient)[EVERY_BLOCK_ROW]
    return [traced.timelines.get(_timeline_key(name))] * num_blocks, transient


def _timeline_key(row: str) -> str:
    """The key of :attr:`Trace.timelines` a row with every block full reads: the row's name, an MLP row's without
    its chunk (``full+head:<c>+mlp``)."""
    return row.rsplit(":", 1)[0] if "+mlp:" in row else row


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


def _with_chunked_head(traced: Trace, rep: Sequence[int], num_blocks: int, figures: tuple, states: Any,
                       accumulation: int) -> None:
    """Adds the row ``full+head:<chunk>`` (every block full, the head chunked) to the per-strategy figures."""
    activation, recompute, step, ratio, unusable, timing = figures
    if traced.head_chunk is None or EVERY_BLOCK_ROW not in activation:
        return
    name = f"full+head:{traced.head_chunk}"
    if traced.chunked_refused is not None or EVERY_BLOCK_ROW not in traced.chunked_base:
        unusable[name] = traced.chunked_refused or "the chunked head was not traced"
        return
    activation[name] = activation["full"] - traced.base_bytes["full"] + traced.chunked_base["full"]
    _base, blocks = _retained(traced, rep, (EVERY_BLOCK_ROW,) * num_blocks)
    timing[name] = _row_peaks(states, accumulation, traced.chunked_base["full"], blocks,
                              traced.chunked_transient["full"], [traced.timelines.get(name)] * num_blocks, rep)
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
             keep_outputs, head_chunk_size=None, mlp_chunk_size=None, offload_activations=False):
    """Every argument of :func:`estimate`, checked at the call (each error names its argument)."""
    arguments.check_source(model_or_config)
    arguments.check_bool("offload_activations", offload_activations)
    if head_chunk_size is not None:
        arguments.check_positive_int("head_chunk_size", head_chunk_size)
    if mlp_chunk_size is not None:
        arguments.check_positive_int("mlp_chunk_size", mlp_chunk_size)
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
                   keep_outputs: bool = False, head_chunks: tuple[int | None, int | None] = (None, None),
                   mlp_chunk: int | None = None) -> Trace:
    """The reduced model traced on fake tensors under every per-block strategy the asked strategies use (and
    ``full`` where ``mlp_chunk`` is given: the chunked MLP's rows build on it)."""
    mode = fake_mode()
    to_fake(reduced, mode)
    needed = {s for strategy in strategies for s in _per_block(strategy, num_blocks)} | {"none"}
    needed |= {"full"} if mlp_chunk else set()
    mixed = any(len(set(_per_block(strategy, num_blocks))) > 1 for strategy in strategies) or set(TRACED) <= needed
    try:
        return trace(reduced, traced_blocks, _inputs(reduced, batch_size, seq_len, mode), mode, device,
                     tuple(s for s in TRACED if s in needed), mixed=mixed, autocast=autocast,
                     keep_outputs=keep_outputs, head_chunk=head_chunks[0], smaller_chunk=head_chunks[1],
                     mlp_chunk=mlp_chunk)
    except _torch.fake_tensor_errors() as error:
        raise ValueError(f"model_or_config: {type(reduced).__name__}'s forward cannot be traced on fake tensors "
                         f"({type(error).__name__}: {' '.join(str(error).split())[:120]}): a shape or branch that "
                         "depends on tensor values") from None
    except NotImplementedError as error:  # the model's own refusal to train (VITS: "Training ... not supported yet")
        raise ValueError(f"model_or_config: {type(reduced).__name__}'s training step is not implemented: "
                         f"{' '.join(str(error).split())[:200]}") from None


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
    fsdp_param_dtype: str | torch.dtype | None = None,
    head_chunk_size: int | None = None,
    quantization_config: Any = None,
    attn_implementation: str | None = None,
    mlp_chunk_size: int | None = None,
    offload_activations: bool = False,
    gradient_accumulation_steps: int = 1,
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
            Traced with CPU autocast's op lists (see :mod:`hf_ckpt.estimation._trace`).
        device: ``"cuda"`` (attention kernels modelled, see :mod:`hf_ckpt.estimation._attention`) or ``"cpu"``.
        optimizer: The ``Trainer``'s ``optim`` name (``"adamw_torch"``, ``"adamw_torch_fused"``, ``"adamw_8bit"``,
            ``"paged_adamw_8bit"``, ``"adafactor"``, ``"lion_8bit"``, ``"sgd"``, ...: the keys of
            :data:`hf_ckpt.meters.optimizer_states.TRAINER_OPTIMIZERS`), or ``"adamw"`` (the default, torch's
            AdamW), ``"adam"``, ``"sgd_momentum"`` (momentum 0.9). Sharded estimates take those whose state is
            tensors the size of the parameter.
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
        fsdp_param_dtype: FSDP2's mixed precision, ``MixedPrecisionPolicy(param_dtype=...)``: ``"bfloat16"`` or
            ``"float16"``. The shards, their gradients and the optimizer states stay in ``dtype`` (float32); each
            unit is gathered in this dtype and the forward runs in it (the activations are traced in it). With
            ``shard="fsdp-full"`` or ``"fsdp-grad-op"``, without ``autocast``.
        head_chunk_size: The chunk (tokens) the chunked head (``hf_ckpt.enable(head_chunk_size=...)``) is
            estimated with, as the row ``full+head:<chunk>`` and the ``head_*`` fields; None: chosen by
            :func:`head_chunk_for` (at least 128 tokens, or ``seq_len`` where shorter), and where that floor raised
            it, the memory rule's smaller chunk traced too (the ``head_smaller_*`` fields), for plans whose budget
            needs its smaller transients. Not estimated where the model refuses it (the reason is in ``unusable``).
        quantization_config: A ``transformers.BitsAndBytesConfig`` (``load_in_4bit`` with ``nf4``/``fp4`` and
            double quantization, or ``load_in_8bit``) the base is loaded with; with ``peft_config``: QLoRA. The
            quantized weights count as bitsandbytes stores them, the layers transformers leaves out (the output
            embeddings) in ``dtype``; each transient is at least the largest weight dequantized (see
            :mod:`hf_ckpt.estimation._quantized`). Its compute dtype must be ``dtype``; single device only.

        attn_implementation: The attention the model runs: None (its default, SDPA: on CUDA the fused kernels,
            modelled), ``"sdpa"`` (the same), ``"flash"`` (flash_attention_2, CUDA only: what the fused kernels
            keep, modelled) or ``"eager"`` (the attention written out, traced as it runs on any device: it keeps the
            attention probabilities). Needs a config, not a built model.
        mlp_chunk_size: The chunked MLP's chunk (tokens): the rows ``full+mlp:<m>`` and ``full+head:<c>+mlp:<m>``
            (every block full, each MLP recomputed a chunk at a time); None, or refused (the reason in ``unusable``): none.
        offload_activations: Also the rows ``<row>+offload`` of every row with every block full (``full``, the
            chunked head's and MLP's): ``hf_ckpt.enable(..., offload=True)``, each block's checkpointed input in
            host memory (:attr:`MemoryEstimate.activation_host_bytes`) but the two the overlapped offload holds on
            the device in flight (one copied back while the one before it is recomputed).
        gradient_accumulation_steps: Micro-batches per optimizer step (the ``Trainer``'s
            ``gradient_accumulation_steps``). 1: each step's gradients appear during its backward, as the
            activations are freed; above 1 the later micro-batches run with every gradient held.

    Returns:
        A :class:`MemoryEstimate`.

    Raises:
        ValueError: an argument is invalid (the message names it and what it accepts), or the model cannot be
            traced.
    """
    batch_size, seq_len, torch_dtype, autocast_dtype, device, optimizer, peft_config, strategies, keep_outputs = \
        _checked(model_or_config, batch_size, seq_len, dtype, autocast, device, optimizer, peft_config, strategies,
                 keep_outputs, head_chunk_size, mlp_chunk_size, offload_activations)
    accumulation = arguments.check_positive_int("gradient_accumulation_steps", gradient_accumulation_steps)
    sharding = check_sharding(world_size, shard, offload_optimizer, offload_parameters,
                              param_dtype := arguments.check_fsdp_param_dtype(fsdp_param_dtype, autocast_dtype))
    quant = _quantization(quantization_config, autocast_dtype or torch_dtype, sharding)
    attn = _check_attn(attn_implementation, device, isinstance(model_or_config, nn.Module))
    config, cls, full, reduced, stored, dequantized = _models(model_or_config, torch_dtype, peft_config, quant, attn, param_dtype)
    full_blocks, traced_blocks = blocks_of(full), blocks_of(reduced)
    if not full_blocks:
        raise ValueError(f"model_or_config: {cls.__name__} has no repeated blocks to checkpoint")
    mapping, num_blocks = map_blocks(full_blocks, traced_blocks), len(full_blocks)
    traced = _trace_reduced(reduced, traced_blocks, strategies, num_blocks, batch_size, seq_len, device,
                            autocast_dtype, keep_outputs, _head_chunks(config, batch_size, seq_len, head_chunk_size),
                            mlp_chunk_size)
    _with_dequantized(traced, dequantized)
    renamed = _traced_name(full_blocks, traced_blocks, mapping.representative)
    per_device = shard_estimate(full, full_blocks, sharding, optimizer, device,
                                lambda name: renamed(name) in traced.used_parameters, stored)
    rep, usable = mapping.representative, traced.strategies
    block_bytes = {s: tuple(_bound(traced, rep, i, s, usable) for i in range(num_blocks)) for s in usable}
    block_flops = {s: tuple(traced.recompute_flops[s][r] for r in rep) for s in usable}
    none_flops = traced.step_flops + sum(traced.block_flops[r] for r in rep) - sum(traced.block_flops)

    figures = _per_strategy(traced, rep, strategies, num_blocks, block_flops, none_flops, per_device, accumulation)
    host = _with_offload(figures, traced, rep, device, per_device, accumulation) if offload_activations else {}
    activation, recompute, step, ratio, unusable, timing = figures

    return MemoryEstimate(
        model_type=getattr(config, "model_type", None),
        model_class=cls.__name__,
        device=device,
        dtype=str(torch_dtype).removeprefix("torch."),
        autocast=str(autocast_dtype).removeprefix("torch.") if autocast_dtype is not None else None,
        batch_size=batch_size, seq_len=seq_len, optimizer=optimizer,
        quantization=quant.describe() if quant is not None else None,
        peft=str(getattr(peft_config, "peft_type", "")).split(".")[-1] or None if peft_config is not None else None,
        parameters=per_device.whole.parameters,
        trainable_parameters=per_device.whole.trainable_parameters,
        parameters_bytes=per_device.parameters_bytes,
        gradients_bytes=per_device.gradients_bytes,
        optimizer_bytes=per_device.optimizer_bytes,
        activation_bytes=activation,
        peak_bytes={name: peaks.steady for name, peaks in timing.items()},
        recompute_flops=recompute, step_flops=step, flops_ratio=ratio,
        num_blocks=num_blocks,
        traced_blocks=mapping.traced_blocks,
        block_bytes=block_bytes,
        block_recompute_flops=block_flops,
        base_bytes=max(traced.base_bytes.values()),
        representative=rep,
        transient_bytes={s: traced.transient[s] for s in traced.transient},
        unusable=unusable,
        attention=_attention(device, autocast_dtype or param_dtype or torch_dtype, attn),
        notes=(*_NOTES, OUTPUTS_NOTES[keep_outputs]),
        keep_outputs=keep_outputs, **_head_fields(traced), mlp_chunk_size=traced.mlp_chunk if traced.mlp_rows else None,
        activation_host_bytes=host, **_timeline_fields(traced, rep, per_device, accumulation, timing),
        **per_device.fields(),
    )
