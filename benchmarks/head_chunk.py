"""The chunked head measured against the estimate: a CPU training step of a Llama whose vocabulary dwarfs its width.

    python benchmarks/head_chunk.py [--batch 4] [--seq 256] [--hidden 128] [--vocab 16384] [--chunk N]

Every block is checkpointed in both steps (``full``); the second also runs the output projection and loss in
checkpointed chunks (``head_chunk_size``, by default the chunk the estimator chooses). Prints, for each, the bytes
retained at the end of forward and the peak of the step as ``hf_ckpt.measure.measure_step`` measures them on CPU
(storages created during the step, gradients included), the estimator's activations and peak above the fixed
states, the step's FLOPs and its wall time (median of three steps); then the measured drop against the predicted
one.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import transformers

import hf_ckpt
from hf_ckpt.estimation import estimate
from hf_ckpt.measure import measure_step


def _seconds(model, batch) -> float:
    times = []
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(**batch).loss.backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("batch", 4), ("seq", 256), ("hidden", 128), ("vocab", 16384), ("chunk", None)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    config = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                      num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
                                      vocab_size=args.vocab, max_position_embeddings=max(128, args.seq))
    made = estimate(config, batch_size=args.batch, seq_len=args.seq, dtype="float32", device="cpu",
                    strategies=("none", "full"), head_chunk_size=args.chunk)
    chunk = made.head_chunk_size
    chunked = f"full+head:{chunk}"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    measured = {}
    print(f"Llama, 4 blocks, hidden {args.hidden}, vocab {args.vocab}; batch {args.batch} x seq {args.seq}, float32 "
          "on cpu")
    print(f"{'setting':<16}{'retained':>12}{'predicted':>12}{'peak':>12}{'predicted':>12}{'FLOPs':>10}{'step':>9}")
    for name, options in (("full", {}), (chunked, {"head_chunk_size": chunk})):
        hf_ckpt.enable(model, **options)
        step = measure_step(model, batch)
        measured[name] = step
        seconds = _seconds(model, batch)
        hf_ckpt.disable(model)
        print(f"{name:<16}{step.retained_bytes:>12,}{made.activation_bytes[name]:>12,}{step.peak_bytes:>12,}"
              f"{made.peak_bytes[name] - made.fixed_bytes:>12,}{step.flops / 1e9:>9.2f}G{seconds:>8.3f}s")
    for what, field, predicted in (
        ("retained", "retained_bytes", made.activation_bytes["full"] - made.activation_bytes[chunked]),
        ("peak", "peak_bytes", made.peak_bytes["full"] - made.peak_bytes[chunked]),
    ):
        drop = getattr(measured["full"], field) - getattr(measured[chunked], field)
        print(f"{what} drop: measured {drop:,} bytes, predicted {predicted:,} ({100 * (drop - predicted) / predicted:+.2f}%)")


if __name__ == "__main__":
    main()
