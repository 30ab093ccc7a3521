"""``hf-ckpt estimate CONFIG --check``: the estimate against a real CPU step, on a tiny model of CONFIG's type.

The config's sizes are shrunk (hidden 64, 4 heads, 6 blocks per stack, vocab 256, ...; its structure, layer
types and options kept), a model is built with random weights, and for each strategy one real step is measured
by :func:`hf_ckpt.measure.measure_step` and compared with :func:`hf_ckpt.estimation.estimate` (``device="cpu"``,
fp32, ``adamw_torch``): retained activation bytes within 3%, FLOPs within 1%, and the peaks of a first and a
steady training step with torch's AdamW, the ``Trainer``'s parameter groups (:func:`training_peaks`), within 3%. For a causal LM the row ``full+head:<chunk>`` (every
block full, the head and loss in checkpointed chunks of the estimate's default chunk) is checked the same way.
"""

from __future__ import annotations

import copy
import gc
import warnings
from typing import Any

import torch

from hf_ckpt.runtime.apply import apply_request, remove
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.runtime.util.units import format_bytes, format_flops
from hf_ckpt.meters.memory import StorageTracker
from hf_ckpt.meters.step import measure_step
from hf_ckpt.estimation._estimate import CHUNKED_HEAD_ROW, EVERY_BLOCK_ROW, estimate, row_options
from hf_ckpt.estimation._labels import batch_for
from hf_ckpt.estimation._model import load_config, model_class

#: Tiny sizes by config attribute name.
_SIZES = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd"), 64),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads"), 4),
    "num_key_value_heads": 2,
    **dict.fromkeys(("head_dim", "d_kv"), 16),
    **dict.fromkeys(("intermediate_size", "d_ff", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim"), 128),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size"), 64),
    **dict.fromkeys(("num_local_experts", "num_experts"), 4),
    "num_experts_per_tok": 2,
    "vocab_size": 256,
    **dict.fromkeys(("max_position_embeddings", "n_positions"), 256),
    "query_pre_attn_scalar": 16,
}
_LAYERS = ("num_hidden_layers", "num_layers", "num_decoder_layers", "n_layer", "encoder_layers", "decoder_layers")
_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 0}
BLOCKS, BATCH, SEQ = 6, 2, 32


def _shrink(config: Any) -> None:
    from transformers import PretrainedConfig

    values = vars(config)
    for name, size in _SIZES.items():
        if isinstance(values.get(name), int) and not isinstance(values.get(name), bool):
            setattr(config, name, size)
    for name in _LAYERS:
        if isinstance(values.get(name), int) and values[name] > 0:
            count = values[name]
            types = values.get("layer_types")
            if isinstance(types, list) and len(types) == count:  # the pattern repeated where the config has fewer
                config.layer_types = [types[i % count] for i in range(BLOCKS)]
            setattr(config, name, BLOCKS)
    for name, token in _TOKENS.items():
        if values.get(name) is not None:
            setattr(config, name, token)
    for value in list(values.values()):
        if isinstance(value, PretrainedConfig):
            _shrink(value)


def tiny_config(config: Any) -> Any:
    """A copy of ``config`` with tiny sizes and ``BLOCKS`` blocks per stack."""
    tiny = copy.deepcopy(config)
    _shrink(tiny)
    for name in ("torch_dtype", "dtype"):
        if hasattr(tiny, name):
            setattr(tiny, name, "float32")
    return tiny


