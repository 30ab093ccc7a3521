"""Op-level plans against block-level plans, every_n and torch.compile's activation_memory_budget, one run each.

    PYTHONPATH=. python benchmarks/oplevel_budget.py                      # figures: llama, gpt2, bert; 25/50/75%
    PYTHONPATH=. python benchmarks/oplevel_budget.py --models llama --no-compile
    PYTHONPATH=. python benchmarks/oplevel_budget.py --timing --hidden 1024 --clock cpu  # step time, interleaved
    PYTHONPATH=. python benchmarks/oplevel_budget.py --partition   # op-level plans may also partition blocks' graphs
    PYTHONPATH=. python benchmarks/oplevel_budget.py --partition --outside  # ... and recompute cheap modules between them

Figures mode measures one step of every setting on the same model and batch (``hf_ckpt.measure.measure_step``:
retained bytes when forward returns, FLOPs by ``FlopCounterMode``; then ``count_flops().elementwise``: one per
output element of every op without a FLOP formula, the recompute FLOP counts are blind to), with
``use_cache=False`` for every row, and checks, per budget F:

* ``oplevel:F`` retains at most F of ``none``'s memory (PASS/FAIL);
* its recompute (step less ``none``'s) is at most ``plan:F``'s in FLOPs and in FLOPs + elementwise elements, and
  strictly less in the latter at two budgets or more (PASS/FAIL);
* against ``compile:F`` (inductor, ``activation_memory_budget=F``, measured by saved-tensor hooks and graph
  counts): at the same F, and at equal memory (``oplevel@compile:F`` and ``plan@compile:F``: plans made for
  compile's measured bytes). PASS where op-level is no worse, INFO where compile is better (see the docs: why).
  Where compile's backward draws random ops afresh (its dropout masks are not the forward's: pytorch/pytorch#190758)
  the row says how many, and ``compile_seeded:F`` (the seeds kept for backward, a correct compile) is measured
  too, with plans made for its bytes.

It writes ``--json`` (and ``--plot`` with matplotlib) and prints a Markdown table. Exit status 1 on a FAIL.
Timing mode times ``plan:F`` and ``oplevel:F`` steps interleaved round-robin (``hf_ckpt.measure.run_benchmark``)
and reports the median per-round ratio, its quartiles and range.
"""

from __future__ import annotations

import argparse
import inspect
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
from hf_ckpt.meters.flops import count_flops
from hf_ckpt.meters.step import training_step
from hf_ckpt.measure.settings import parse_setting
from hf_ckpt.measure.workload import build_workload
from hf_ckpt.measure._compiled import CompiledReference

BUDGETS = (0.25, 0.5, 0.75)
OPLEVEL = ("none", "selective", "full", "oplevel")
BLOCK = ("none", "selective", "full")
SIZES = {"llama": dict(layers=8, hidden=256), "gpt2": dict(layers=4, hidden=256), "bert": dict(layers=4, hidden=256)}


def _eager(model, batch, loss_fn) -> tuple[int, int, int]:
    """(retained bytes, matmul-class FLOPs, elementwise output elements) of one step of the model as it is."""
    measured = measure_step(model, batch, loss_fn=loss_fn)
    torch.manual_seed(0)
    model.zero_grad(set_to_none=True)
    with count_flops() as counted:
        training_step(model, batch, loss_fn)
    if counted.total != measured.flops:
        raise RuntimeError(f"two steps of one setting counted different FLOPs: {counted.total} vs {measured.flops}")
    return measured.retained_bytes, measured.flops, counted.elementwise


def _compiled(model, batch, loss_fn, budget: float, keep_random: bool = False) -> tuple[tuple[int, int, int], dict]:
    """The same for torch.compile with activation_memory_budget (saved-tensor bytes, graph counts), and how many
    random ops its backward draws afresh (pytorch/pytorch#190758); ``keep_random``: ``compile_seeded:F``."""
    reference = CompiledReference(budget, keep_random=keep_random)
    reference.prepare(model, batch, lambda: training_step(model, batch, loss_fn))
    saved, flops = reference.measure(model, batch, loss_fn)
    return (saved, flops, sum(reference.graph_elementwise)), {"backward_random": reference.backward_random}


