"""How long ``hf-ckpt --help`` and an argument error take: wall time of a fresh interpreter, median of N runs.

    python benchmarks/cli_startup.py [--runs 5]

Prints one line per command: the median and the range of the wall times, the exit status, and whether torch or
transformers got imported (they should not be: parsing is import-light, see hf_ckpt/cli/). For reference it also
times ``python -c "import torch"``, the cost a command pays once it runs. Uses this checkout's hf_ckpt
(``python -m hf_ckpt``, what the ``hf-ckpt`` console script runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import sys, runpy; sys.argv = ['hf-ckpt', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('hf_ckpt', run_name='__main__')\n"
    "except SystemExit as stop:\n"
    "    print('heavy:', sorted({'torch', 'transformers'} & set(sys.modules)), file=sys.stderr)\n"
    "    raise\n"
)
COMMANDS = {
    "hf-ckpt --help": ["--help"],
    "hf-ckpt bench --help": ["bench", "--help"],
    "hf-ckpt plan --budget 2.0  (argument error)": ["plan", "--budget", "2.0"],
    "hf-ckpt bench --batch 0  (argument error)": ["bench", "--batch", "0"],
}


def _time(argv: list[str], env: dict) -> tuple[float, int, str]:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    heavy = next((line for line in done.stderr.splitlines() if line.startswith("heavy:")), "")
    return elapsed, done.returncode, heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per command (default %(default)s)")
    runs = parser.parse_args().runs
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    rows = {name: [sys.executable, "-c", PROBE, *argv] for name, argv in COMMANDS.items()}
    rows["python -c 'import torch'  (reference)"] = [sys.executable, "-c", "import torch"]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {runs} runs each, wall time of a fresh interpreter")
    for name, argv in rows.items():
        results = [_time(argv, env) for _ in range(runs)]
        times = [elapsed for elapsed, _, _ in results]
        _, code, heavy = results[-1]
        print(
            f"{name:48s} median {statistics.median(times):6.3f} s  (min {min(times):.3f}, max {max(times):.3f})  "
            f"exit {code}  {heavy}"
        )


if __name__ == "__main__":
    main()
