"""The chunked MLP measured against the estimate: a CPU training step of a Llama whose MLP dwarfs its width.

    python benchmarks/mlp_chunk.py [--batch 2] [--seq 256] [--hidden 64] [--intermediate 1024] [--chunk 64]

Every block is checkpointed in each step (``full``); the second runs each block's MLP in checkpointed chunks
(``mlp_chunk_size``), the third the head in chunks too. Prints, for each, the bytes retained at the end of forward and
the peak of the step measured on CPU with the gradients allocated before the step (as the estimate counts them:
whole, apart), the estimator's figures and their error, and the step's wall time (median of three steps).
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
from hf_ckpt.meters.memory import StorageTracker


def _measured(model, ids) -> tuple[int, int]:
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    with StorageTracker() as tracker:
        loss = model(input_ids=ids, labels=ids).loss
        retained = tracker.live_bytes().get("cpu", 0)
        loss.backward()
        del loss
        peak = tracker.peak_bytes().get("cpu", 0)
    return retained, peak


def _seconds(model, ids) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("batch", 2), ("seq", 256), ("hidden", 64), ("intermediate", 1024), ("chunk", 64)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    config = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                                      num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, vocab_size=256,
                                      max_position_embeddings=max(128, args.seq))
    chunk = args.chunk
    made = estimate(config, batch_size=args.batch, seq_len=args.seq, dtype="float32", device="cpu",
                    strategies=("none", "full"), head_chunk_size=chunk, mlp_chunk_size=chunk)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 256, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    print(f"Llama, 4 blocks, hidden {args.hidden}, intermediate {args.intermediate}; batch {args.batch} x seq "
          f"{args.seq}, float32 on cpu")
    print(f"{'setting':<22}{'retained':>12}{'predicted':>12}{'peak':>12}{'predicted':>12}{'error':>8}{'step':>9}")
    for name, options in (("full", {}), (f"full+mlp:{chunk}", {"mlp_chunk_size": chunk}),
                          (f"full+head:{chunk}+mlp:{chunk}", {"mlp_chunk_size": chunk, "head_chunk_size": chunk})):
        hf_ckpt.enable(model, **options)
        retained, peak = _measured(model, ids)
        seconds = _seconds(model, ids)
        hf_ckpt.disable(model)
        predicted = made.peak_bytes[name] - made.fixed_bytes
        print(f"{name:<22}{retained:>12,}{made.activation_bytes[name]:>12,}{peak:>12,}{predicted:>12,}"
              f"{100 * (predicted - peak) / peak:>+7.2f}%{seconds:>8.3f}s")


if __name__ == "__main__":
    main()