def _row(rows: dict, spec: str, measured: tuple[int, int, int], details: dict, started: float) -> None:
    retained, flops, elementwise = measured
    rows[spec] = {"retained_bytes": retained, "flops": flops, "elementwise": elementwise, "details": details,
                  "seconds": round(time.perf_counter() - started, 1)}
    print(f"  {spec:<18} retained {retained / 2**20:8.2f} MiB  flops {flops / 1e9:8.3f} G"
          f"  elementwise {elementwise / 1e6:8.3f} M  ({rows[spec]['seconds']} s)", flush=True)


def _plan_details(plan) -> dict:
    return {"strategies": list(plan.strategies), "policies": {k: list(v) for k, v in plan.policies.items()},
            "budget_bytes": plan.budget_bytes, "predicted_bytes": plan.predicted_bytes,
            "outside_blocks": list(plan.outside_blocks)}


def _figures(name: str, args: argparse.Namespace) -> dict:
    oplevel = (*OPLEVEL, *(("partition",) if args.partition else ()), *(("outside",) if args.outside else ()))
    sizes = dict(SIZES.get(name, dict(layers=6, hidden=256)))
    if args.hidden:
        sizes["hidden"] = args.hidden
    work = build_workload(name, batch=args.batch, seq=args.seq, **sizes)
    model, batch, loss_fn = work.model, dict(work.batch), work.loss_fn
    if "use_cache" in inspect.signature(model.forward).parameters:
        batch["use_cache"] = False  # the same for every row: no cache writes in `none`'s step either
    rows: dict = {}
    specs = ["none", "full", *(f"every_n:{n}" for n in range(2, sizes["layers"] + 1))]
    for spec in specs:
        started = time.perf_counter()
        setting = parse_setting(spec)
        setting.apply(model)
        try:
            _row(rows, spec, _eager(model, batch, loss_fn), {}, started)
        finally:
            setting.remove(model)
    compile_ok = not args.no_compile
    if compile_ok:
        try:
            started = time.perf_counter()
            _row(rows, "compile:1", *_compiled(model, batch, loss_fn, 1.0), started)
        except RuntimeError as error:
            print(f"  compile: skipped: {error}", flush=True)
            compile_ok = False
    for budget in BUDGETS:
        for label, strategies in ((f"plan:{budget:g}", BLOCK), (f"oplevel:{budget:g}", oplevel)):
            started = time.perf_counter()
            plan = hf_ckpt.plan(model, batch, budget, strategies=strategies, loss_fn=loss_fn)
            hf_ckpt.enable(model, plan=plan)
            try:
                _row(rows, label, _eager(model, batch, loss_fn), _plan_details(plan), started)
            finally:
                hf_ckpt.disable(model)
        if not compile_ok:
            continue
        spec = f"compile:{budget:g}"
        started = time.perf_counter()
        _row(rows, spec, *_compiled(model, batch, loss_fn, budget), started)
        references = [spec]
        if rows[spec]["details"]["backward_random"]:
            # Its gradients are wrong (fresh dropout masks in backward): compare with a correct compile too.
            started = time.perf_counter()
            references.append(f"compile_seeded:{budget:g}")
            _row(rows, references[-1], *_compiled(model, batch, loss_fn, budget, keep_random=True), started)
        if not args.no_matched:
            for reference in references:
                _matched(rows, reference, model, batch, loss_fn, oplevel)
    none = rows["none"]
    for spec, row in rows.items():
        row["fraction"] = row["retained_bytes"] / none["retained_bytes"]
        # compile's graphs are counted statically: its recompute is relative to compile:1, counted the same way
        reference = rows.get("compile:1", none) if spec.startswith("compile") else none
        row["recompute_flops"] = row["flops"] - reference["flops"]
        row["recompute_elementwise"] = row["elementwise"] - reference["elementwise"]
    return {"model": name, "info": work.info, "rows": rows}


