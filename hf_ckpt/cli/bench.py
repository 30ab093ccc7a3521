"""``hf-ckpt bench``: the measured trade-off of checkpointing settings for one model and batch.

Builds the workload, runs :func:`~hf_ckpt.measure.run_benchmark` (a progress bar on stderr when it is a terminal,
or with ``--progress``), prints the table and the checks, and writes the JSON and the plot when asked. Exit status
0, or with ``--check`` 1 when any check fails (a timing check inconclusive on a noisy machine is no failure); 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from hf_ckpt import measure
from hf_ckpt.cli.arguments import (
    add_workload_arguments, build_workload_from, converter, non_negative_int, output_file, png_file, positive_int,
)
from hf_ckpt.cli.errors import CommandError
from hf_ckpt.runtime.util.units import format_bytes, precision_label

NAME = "bench"
HELP = "measure the memory, compute and time trade-off of checkpointing settings"

DEFAULT_REPEAT = 25
DEFAULT_WARMUP = 1
#: The built-in setting spellings, for ``--help`` without importing torch (a test keeps this equal to
#: ``hf_ckpt.measure.available_settings()``).
SETTING_SYNTAX = "none, full, every_n:N, offload, head:N, mlp:N, upstream:full|upstream:every_n:N, selective[:POLICY], plan:F, oplevel:F, graphplan:F, compile:F, compile_seeded:F"


def settings(text: str) -> list:
    """``--settings``: the settings :func:`hf_ckpt.measure.parse_settings` reads in the text."""
    return converter(measure.settings.parse_settings)(text)  # torch loads when the option is given, not for --help


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``hf-ckpt bench``'s options."""
    add_workload_arguments(parser)
    add = parser.add_argument
    add(
        "--settings",
        type=settings,
        default=None,
        help="the named configurations to compare, comma-separated (default: "
        "none,full,upstream:full,every_n:2[,upstream:every_n:2]); none is always measured. Available: "
        f"{SETTING_SYNTAX} (hf_ckpt.measure.available_settings() describes each)",
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
    add(
        "--check",
        action="store_true",
        help="exit with status 1 when any check fails (for CI); a timing check whose 95%% interval straddles its "
        "limit is inconclusive (noisy machine), not a failure; default: always 0",
    )
    add("--json", metavar="PATH", type=output_file, help="also write every figure as JSON to PATH")
    add(
        "--plot",
        metavar="PATH",
        type=png_file,
        help="also write a PNG to PATH: memory against step time, Pareto front drawn (needs matplotlib)",
    )
    add(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr; shown by default when stderr is a terminal, --progress shows it when "
        "stderr is redirected too, --no-progress never",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt bench``; returns the exit status."""
    # Imported when the command runs: the bench loads torch and transformers (hf_ckpt.measure loads a name on its
    # first use), --help must not.
    import torch
    from tqdm.auto import tqdm  # a dependency of transformers

    chosen = args.settings if args.settings is not None else measure.settings.parse_settings(default_settings())
    device = args.device if args.device is not None else measure.workload.default_device()
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else None)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        clock = args.clock or ("cpu" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall")
        started = time.perf_counter()
        work = build_workload_from(args, device)
        _refuse_without_checkpointing(work.model)
        info = {"model": work.info, "environment": measure.bench.environment()}
        count = len(chosen) + (0 if any(setting.name == measure.settings.BASELINE for setting in chosen) else 1)
        steps = measure.bench.steps_of(count, repeat=args.repeat, warmup=args.warmup)
        bar = _progress_bar(tqdm, steps, args.progress)
        try:
            report = measure.bench.run_benchmark(
                work.model, work.batch, chosen, repeat=args.repeat, warmup=args.warmup, loss_fn=work.loss_fn,
                on_step=lambda label: bar.update(1), info=info, clock=clock,
            )
        finally:
            bar.close()
        report.info["wall_time_s"] = time.perf_counter() - started
        return _report(args, report, clock)
    finally:
        torch.set_num_threads(previous_threads)


def default_settings() -> str:
    """``none,full,every_n:2``, each next to the same setting through transformers' own method where it has it."""
    specs = ["none", "full", "upstream:full", "every_n:2"]
    if measure.settings.upstream_supports("every_n:2"):
        specs.append("upstream:every_n:2")
    return ",".join(specs)


def _refuse_without_checkpointing(model: Any) -> None:
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise CommandError(
            f"{type(model).__name__} does not support activation checkpointing "
            "(supports_gradient_checkpointing = False): there is nothing to compare",
            exit_code=1,
        )


def _progress_bar(tqdm: Any, total: int, enabled: bool | None) -> Any:
    """A ``tqdm`` bar of ``total`` steps on stderr (``tqdm``: the class, imported by :func:`run`)."""
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


def _report(args: argparse.Namespace, report: Any, clock: str) -> int:
    """Print the table and the checks, write the JSON and the plot when asked; the exit status."""
    print(_header(report.info, args.repeat, args.warmup, clock))
    print()
    reporting = measure.report
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
