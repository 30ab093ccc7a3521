"""``hf-ckpt bench``: the measured trade-off of checkpointing strategies for one model and batch.

Registered as a subcommand by :mod:`hf_ckpt.cli`. Builds the workload, runs
:func:`~hf_ckpt.measure.bench.run_benchmark` with a progress bar on stderr, prints the table and the checks, and
writes the JSON and the plot when asked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

from ..cli import CommandError
from . import workload as _workload
from .arguments import add_workload_arguments, build_workload_from, converter, non_negative_int, positive_int
from .bench import environment, run_benchmark, steps_of
from .report import format_checks, format_table, plot_tradeoff, to_dict
from .strategies import available_strategies, parse_strategies, upstream_supports

DEFAULT_REPEAT = 25
DEFAULT_WARMUP = 1


def default_strategies() -> str:
    """``none,full,every_n:2``, each next to the same setting through transformers' own method where it has it."""
    specs = ["none", "full", "upstream:full", "every_n:2"]
    if upstream_supports("every_n:2"):
        specs.append("upstream:every_n:2")
    return ",".join(specs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``hf-ckpt bench``'s options."""
    strategies = "; ".join(f"{syntax}: {text}" for syntax, text in available_strategies().items())
    add_workload_arguments(parser)
    add = parser.add_argument
    add(
        "--strategies",
        type=converter(parse_strategies),
        default=None,
        help="comma-separated (default: none,full,upstream:full,every_n:2[,upstream:every_n:2]); none is always "
        f"measured. Available: {strategies}",
    )
    add("--repeat", type=positive_int, default=DEFAULT_REPEAT, help="timed rounds (default %(default)s)")
    add("--warmup", type=non_negative_int, default=DEFAULT_WARMUP, help="untimed rounds first (default %(default)s)")
    add(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads for the run (default: 1 on a CPU device, where multi-threaded timings swing with any "
        "other load on the cores; torch's default otherwise)",
    )
    add(
        "--clock",
        choices=("wall", "cpu"),
        default=None,
        help="what step times measure: wall time, or the process's CPU time (default: cpu on a CPU device run "
        "with one thread, where it equals idle-machine wall time and is far less sensitive to other load; "
        "wall otherwise)",
    )
    add("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    add("--plot", metavar="PATH", help="also write a PNG: memory against step time, Pareto front drawn")
    add(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )


def _check_output_path(option: str, path: str | None) -> None:
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CommandError(f"{option} {path}: directory {directory} does not exist")


def _progress_bar(total: int, enabled: bool | None) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional: no bar
        return None
    disable = None if enabled is None else not enabled  # None: tqdm shows the bar only on a terminal
    return tqdm(total=total, file=sys.stderr, disable=disable, desc="hf-ckpt bench", leave=False)


def _header(info: dict[str, Any], repeat: int, warmup: int, clock: str) -> str:
    model, env = info["model"], info["environment"]
    return (
        f"model: {model['class']} ({model['source']}), {model['layers']} layers, hidden {model['hidden']}, "
        f"{model['parameters']:,} parameters, attention {model['attention']}\n"
        f"batch {model['batch']} x seq {model['seq']}, {model['dtype']} on {model['device']}; "
        f"torch {env['torch']}, transformers {env['transformers']}, hf_ckpt {env['hf_ckpt']}, "
        f"{env['cpu_threads']} CPU thread(s)\n"
        f"step time: {'process CPU time' if clock == 'cpu' else 'wall time'}, median of {repeat} interleaved rounds "
        f"after {warmup} warm-up"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt bench``; returns the exit status."""
    _check_output_path("--json", args.json)
    _check_output_path("--plot", args.plot)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CommandError("--plot needs matplotlib: pip install 'hf_ckpt[bench]'") from None
    strategies = args.strategies if args.strategies is not None else parse_strategies(default_strategies())
    device = args.device if args.device is not None else _workload.default_device()

    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else None)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        clock = args.clock or ("cpu" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall")
        return _run(args, strategies, device, clock)
    finally:
        torch.set_num_threads(previous_threads)


def _run(args: argparse.Namespace, strategies: list, device: torch.device, clock: str) -> int:
    started = time.perf_counter()
    work = build_workload_from(args, device)
    if not getattr(work.model, "supports_gradient_checkpointing", False):
        raise CommandError(
            f"{type(work.model).__name__} does not support activation checkpointing "
            "(supports_gradient_checkpointing = False): there is nothing to compare",
            exit_code=1,
        )
    info = {"model": work.info, "environment": environment()}
    count = len(strategies) + (0 if any(strategy.name == "none" for strategy in strategies) else 1)
    bar = _progress_bar(steps_of(count, repeat=args.repeat, warmup=args.warmup), args.progress)
    try:
        report = run_benchmark(
            work.model,
            work.batch,
            strategies,
            repeat=args.repeat,
            warmup=args.warmup,
            loss_fn=work.loss_fn,
            on_step=(lambda label: bar.update(1)) if bar is not None else None,
            info=info,
            clock=clock,
        )
    finally:
        if bar is not None:
            bar.close()
    report.info["wall_time_s"] = time.perf_counter() - started

    print(_header(info, args.repeat, args.warmup, clock))
    print()
    print(format_table(report))
    for result in report.results:
        measurement = result.measurement
        elsewhere = {d: b for d, b in measurement.retained_bytes_by_device.items() if d != measurement.device}
        if elsewhere:  # offloaded copies in host memory
            listed = ", ".join(f"{nbytes / 2**20:.2f} MiB on {device}" for device, nbytes in elsewhere.items())
            print(f"  {result.strategy}: also retained {listed}")
    print()
    print("checks:")
    print(format_checks(report))
    print(f"\nwall time {report.info['wall_time_s']:.1f} s")
    if args.json is not None:
        with open(args.json, "w") as handle:
            json.dump(to_dict(report), handle, indent=2)
    if args.plot is not None:
        plot_tradeoff(report, args.plot)
    return 0