def _matched(rows: dict, reference: str, model, batch, loss_fn, oplevel: tuple) -> None:
    """Equal memory: plans made for ``reference``'s measured bytes (an int budget)."""
    for label, strategies in ((f"plan@{reference}", BLOCK), (f"oplevel@{reference}", oplevel)):
        started = time.perf_counter()
        try:
            plan = hf_ckpt.plan(model, batch, int(rows[reference]["retained_bytes"]), strategies=strategies,
                                loss_fn=loss_fn)
        except ValueError as error:
            print(f"  {label}: no plan: {error}", flush=True)
            continue
        hf_ckpt.enable(model, plan=plan)
        try:
            _row(rows, label, _eager(model, batch, loss_fn), _plan_details(plan), started)
        finally:
            hf_ckpt.disable(model)


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    return (f"{100 * row['fraction']:.1f}%, {row['recompute_flops'] / 1e9:.3f} G, "
            f"{row['recompute_elementwise'] / 1e6:.2f} M")


def _cost(row: dict) -> int:
    return row["recompute_flops"] + row["recompute_elementwise"]


def _check(result: dict) -> list[str]:
    rows, lines, strictly = result["rows"], [], 0
    model = result["model"]
    for budget in BUDGETS:
        op, block = rows.get(f"oplevel:{budget:g}"), rows.get(f"plan:{budget:g}")
        if op is None or block is None:
            continue
        fits = op["fraction"] <= budget
        no_more = op["recompute_flops"] <= block["recompute_flops"] and _cost(op) <= _cost(block)
        strictly += _cost(op) < _cost(block)
        lines.append(f"{'PASS' if fits and no_more else 'FAIL'} {model} {budget:.0%}: oplevel {_cell(op)} | "
                     f"plan {_cell(block)}  (retained %, recompute GFLOP, recompute M elementwise)")
        compiled = rows.get(f"compile:{budget:g}")
        if compiled is not None:
            same_f = op["fraction"] <= compiled["fraction"] and op["recompute_flops"] <= compiled["recompute_flops"]
            lines.append(f"{'INFO' if not same_f else 'PASS'} {model} {budget:.0%} same F: compile {_cell(compiled)} "
                         f"| oplevel {_cell(op)}")
            lines += _equal_memory(rows, f"{model} {budget:.0%}", f"compile:{budget:g}")
            fresh = compiled["details"].get("backward_random", 0)
            if fresh:
                lines.append(f"INFO {model} {budget:.0%}: compile:{budget:g}'s backward draws {fresh} random op(s) "
                             "afresh (pytorch/pytorch#190758): its gradients are wrong; a correct compile keeps "
                             "the seeds (compile_seeded)")
                lines += _equal_memory(rows, f"{model} {budget:.0%}", f"compile_seeded:{budget:g}")
    lines.append(f"{'PASS' if strictly >= 2 else 'FAIL'} {model}: oplevel's recompute (GFLOP + elementwise) strictly "
                 f"below the block-level plan's at {strictly} budgets")
    return lines


def _equal_memory(rows: dict, where: str, reference: str) -> list[str]:
    compiled, matched = rows.get(reference), rows.get(f"oplevel@{reference}")
    if compiled is None or matched is None:
        return []
    equal = matched["recompute_flops"] <= compiled["recompute_flops"]
    return [f"{'PASS' if equal else 'INFO'} {where} equal memory: {reference} {_cell(compiled)} | oplevel at its "
            f"bytes {_cell(matched)} | block-level plan at its bytes {_cell(rows.get(f'plan@{reference}'))}"]