def run_check(source: Any, strategies: tuple[str, ...] = ("none", "full", "every_n:2", "selective")) -> int:
    """Print the comparison for a tiny model of ``source``'s architecture; 0 when within tolerance, else 1."""
    config = source if not isinstance(source, (str, bytes)) and hasattr(source, "to_dict") else load_config(source)
    tiny = tiny_config(config)
    cls = model_class(tiny)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    model = cls(tiny).float().train()
    vocab = tiny.get_text_config().vocab_size if hasattr(tiny, "get_text_config") else tiny.vocab_size
    ids = torch.randint(3, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    batch = batch_for(model, BATCH, SEQ)  # labels of the head's shape (zeros: a valid class, position, token)
    batch = {**batch, "input_ids": ids, **({"labels": ids.clone()} if batch.get("labels") is batch["input_ids"] else {})}
    predicted = estimate(tiny, batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", strategies=strategies,
                         optimizer="adamw_torch")
    print(f"check: {cls.__name__}, tiny copy ({predicted.num_blocks} blocks, {predicted.traced_blocks} traced), "
          f"batch {BATCH} x seq {SEQ}, float32, a real CPU step per strategy")
    ok = True
    for strategy in (*strategies, *_chunked_head_row(predicted, strategies)):
        if strategy not in predicted.activation_bytes:
            print(f"  {strategy:12s} not estimated: {predicted.unusable.get(strategy, '')[:120]}")
            continue
        remove(model)
        options = row_options(strategy)
        if options:
            apply_request(model, EnableRequest.of(**options))
        measured = measure_step(model, batch)
        memory = 100.0 * (predicted.activation_bytes[strategy] - measured.retained_bytes) / max(1, measured.retained_bytes)
        flops = 100.0 * (predicted.step_flops[strategy] - measured.flops) / max(1, measured.flops)
        peaks, peaks_line = _peaks(model, batch, predicted, strategy)
        good = abs(memory) <= 3.0 and abs(flops) <= 1.0 and all(abs(p) <= 3.0 for p in peaks)
        ok = ok and good
        print(f"  {strategy:12s} retained {format_bytes(measured.retained_bytes)}, predicted "
              f"{format_bytes(predicted.activation_bytes[strategy])} ({memory:+.2f}%); FLOPs "
              f"{format_flops(measured.flops)} predicted {format_flops(predicted.step_flops[strategy])} "
              f"({flops:+.2f}%); {peaks_line}  {'ok' if good else 'OUT OF TOLERANCE'}")
    remove(model)
    print("check passed" if ok else "check FAILED (tolerance: 3% memory and peaks, 1% FLOPs)")
    return 0 if ok else 1


def training_peaks(model: Any, batch: dict, optimizer: torch.optim.Optimizer, steps: int = 2) -> list[int]:
    """The peak of each of ``steps`` real training steps of ``model`` (``zero_grad(set_to_none=True)``, forward,
    backward, ``optimizer.step()``), above the parameters: what the steps make, the optimizer's states from the
    first on, counts."""
    peaks = []
    with StorageTracker() as tracker:
        for _ in range(steps):
            gc.collect()
            tracker.reset_peak()
            model.zero_grad(set_to_none=True)
            model(**batch).loss.backward()
            optimizer.step()
            peaks.append(tracker.peak_bytes().get("cpu", 0))
    model.zero_grad(set_to_none=True)
    return peaks


def _trainer_adamw(model: Any) -> torch.optim.AdamW:
    """torch's AdamW with the ``Trainer``'s two parameter groups (matrices, the rest), without weight decay."""
    groups = [[p for p in model.parameters() if p.requires_grad and p.dim() >= 2],
              [p for p in model.parameters() if p.requires_grad and p.dim() < 2]]
    return torch.optim.AdamW([{"params": group} for group in groups if group], lr=1e-6, weight_decay=0.0)


def _peaks(model: Any, batch: dict, predicted: Any, strategy: str) -> tuple[list[float], str]:
    """The first and a steady step's peaks against the estimate's: the differences (%) and their report."""
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    first, steady = training_peaks(model, batch, _trainer_adamw(model))
    with torch.no_grad():  # the steps moved the weights: the next row starts from the same ones
        for name, p in model.named_parameters():
            p.copy_(state[name])
    params = predicted.parameters_bytes
    figures = ((first, predicted.first_step_peak_bytes[strategy] - params),
               (steady, predicted.peak_bytes[strategy] - params))
    diffs = [100.0 * (guess - real) / max(1, real) for real, guess in figures]
    return diffs, (f"peak first step {format_bytes(first)} ({diffs[0]:+.2f}%), steady {format_bytes(steady)} "
                   f"({diffs[1]:+.2f}%)")


def _chunked_head_row(predicted: Any, strategies: tuple[str, ...]) -> tuple[str, ...]:
    """The row ``full+head:<chunk>`` of a causal LM (estimated, or listed in ``unusable`` with the reason), after
    ``full``; none for a model with no chunked head to estimate."""
    if EVERY_BLOCK_ROW not in strategies:
        return ()
    return tuple(name for name in (*predicted.activation_bytes, *predicted.unusable) if name.startswith(CHUNKED_HEAD_ROW))
