"""Where an op-level policy's step time goes: selective-checkpoint dispatch per op, against plain checkpointing.

    PYTHONPATH=. python benchmarks/oplevel_overhead.py                       # tiny Llama: overhead dominates
    PYTHONPATH=. python benchmarks/oplevel_overhead.py --hidden 1024 --layers 2 --seq 256 --repeat 7

Every block gets the same setting; steps of all settings are interleaved round-robin (process CPU time, one
thread) and each setting's median ratio to ``full`` is printed, with the number of ops one block dispatches, so
the overhead per op follows:

* ``full``: plain checkpointing, the reference;
* ``oplevel:empty``: an op-level policy that keeps nothing (bound as plain checkpointing);
* ``oplevel:selective``: an op-level policy keeping exactly the ops ``strategy="selective"`` keeps;
* ``selective``: the block-level selective policy (same saved ops, hf_ckpt's policy-function guard);
* ``oplevel:all``: the frontier's last point (every op whose recompute costs anything), the least recompute.

It also prints, from cProfile over a few steps of ``oplevel:selective``, the time in the policy function and in
hf_ckpt's in-place guard.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys

import torch

import hf_ckpt
from hf_ckpt.meters.step import training_step
from hf_ckpt.measure.timing import CLOCKS, interleaved_step_times
from hf_ckpt.measure.workload import build_workload
from hf_ckpt.planning.menus.oplevel import profile_ops
from hf_ckpt.planning.menus.frontier import frontier


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    work = build_workload(args.model, layers=args.layers, hidden=args.hidden, batch=args.batch, seq=args.seq)
    model, batch = work.model, work.batch
    profiles = profile_ops(model, batch, loss_fn=work.loss_fn)
    if len(profiles) != 1:
        raise SystemExit(f"expected one block type, got {len(profiles)}")
    profile = profiles[0]
    n = len(hf_ckpt.runtime.blocks.find_blocks(model))
    selective = tuple(op.key for op in profile.ops if op.selective)
    plans = {
        "full": hf_ckpt.CheckpointPlan(strategies=("full",) * n),
        "oplevel:empty": hf_ckpt.CheckpointPlan(strategies=("oplevel:e",) * n, policies={"e": ()}),
        "oplevel:selective": hf_ckpt.CheckpointPlan(strategies=("oplevel:s",) * n, policies={"s": selective}),
        "selective": hf_ckpt.CheckpointPlan(strategies=("selective",) * n),
        "oplevel:all": hf_ckpt.CheckpointPlan(strategies=("oplevel:a",) * n, policies={"a": frontier(profile)[-1].saved}),
    }
    times = interleaved_step_times(
        list(plans), lambda name: training_step(model, batch, work.loss_fn), repeat=args.repeat, warmup=2,
        before=lambda name: hf_ckpt.enable(model, plan=plans[name]), after=lambda name: hf_ckpt.disable(model),
        clock=CLOCKS["cpu"],
    )
    print(f"{work.info['class']}: {n} layers, hidden {args.hidden}, batch {args.batch} x seq {args.seq}; "
          f"{len(profile.ops)} ops per block forward; process CPU time, {args.repeat} interleaved rounds")
    reference = times["full"]
    for name, values in times.items():
        ratios = sorted(t / r for t, r in zip(values, reference))
        extra_us = (statistics.median(values) - statistics.median(reference)) * 1e6
        print(f"  {name:<18} {statistics.median(values) * 1e3:9.2f} ms  ratio to full: median {statistics.median(ratios):.3f} "
              f"(range {ratios[0]:.3f}..{ratios[-1]:.3f})  {extra_us / (n * len(profile.ops)):+8.1f} us per op")
    hf_ckpt.enable(model, plan=plans["oplevel:selective"])
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        training_step(model, batch, work.loss_fn)
    profiler.disable()
    hf_ckpt.disable(model)
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    for label, needle in (("policy function (_Counting.__call__)", "__call__"), ("in-place guard", "__torch_dispatch__")):
        own = [(key, value) for key, value in stats.stats.items()
               if key[2] == needle and ("_policy.py" in key[0] or "selective.py" in key[0])]
        seconds = sum(value[2] for _, value in own)  # own time
        print(f"  cProfile, oplevel:selective, 5 steps: {label}: {seconds * 1e3:.1f} ms own time of {total * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
