#!/usr/bin/env python3
"""The full architecture sweep: every model type that supports checkpointing, on each release of the matrix.

    python ci/sweep.py                          # every release, each asserted
    python ci/sweep.py --queue                  # as CI's two lanes do: each sweeps the releases no other run claimed
    python ci/sweep.py --releases 5.24.0        # one release
    python ci/sweep.py --jobs 2 --out build/sweep

Runs ``tests/test_architectures.py -k test_every_model_type`` with ``HF_CKPT_SWEEP=full`` in each release's
cached matrix environment (``ci/matrix.py`` builds and reuses them), 2 of the 4 cases on every release
(``CASES``: each entry point once, each selection once; the default suite runs all 4 on its stratified sample and
on the common architectures' task heads). The newest release is swept in the torch range's ceiling environment
(``ci/torch_range.py``: its pins on the newest torch, with timm and torchvision, which the CPU torch of the matrix
cannot load). Every release is asserted: each model type passes or is a reviewed strict xfail for that release
(``tests/arch_known_failures.py``, entries by release range), and any other outcome fails this script. Failures
are reported one line each (``--tb=line``; the sweep report keeps each failure's message). On the newest release
the estimate runs over the same model types too (``tests/test_estimate_every_type.py``, the sweep's classes): each
is estimated or refused in one line naming why, or the release's sweep fails.

Writes ``<out>/sweep.json`` (each release's per-model-type results, the denominator and the runtime), the input
of ``ci/compat_report.py --sweep``, and prints one line per release: ``sweep X: P of N model types passed``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import matrix  # noqa: E402  (ci/matrix.py: the environments)
import torch_range  # noqa: E402  (ci/torch_range.py: the newest release's environment, with timm)

ROOT = matrix.ROOT
NEWEST = matrix.RELEASES[-1]
VARIANTS = ("enable-every1", "enable-every2", "patched-every1", "patched-every2")
#: The cases every release runs: ``hf_ckpt.enable`` with ``every_n_layers=2`` and the patched
#: ``gradient_checkpointing_enable`` with every layer.
CASES = ("enable-every2", "patched-every1")


def outcome(record: dict, cases: tuple[str, ...] = VARIANTS) -> str:
    """One model type's outcome on one release: passed (every case run), xfail (a known failure that still fails),
    xpass (a known failure that passed: stale), failed."""
    passed = all(record.get(variant) == "passed" for variant in cases)
    if record.get("known_failure"):
        return "xpass" if passed else "xfail"
    return "passed" if passed else "failed"


def summarise(release: str, sweep: dict | None, strict: bool, status: int, seconds: float) -> dict:
    model_types = (sweep or {}).get("model_types", {})
    cases = CASES
    counts = {name: 0 for name in ("passed", "failed", "xfail", "xpass")}
    for record in model_types.values():
        counts[outcome(record, cases)] += 1
    return {
        "release": release, "strict": strict, "cases": list(cases), "exit_status": status, "seconds": round(seconds, 1),
        "supporting_model_types": (sweep or {}).get("supporting_model_types"), "counts": counts,
        "ok": (not strict) or (status == 0 and counts["failed"] == 0 and counts["xpass"] == 0 and bool(model_types)),
        "sweep": sweep,
    }


def environment(release: str, cache: Path, log) -> Path:
    """Where ``release`` is swept: its matrix environment; the newest release's is the torch range's ceiling end
    (its pins on the newest torch, with timm and torchvision: ``torch_range.CEILING_EXTRAS``)."""
    torch, ceiling = torch_range.ENDS[-1]
    if release == ceiling:
        return torch_range.build_env(cache, torch, release, log, echo=False, rebuild=False)[0]
    return matrix.build_env(cache, release, log, echo=False, rebuild=False)[0]


def run_release(release: str, args: argparse.Namespace) -> dict:
    out = args.out / release
    out.mkdir(parents=True, exist_ok=True)
    strict = True  # every release: its reviewed known failures (tests/arch_known_failures.py) are strict xfails
    with open(out / "log.txt", "w") as log:
        path = environment(release, args.cache_dir, log)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "HF_CKPT_SWEEP": "full",
            "HF_CKPT_SWEEP_KNOWN": "strict" if strict else "off",
            "HF_CKPT_SWEEP_REPORT": str(out / "sweep.json"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",  # progress reaches the log as it happens
            # a caller's own limit wins (CI runs this beside the matrix, one thread each)
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // max(1, args.jobs))),
        }
        # A release that runs past --timeout is stopped (exit status 124): its sweep is then reported as incomplete.
        cases = f" and ({' or '.join(CASES)})"
        command = ["timeout", "--kill-after=30", str(args.timeout), str(path / "bin" / "python"), "-m", "pytest",
                   "-p", "no:cacheprovider", "-q", "tests/test_architectures.py", "-k", f"test_every_model_type{cases}",
                   f"--junitxml={out / 'junit.xml'}", "--tb=line"]
        started = time.monotonic()
        status = matrix.run_logged(command, log, env=env, echo=False)
        if release == NEWEST:  # and the estimate over the same model types: each estimated or refused in one line
            status = status or _estimate_every_type(path, env, out, args.timeout, log)
        seconds = time.monotonic() - started
    report = out / "sweep.json"
    sweep = json.loads(report.read_text()) if report.is_file() else None
    return summarise(release, sweep, strict, status, seconds)


def _estimate_every_type(path: Path, env: dict, out: Path, timeout: int, log) -> int:
    """``tests/test_estimate_every_type.py`` with the sweep's classes over every model type (about 80 s on 5.25.0);
    its exit status. The task-head half runs on the default run's sample only (a real estimate per text model)."""
    command = ["timeout", "--kill-after=30", str(timeout), str(path / "bin" / "python"), "-m", "pytest",
               "-p", "no:cacheprovider", "-q", "tests/test_estimate_every_type.py", "-k", "swept",
               f"--junitxml={out / 'junit-estimate.xml'}", "--tb=line"]
    env = {name: value for name, value in env.items() if name != "HF_CKPT_SWEEP_REPORT"}  # the sweep's report stays
    return matrix.run_logged(command, log, env=env, echo=False)


