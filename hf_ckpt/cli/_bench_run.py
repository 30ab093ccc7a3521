"""``hf-ckpt bench``, run: build the workload, measure the settings, print the table and the checks, write the JSON
and the plot when asked (the parser is :mod:`hf_ckpt.cli.bench`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch
from tqdm.auto import tqdm  # a dependency of transformers

from hf_ckpt.runtime.units import format_bytes, precision_label
from hf_ckpt.measure import report as reporting
from hf_ckpt.measure import workload
from hf_ckpt.measure.bench import environment, run_benchmark, steps_of
from hf_ckpt.measure.settings import BASELINE, parse_settings, upstream_supports
from hf_ckpt.cli._workload import build_workload_from
from hf_ckpt.cli.bench import NAME
from hf_ckpt.cli.errors import CommandError


def default_settings() -> str:
    """``none,full,every_n:2``, each next to the same setting through transformers' own method where it has it."""
    specs = ["none", "full", "upstream:full", "every_n:2"]
    if upstream_supports("every_n:2"):
        specs.append("upstream:every_n:2")
    return ",".join(specs)


def _progress_bar(total: int, enabled: bool | None) -> Any:
    disable = None if enabled is None else not enabled  # None: tqdm shows the bar only on a terminal
    logged = not _is_terminal(sys.stderr)  # forced into a file: keep the final line, update at most once a second
    return tqdm(
        total=total, file=sys.stderr, disable=disable, desc=f"hf-ckpt {NAME}", leave=logged,
        mininterval=1.0 if logged else 0.1,
    )


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _header(info: dict[str, Any], repeat: int, warmup: int, clock: str) -> str:
    model, env = info["model"], info["environment"]
    return (
        f"model: {model['class']} ({model['source']}), {model['layers']} layers, hidden {model['hidden']}, "
        f"{model['parameters']:,} parameters, attention {model['attention']}\n"
        f"batch {model['batch']} x seq {model['seq']}, {precision_label(model['dtype'], model.get('autocast'))} on "
        f"{model['device']}; "
        f"torch {env['torch']}, transformers {env['transformers']}, hf_ckpt {env['hf_ckpt']}, "
        f"{env['cpu_threads']} CPU thread(s)\n"
        f"step time: {'process CPU time' if clock == 'cpu' else 'wall time'}, median of {repeat} interleaved rounds "
        f"after {warmup} warm-up"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt bench``; returns the exit status."""
    chosen = args.settings if args.settings is not None else parse_settings(default_settings())
    device = args.device if args.device is not None else workload.default_device()
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else None)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        clock = args.clock or ("cpu" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall")
        return _run(args, chosen, device, clock)
    finally:
        torch.set_num_threads(previous_threads)


def _run(args: argparse.Namespace, chosen: list, device: Any, clock: str) -> int:
    started = time.perf_counter()
    work = build_workload_from(args, device)
    if not getattr(work.model, "supports_gradient_checkpointing", False):
        raise CommandError(
            f"{type(work.model).__name__} does not support activation checkpointing "
            "(supports_gradient_checkpointing = False): there is nothing to compare",
            exit_code=1,
        )
    info = {"model": work.info, "environment": environment()}
    count = len(chosen) + (0 if any(setting.name == BASELINE for setting in chosen) else 1)
    bar = _progress_bar(steps_of(count, repeat=args.repeat, warmup=args.warmup), args.progress)
    try:
        report = run_benchmark(
            work.model, work.batch, chosen, repeat=args.repeat, warmup=args.warmup, loss_fn=work.loss_fn,
            on_step=lambda label: bar.update(1), info=info, clock=clock,
        )
    finally:
        bar.close()
    report.info["wall_time_s"] = time.perf_counter() - started

    print(_header(info, args.repeat, args.warmup, clock))
    print()
    print(reporting.format_table(report))
    for result in report.results:
        measurement = result.measurement
        elsewhere = {d: b for d, b in measurement.retained_bytes_by_device.items() if d != measurement.device}
        if elsewhere:  # offloaded copies in host memory
            listed = ", ".join(f"{format_bytes(nbytes)} on {where}" for where, nbytes in elsewhere.items())
            print(f"  {result.setting}: also retained {listed}")
    print()
    print("checks:")
    print(reporting.format_checks(report))
    print(f"\nwall time {report.info['wall_time_s']:.1f} s")
    if args.json is not None:
        with open(args.json, "w") as handle:
            json.dump(reporting.to_dict(report), handle, indent=2)
    if args.plot is not None:
        reporting.plot_tradeoff(report, args.plot)
    found = reporting.checks(report)
    unsure = [check.name for check in found if check.verdict == reporting.INCONCLUSIVE]
    if unsure:
        print(f"\n{len(unsure)} timing check(s) INCONCLUSIVE (noisy machine): the "
              f"{reporting.CONFIDENCE:.0%} interval straddles the limit, so these rounds can tell neither a pass nor a "
              "failure. Not a failure (--check exits 0 for it); rerun on a quieter machine or with more --repeat.")
    failed = [check.name for check in found if not check.passed]
    if failed and args.check:
        print(f"hf-ckpt {NAME}: {len(failed)} check(s) failed: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0
