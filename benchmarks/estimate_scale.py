"""Cost of ``hf_ckpt.estimate`` at scale: Llama-3.1-70B at batch 1 x seq 8192, bf16, estimate and a 40GiB plan.

Prints the wall time and the peak resident memory of this process (the targets: at most 60 s on 2 CPU cores and
2 GiB), then the estimate and the plan. Run it as its own process so the peak RSS is this work's alone:

    PYTHONPATH=. python benchmarks/estimate_scale.py [--config tests/data/configs/llama-3.1-70b.json]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(HERE, "..", "tests", "data", "configs", "llama-3.1-70b.json"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--budget", default="40GiB")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    from hf_ckpt.estimation import estimate, plan_from_estimate

    imported = time.perf_counter()
    made = estimate(args.config, batch_size=args.batch, seq_len=args.seq, dtype="bfloat16", device="cuda")
    estimated = time.perf_counter()
    plan = plan_from_estimate(made, args.budget)
    planned = time.perf_counter()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    total = planned - started
    print(f"{os.path.basename(args.config)}: batch {args.batch} x seq {args.seq}, bf16, {args.threads} threads "
          f"({os.cpu_count()} CPUs on this machine)")
    print(f"wall time: {total:.1f} s (imports {imported - started:.1f} s, estimate {estimated - imported:.1f} s, "
          f"plan {planned - estimated:.2f} s); target <= 60 s: {'met' if total <= 60 else 'MISSED'}")
    print(f"peak RSS: {peak_rss / 2**30:.2f} GiB; target <= 2 GiB: {'met' if peak_rss <= 2 * 2**30 else 'MISSED'}")
    print(made)
    counts = {s: plan.strategies.count(s) for s in ("full", "selective", "none")}
    ratio = (made.step_flops["none"] + plan.predicted_recompute_flops) / made.step_flops["none"]
    print(f"{args.budget} activation plan: {counts['full']} full, {counts['selective']} selective, {counts['none']} "
          f"none; predicted activations {plan.predicted_bytes / 2**30:.2f} GiB, FLOPs ratio {ratio:.3f}x")
    return 0 if total <= 60 and peak_rss <= 2 * 2**30 else 1


if __name__ == "__main__":
    sys.exit(main())