def _markdown(results: list[dict]) -> str:
    header = ("| model | budget | plan (block-level) | oplevel | compile:F | random drawn afresh | oplevel at "
              "compile's bytes | compile_seeded:F | oplevel at its bytes |\n|---|---:|---|---|---|---:|---|---|---|")
    lines = [header]
    for result in results:
        rows = result["rows"]
        for budget in BUDGETS:
            compiled = rows.get(f"compile:{budget:g}")
            fresh = "-" if compiled is None else str(compiled["details"].get("backward_random", 0))
            cells = [_cell(rows.get(f"{kind}:{budget:g}")) for kind in ("plan", "oplevel", "compile")]
            cells += [fresh, _cell(rows.get(f"oplevel@compile:{budget:g}")),
                      _cell(rows.get(f"compile_seeded:{budget:g}")), _cell(rows.get(f"oplevel@compile_seeded:{budget:g}"))]
            lines.append(f"| {result['model']} | {budget:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(5 * len(results), 7.5), squeeze=False)
    styles = {"every_n": ("o", "#999999"), "full": ("o", "#999999"), "plan": ("s", "#3b7dd8"),
              "oplevel": ("D", "#d84b3b"), "compile": ("^", "#2a9d55"), "none": ("o", "black"),
              "oplevel@compile": ("d", "#f2a541"), "plan@compile": ("s", "#9ec3f0"),
              "compile_seeded": ("v", "#115e33"), "oplevel@compile_seeded": ("d", "#b3701d"),
              "plan@compile_seeded": ("s", "#6f95c4")}
    for column, result in enumerate(results):
        for row_index, (key, scale, unit) in enumerate((("recompute_flops", 1e9, "recompute GFLOP per step"),
                                                         ("recompute_elementwise", 1e6, "recompute elementwise, M elements"))):
            ax = axes[row_index][column]
            seen = set()
            for spec, row in result["rows"].items():
                kind = spec.rsplit(":", 1)[0] if "@" in spec else spec.split(":")[0]
                marker, color = styles.get(kind, ("x", "black"))
                label = {"every_n": "every_n / full", "full": "every_n / full"}.get(kind, kind)
                ax.scatter(100 * row["fraction"], row[key] / scale, marker=marker, color=color,
                           label=None if label in seen else label, zorder=3)
                seen.add(label)
                if kind in ("plan", "oplevel", "compile", "compile_seeded"):
                    ax.annotate(spec.split(":")[-1], (100 * row["fraction"], row[key] / scale), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
            for budget in BUDGETS:
                ax.axvline(100 * budget, color="#dddddd", linewidth=0.8, zorder=0)
            info = result["info"]
            ax.set_title(f"{result['model']} ({info.get('layers')} layers, hidden {info.get('hidden')}, "
                         f"seq {info.get('seq')})", fontsize=9)
            ax.set_xlabel("retained activation memory, % of none")
            ax.set_ylabel(unit)
            if row_index == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _timing(args: argparse.Namespace) -> None:
    work = build_workload(args.models[0], layers=args.layers or 4, hidden=args.hidden or 1024, batch=args.batch, seq=args.seq)
    print(f"timing {work.info}; nice {os.nice(0)}; load average {os.getloadavg()}", flush=True)
    specs = []
    for budget in args.budgets:
        specs += [f"plan:{budget:g}", f"{'graphplan' if args.partition else 'oplevel'}:{budget:g}"]
    report = run_benchmark(work.model, work.batch, specs, repeat=args.repeat, warmup=1, loss_fn=work.loss_fn,
                           clock=args.clock)
    for budget in args.budgets:
        block, op = report[f"plan:{budget:g}"], report[f"{'graphplan' if args.partition else 'oplevel'}:{budget:g}"]
        ratios = sorted(o / b for o, b in zip(op.step_times_s, block.step_times_s))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
        print(f"{budget:.0%}: plan {statistics.median(block.step_times_s) * 1e3:.1f} ms  oplevel "
              f"{statistics.median(op.step_times_s) * 1e3:.1f} ms  ratio oplevel/plan: median "
              f"{statistics.median(ratios):.4f}, quartiles {quartiles[0]:.4f}..{quartiles[2]:.4f}, "
              f"range {ratios[0]:.4f}..{ratios[-1]:.4f} over {len(ratios)} rounds", flush=True)
        for label, result in (("plan", block), ("oplevel", op)):
            print(f"    {label}: {result.details.get('strategies')}; recompute "
                  f"{(result.measurement.flops - report.baseline.measurement.flops) / 1e9:.3f} GFLOP", flush=True)
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
    parser.add_argument("--partition", action="store_true",
                        help="op-level plans may also split blocks' graphs with the min-cut partitioner ('partition')")
    parser.add_argument("--outside", action="store_true",
                        help="op-level plans may also recompute cheap modules between the blocks ('outside')")
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
    print(_markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "results": results}, indent=1) + "\n")
    if args.plot:
        _plot(results, args.plot)
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
