"""``hf-ckpt bench``: the measured trade-off of checkpointing settings for one model and batch.

The parser; the run is :mod:`hf_ckpt.cli._bench_run`. Builds the workload, runs :func:`~hf_ckpt.measure.run_benchmark` (a progress bar on stderr when it is a terminal,
or with ``--progress``), prints the table and the checks, and writes the JSON and the plot when asked. Exit status
0, or with ``--check`` 1 when any check fails (a timing check inconclusive on a noisy machine is no failure); 2 for
bad arguments.
"""

from __future__ import annotations

import argparse

from hf_ckpt.cli._lazy import converter, runner
from hf_ckpt.cli.arguments import add_workload_arguments, non_negative_int, output_file, png_file, positive_int

NAME = "bench"
HELP = "measure the memory, compute and time trade-off of checkpointing settings"

DEFAULT_REPEAT = 25
DEFAULT_WARMUP = 1
#: The built-in setting spellings, for ``--help`` without importing torch (a test keeps this equal to
#: ``hf_ckpt.measure.available_settings()``).
SETTING_SYNTAX = "none, full, every_n:N, offload, head:N, mlp:N, upstream:full|upstream:every_n:N, selective[:POLICY], plan:F, oplevel:F, graphplan:F, compile:F, compile_seeded:F"


#: ``--settings``: parsed by :func:`hf_ckpt.measure.parse_settings` (imports torch when given).
settings = converter("hf_ckpt.measure.settings:parse_settings")
run = runner("hf_ckpt.cli._bench_run:run")


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