def line(result: dict) -> str:
    counts = result["counts"]
    total = sum(counts.values())
    text = f"sweep {result['release']}: {counts['passed']} of {total} model types passed"
    text += f", {counts['xfail']} known failures" if counts["xfail"] else ""
    text += f", {counts['failed']} failed" if counts["failed"] else ""
    text += f", {counts['xpass']} stale known failures (passed)" if counts["xpass"] else ""
    mode = f"{'asserted' if result['strict'] else 'measured'}, {len(result['cases'])} cases"
    return f"{text} ({mode}, {result['seconds']:.0f} s){'' if result['ok'] else ' FAILED'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", nargs="+", metavar="X", help="releases (default: all of ci/matrix.py)")
    parser.add_argument("--jobs", type=int, default=1, help="releases run at once (default 1)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a release may run (default 1800)")
    parser.add_argument("--cache-dir", type=Path, default=matrix.DEFAULT_CACHE, help="matrix environments")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "sweep", help="logs and sweep.json")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other releases an existing sweep.json holds (CI sweeps in two lanes)")
    parser.add_argument("--queue", action="store_true",
                        help="share the releases with other runs given the same --out: each release is swept by "
                             "the first run to claim it (newest first), and every run merges into one sweep.json")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    chosen = [r for item in (args.releases or matrix.RELEASES) for r in item.split(",") if r]
    unknown = [r for r in chosen if r not in matrix.RELEASES]
    if unknown:
        parser.error(f"unknown release(s) {', '.join(unknown)}; known: {', '.join(matrix.RELEASES)}")
    args.out = args.out.resolve()
    started = time.monotonic()
    # Newest first: the newer releases have more model types (the longest first balances the lanes of a queue).
    order = list(reversed([r for r in matrix.RELEASES if r in chosen]))
    results: dict[str, dict] = {}

    def sweep(release: str) -> dict | None:
        return run_release(release, args) if not args.queue or claim(args.out, release) else None

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for result in pool.map(sweep, order):
            if result is not None:
                results[result["release"]] = result
                matrix.say(line(result))
    ordered = [results[r] for r in matrix.RELEASES if r in results]
    _write(args.out / "sweep.json", ordered, time.monotonic() - started, args.merge or args.queue)
    matrix.say(f"sweep: {len(ordered)} releases in {time.monotonic() - started:.0f} s")
    return 0 if all(r["ok"] for r in ordered) else 1


def claim(out: Path, release: str) -> bool:
    """Whether this run takes ``release`` from the queue in ``out`` (False: another run already has): the first to
    create ``out/<release>/claimed`` sweeps it."""
    (out / release).mkdir(parents=True, exist_ok=True)
    try:
        with open(out / release / "claimed", "x") as mark:
            mark.write(f"{os.getpid()}\n")
        return True
    except FileExistsError:
        return False


def _write(path: Path, releases: list[dict], seconds: float, merge: bool) -> None:
    """Write ``sweep.json``; with ``merge``, under a lock, keeping the releases another run wrote there."""
    with matrix.locked(path.with_suffix(".lock")):
        kept: dict[str, dict] = {}
        if merge and path.is_file():
            earlier = json.loads(path.read_text())
            kept = {run["release"]: run for run in earlier["releases"]}
            seconds += earlier.get("seconds", 0)
        kept.update({run["release"]: run for run in releases})
        ordered = [kept[r] for r in matrix.RELEASES if r in kept]
        path.write_text(json.dumps({"releases": ordered, "seconds": round(seconds, 1)}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
