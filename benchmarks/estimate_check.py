"""Accuracy of ``hf_ckpt.estimate`` against a real measured CPU step, on tiny models of many architectures.

For each architecture a tiny model is built from its config (random weights, no download) with more blocks than
the estimator traces (so the scaling by block type is exercised), then for each strategy:

* retained activation bytes: ``hf_ckpt.measure.measure_step`` on the real model vs ``estimate(...)`` traced on
  fake tensors with ``device="cpu"`` and the dtype of the real run (must agree within 3%);
* FLOPs of the whole step (forward, recompute, backward), by ``FlopCounterMode`` in both (within 1%);
* parameter, gradient and AdamW state bytes after a real ``optimizer.step()`` (exact).

For a causal LM the row ``full+head:<chunk>`` (every block full, the head and loss in checkpointed chunks of the
estimate's default chunk) is checked the same way; a model that refuses the chunked head prints the reason.

Prints one row per architecture and strategy and exits 1 when a figure is out of tolerance.

    PYTHONPATH=. python benchmarks/estimate_check.py                 # fp32, every architecture below
    PYTHONPATH=. python benchmarks/estimate_check.py --dtype bfloat16 --archs llama,t5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import arch_zoo  # noqa: E402  (the tiny-config recipe of the architecture sweep)

import hf_ckpt  # noqa: E402
from hf_ckpt.estimation import estimate  # noqa: E402
from hf_ckpt.measure import measure_step  # noqa: E402

#: decoder, MoE, encoder, encoder-decoder architectures (the vision-language model is built separately).
ARCHITECTURES = ["llama", "mistral", "qwen2", "gemma2", "phi3", "gpt2", "gpt_neox", "mixtral", "qwen2_moe",
                 "bert", "roberta", "t5", "bart"]
STRATEGIES = ("none", "full", "every_n:2", "selective")
BLOCKS = 7  # more than the four blocks per type the estimator traces
BATCH, SEQ = 2, 32


def _tiny(model_type: str, dtype: torch.dtype):
    """(model, config) for a registered architecture, with BLOCKS blocks (per stack for encoder-decoders)."""
    arch = next(a for a in arch_zoo.architectures({model_type: arch_zoo.COMMON[model_type]}))
    kwargs = arch_zoo.tiny_config_kwargs(arch)
    names = arch_zoo._SEQ2SEQ_LAYER_COUNTS if arch.task == arch_zoo.SEQ2SEQ else arch_zoo._LAYER_COUNTS
    config_class = arch_zoo._config_class(model_type)
    for name in names:
        real = arch_zoo._real_name(config_class, name)
        if real in kwargs:
            kwargs[real] = BLOCKS if arch.task != arch_zoo.SEQ2SEQ else BLOCKS - 2
    config = config_class(**kwargs)
    torch.manual_seed(0)
    model = arch.model_class()(config).to(dtype).train()
    return model, config, arch.task


def _tiny_vlm(dtype: torch.dtype):
    """A tiny LLaVA (CLIP vision tower + Llama), trained on text only (see the report)."""
    import transformers

    text = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                    num_hidden_layers=BLOCKS, vocab_size=128, max_position_embeddings=128)
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                           num_hidden_layers=3, image_size=32, patch_size=8)
    config = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_index=127)
    torch.manual_seed(0)
    return transformers.LlavaForConditionalGeneration(config).to(dtype).train(), config, "vlm"


def _batch(config, task: str) -> dict[str, torch.Tensor]:
    vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, min(vocab, 120), (BATCH, SEQ), generator=generator)
    return {"input_ids": ids, "labels": ids.clone()}


def _apply(model, strategy: str) -> None:
    hf_ckpt.disable(model)
    if strategy.startswith("full+head:"):  # every block full, the head and loss in checkpointed chunks
        hf_ckpt.enable(model, head_chunk_size=int(strategy.split(":")[1]))
    elif strategy.startswith("every_n:"):
        hf_ckpt.enable(model, every_n_layers=int(strategy.split(":")[1]))
    elif strategy != "none":
        hf_ckpt.enable(model, strategy=strategy)


def _states(model, batch) -> tuple[int, int, int]:
    """Parameter, gradient and AdamW-state bytes after one real step."""
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    params = {id(p): p for p in model.parameters()}.values()
    parameters = sum(p.numel() * p.element_size() for p in params)
    gradients = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    states = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor))
    model.zero_grad(set_to_none=True)
    return parameters, gradients, states


def _pct(predicted: float, measured: float) -> float:
    return 0.0 if predicted == measured else 100.0 * (predicted - measured) / max(measured, 1)


def check(name: str, model, config, task: str, dtype: torch.dtype) -> list[bool]:
    with torch.device("meta"):
        meta = type(model)(config).to(dtype)
    started = time.perf_counter()
    predicted = estimate(meta, batch_size=BATCH, seq_len=SEQ, dtype=dtype, device="cpu", strategies=STRATEGIES)
    seconds = time.perf_counter() - started
    batch = _batch(config, task)
    ok = []
    head = [name for name in (*predicted.activation_bytes, *predicted.unusable) if name.startswith("full+head:")]
    for strategy in (*STRATEGIES, *head):
        if strategy not in predicted.activation_bytes:  # a causal LM whose head cannot be chunked: the reason
            print(f"{name:10s} {strategy:12s} not estimated: {predicted.unusable[strategy][:120]}")
            continue
        _apply(model, strategy)
        measured = measure_step(model, batch)
        mem = _pct(predicted.activation_bytes[strategy], measured.retained_bytes)
        flops = _pct(predicted.step_flops[strategy], measured.flops)
        good = abs(mem) <= 3.0 and abs(flops) <= 1.0
        ok.append(good)
        print(f"{name:10s} {strategy:12s} retained {measured.retained_bytes:>10d} predicted "
              f"{predicted.activation_bytes[strategy]:>10d} ({mem:+6.2f}%)  flops {measured.flops:>12d} predicted "
              f"{predicted.step_flops[strategy]:>12d} ({flops:+6.2f}%)  {'ok' if good else 'OUT OF TOLERANCE'}")
    hf_ckpt.disable(model)
    parameters, gradients, states = _states(model, batch)
    exact = (parameters, gradients, states) == (predicted.parameters_bytes, predicted.gradients_bytes,
                                                predicted.optimizer_bytes)
    print(f"{name:10s} states     params {parameters} / {predicted.parameters_bytes}, grads {gradients} / "
          f"{predicted.gradients_bytes}, adamw {states} / {predicted.optimizer_bytes} "
          f"({'exact' if exact else 'DIFFERENT'}); {predicted.num_blocks} blocks, {predicted.traced_blocks} traced, "
          f"estimate {seconds:.2f} s")
    return ok + [exact]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--archs", default=",".join(ARCHITECTURES + ["llava"]))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    results: dict[str, list[bool]] = {}
    for name in args.archs.split(","):
        try:
            model, config, task = _tiny_vlm(dtype) if name == "llava" else _tiny(name, dtype)
            results[name] = check(name, model, config, task, dtype)
        except Exception as error:  # report and go on: one architecture must not hide the others
            print(f"{name:10s} FAILED: {type(error).__name__}: {str(error)[:300]}")
            results[name] = [False]
    passed = [name for name, ok in results.items() if all(ok)]
    print(f"\n{len(passed)}/{len(results)} architectures within tolerance ({args.dtype}, batch {BATCH} x seq {SEQ}): "
          f"{', '.join(passed)}")
    failed = [name for name in results if name not in passed]
    if failed:
        print(f"out of tolerance or failed: {', '.join(failed)}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
