"""Op-level plans against block-level plans, every_n and torch.compile's activation_memory_budget, one run each.

    PYTHONPATH=. python benchmarks/oplevel_budget.py                      # figures: llama, gpt2, bert; 25/50/75%
    PYTHONPATH=. python benchmarks/oplevel_budget.py --models llama --no-compile
    PYTHONPATH=. python benchmarks/oplevel_budget.py --timing --hidden 1024   # step time, oplevel vs plan, interleaved

Figures mode measures one step of every setting on the same model and batch (``hf_ckpt.measure.measure_step``:
retained bytes when forward returns, FLOPs by ``FlopCounterMode``) and checks, per budget F:

* ``oplevel:F`` retains at most F of ``none``'s memory;
* its recompute FLOPs (step FLOPs less ``none``'s) are at most ``plan:F``'s, and strictly less at two budgets or more;
* against ``compile:F``: retained bytes and recompute FLOPs, side by side (not a pass/fail: see the docs).

It writes ``--json`` (and ``--plot`` with matplotlib). Timing mode times ``plan:F`` and ``oplevel:F`` steps
interleaved round-robin (``hf_ckpt.measure.run_benchmark``) and reports the median per-round ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import hf_ckpt
from hf_ckpt.measure import measure_step
from hf_ckpt.measure.bench import run_benchmark
from hf_ckpt.measure.settings import parse_setting
from hf_ckpt.measure.workload import build_workload

BUDGETS = (0.25, 0.5, 0.75)
OPLEVEL = ("none", "selective", "full", "oplevel")
SIZES = {"llama": dict(layers=8, hidden=256), "gpt2": dict(layers=4, hidden=256), "bert": dict(layers=4, hidden=256)}


def _figures(name: str, args: argparse.Namespace) -> dict:
    sizes = dict(SIZES.get(name, dict(layers=6, hidden=256)))
    if args.hidden:
        sizes["hidden"] = args.hidden
    work = build_workload(name, batch=args.batch, seq=args.seq, **sizes)
    model, batch = work.model, work.batch
    specs = ["none", "full", *(f"every_n:{n}" for n in range(2, sizes["layers"] + 1))]
    if not args.no_compile:
        specs.append("compile:1")
    for budget in BUDGETS:
        specs += [f"plan:{budget:g}", f"oplevel:{budget:g}"] + ([] if args.no_compile else [f"compile:{budget:g}"])
    rows = {}
    for spec in specs:
        setting = parse_setting(spec)
        started = time.perf_counter()
        try:
            if setting.prepare is not None:
                setting.prepare(model, batch)
        except RuntimeError as error:
            print(f"  {spec}: skipped: {error}", flush=True)
            continue
        if spec.startswith("compile:"):  # measured in prepare, see hf_ckpt/oplevel/_compiled.py
            retained, flops = setting.details["saved_bytes"], setting.details["graph_flops"]
        else:
            setting.apply(model)
            try:
                measured = measure_step(model, batch, loss_fn=work.loss_fn)
            finally:
                setting.remove(model)
            retained, flops = measured.retained_bytes, measured.flops
        model.zero_grad(set_to_none=True)
        rows[spec] = {
            "retained_bytes": retained,
            "flops": flops,
            "details": {k: v for k, v in setting.details.items()},
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(f"  {spec:<14} retained {retained / 2**20:8.2f} MiB  flops {flops / 1e9:8.3f} G"
              f"  ({rows[spec]['seconds']} s)", flush=True)
        if spec.startswith("compile:") and spec != "compile:1" and not args.no_matched:
            # The same memory as compile:F, in bytes: which recomputes less at equal retained memory?
            started = time.perf_counter()
            try:
                plan = hf_ckpt.plan(model, batch, int(retained), strategies=OPLEVEL, loss_fn=work.loss_fn)
            except ValueError as error:
                print(f"  oplevel@{spec}: no plan: {error}", flush=True)
                continue
            hf_ckpt.enable(model, plan=plan)
            try:
                measured = measure_step(model, batch, loss_fn=work.loss_fn)
            finally:
                hf_ckpt.disable(model)
            model.zero_grad(set_to_none=True)
            matched = f"oplevel@{spec}"
            rows[matched] = {"retained_bytes": measured.retained_bytes, "flops": measured.flops,
                          "details": {"strategies": list(plan.strategies), "budget_bytes": plan.budget_bytes},
                          "seconds": round(time.perf_counter() - started, 1)}
            print(f"  {matched:<14} retained {measured.retained_bytes / 2**20:8.2f} MiB  flops {measured.flops / 1e9:8.3f} G"
                  f"  ({rows[matched]['seconds']} s)", flush=True)
    none = rows["none"]
    for spec, row in rows.items():
        row["fraction"] = row["retained_bytes"] / none["retained_bytes"]
        # compile's graph FLOPs are counted statically: its recompute is relative to compile:1, counted the same way
        reference = rows.get("compile:1", none) if spec.startswith("compile:") else none
        row["recompute_flops"] = row["flops"] - reference["flops"]
    return {"model": name, "info": work.info, "rows": rows}


def _check(result: dict) -> list[str]:
    rows, lines, strictly = result["rows"], [], 0
    for budget in BUDGETS:
        op, block = rows.get(f"oplevel:{budget:g}"), rows.get(f"plan:{budget:g}")
        if op is None or block is None:
            continue
        fits = op["fraction"] <= budget
        no_more = op["recompute_flops"] <= block["recompute_flops"]
        strictly += op["recompute_flops"] < block["recompute_flops"]
        line = (f"{result['model']} {budget:.0%}: oplevel {100 * op['fraction']:.1f}% {op['recompute_flops'] / 1e9:.3f} GFLOP"
                f" | plan {100 * block['fraction']:.1f}% {block['recompute_flops'] / 1e9:.3f} GFLOP")
        compiled = rows.get(f"compile:{budget:g}")
        if compiled is not None:
            line += f" | compile {100 * compiled['fraction']:.1f}% {compiled['recompute_flops'] / 1e9:.3f} GFLOP"
        matched = rows.get(f"oplevel@compile:{budget:g}")
        if matched is not None and compiled is not None:
            line += (f" | oplevel at compile's bytes {100 * matched['fraction']:.1f}% "
                     f"{matched['recompute_flops'] / 1e9:.3f} GFLOP")
        lines.append(f"{'PASS' if fits and no_more else 'FAIL'} {line}")
    lines.append(f"{'PASS' if strictly >= 2 else 'FAIL'} {result['model']}: oplevel strictly cheaper than plan at {strictly} budgets")
    return lines


def _plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    styles = {"every_n": ("o", "#999999"), "full": ("o", "#999999"), "plan": ("s", "#3b7dd8"),
              "oplevel": ("D", "#d84b3b"), "compile": ("^", "#2a9d55"), "none": ("o", "black")}
    for ax, result in zip(axes[0], results):
        seen = set()
        for spec, row in result["rows"].items():
            kind = spec.split(":")[0]
            marker, color = styles.get(kind, ("x", "black"))
            label = {"every_n": "every_n / full", "full": "every_n / full"}.get(kind, kind)
            ax.scatter(100 * row["fraction"], row["recompute_flops"] / 1e9, marker=marker, color=color,
                       label=None if label in seen else label)
            seen.add(label)
            if kind in ("plan", "oplevel", "compile"):
                ax.annotate(spec.split(":")[1], (100 * row["fraction"], row["recompute_flops"] / 1e9), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        for budget in BUDGETS:
            ax.axvline(100 * budget, color="#dddddd", linewidth=0.8, zorder=0)
        info = result["info"]
        ax.set_title(f"{result['model']} ({info.get('layers')} layers, hidden {info.get('hidden')}, seq {info.get('seq')})")
        ax.set_xlabel("retained activation memory, % of none")
        ax.set_ylabel("recompute GFLOP per step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _timing(args: argparse.Namespace) -> None:
    work = build_workload(args.models[0], layers=args.layers or 4, hidden=args.hidden or 1024, batch=args.batch, seq=args.seq)
    print(f"timing {work.info}; nice {os.nice(0)}; load average {os.getloadavg()}", flush=True)
    specs = []
    for budget in args.budgets:
        specs += [f"plan:{budget:g}", f"oplevel:{budget:g}"]
    report = run_benchmark(work.model, work.batch, specs, repeat=args.repeat, warmup=1, loss_fn=work.loss_fn,
                           clock=args.clock)
    for budget in args.budgets:
        block, op = report[f"plan:{budget:g}"], report[f"oplevel:{budget:g}"]
        ratios = [o / b for o, b in zip(op.step_times_s, block.step_times_s)]
        print(f"{budget:.0%}: plan {statistics.median(block.step_times_s) * 1e3:.1f} ms  oplevel "
              f"{statistics.median(op.step_times_s) * 1e3:.1f} ms  median ratio oplevel/plan {statistics.median(ratios):.4f}"
              f"  (rounds: {', '.join(f'{r:.3f}' for r in ratios)})  plan {block.details.get('strategies')}"
              f"  oplevel {op.details.get('strategies')}", flush=True)
    print(f"load average after {os.getloadavg()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama", "gpt2", "bert"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--no-compile", action="store_true", help="leave out compile:F")
    parser.add_argument("--no-matched", action="store_true", help="leave out oplevel planned at compile:F's bytes")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--plot", default=None, help="draw memory vs recompute FLOPs here (needs matplotlib)")
    parser.add_argument("--timing", action="store_true", help="time plan:F against oplevel:F instead")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS), help="timing mode: the budgets")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.timing:
        _timing(args)
        return 0
    results, lines = [], []
    for name in args.models:
        print(f"{name}:", flush=True)
        results.append(_figures(name, args))
        lines += _check(results[-1])
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "results": results}, indent=1) + "\n")
    if args.plot:
        _plot(results, args.plot)
    return 0 if all(line.startswith("PASS") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
