#!/usr/bin/env python3
"""Run the default test suite on the ends of the declared torch range, one cached virtualenv each.

    python ci/torch_range.py                    # both ends: the floor torch and the newest installable one
    python ci/torch_range.py --torch 2.5.1 -- tests/test_offload.py
    python ci/torch_range.py --list             # the ends, their pins and whether their environment is built

``ci/matrix.py`` runs every transformers release on the pins' torch (2.13.0); this runs the torch axis: the
floor torch (``pyproject.toml``'s ``torch>=``) with the oldest transformers of the matrix, and the newest torch
with the newest transformers. CI runs this beside the matrix, which then takes the floor end as its oldest
release's run (``ci/matrix.py --adopt-floor``): what a user of that release runs, without a second run of the same
suite. Each end's constraints are that transformers release's pins
(``ci/pins/transformers-<release>.txt``: its peft, accelerate, huggingface_hub, ...) with the torch line replaced;
torch is installed first and alone, as in the matrix. Releases other than the local CPU build are CUDA builds from
PyPI (several GB; they run on CPU): the environments are cached outside the clone like the matrix's
(``~/.cache/hf_ckpt/venvs/torch-<torch>-<hash>``), named by a hash of the constraints, the requirements in
``pyproject.toml``, the Python version and this recipe, and count as built only once their stamp is written.

Output: each end's pytest output, one line per end (``torch X + transformers Y: N passed, M failed``, with skipped
counts), and ``--out`` (default ``build/torch``) receives each end's log and JUnit XML and ``torch.json``, the input
of the torch table of ``ci/compat_report.py``. The exit status is non-zero if any end failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _venvs import DEFAULT_CACHE, build_steps, fingerprint, locked, remove_stale  # noqa: E402
from matrix import (  # noqa: E402
    RELEASE_BOUND, RELEASES, Result, optional, pin_lines, read_junit, requirements, run_logged, say,
)

ROOT = Path(__file__).resolve().parents[1]

#: The torch axis: (torch, transformers) pairs, floor first. The floor must be pyproject's ``torch>=``.
ENDS = (("2.5.1", RELEASES[0]), ("2.15.0", RELEASES[-1]))

#: What only the ceiling end installs: timm (the TimmWrapper towers of Perception LM, PE-Video, PE-Audio-Video)
#: needs torchvision, and the index's torchvision is a CUDA build: it loads beside this end's CUDA torch, not beside
#: the matrix's CPU torch ("operator torchvision::nms does not exist"). ``ci/sweep.py`` sweeps the newest release here.
CEILING_EXTRAS = ("torchvision==0.29.2", "timm==1.0.31")

#: The environment of these builds' pip: a machine's global pip constraints (this workplace caps torch at 2.14.1) are
#: lifted, for these environments only; each end's own constraints file pins every package that matters.
UNCAPPED = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}

#: Bump to rebuild every environment of the torch axis after a change to how they are built.
RECIPE_VERSION = "1"
STAMP = ".hf_ckpt-torch-stamp.json"


def _declared_range() -> tuple[str, str | None]:
    """The torch range ``pyproject.toml`` declares: ``torch>=X`` or ``torch>=X,<Y`` as (X, Y or None)."""
    for requirement in requirements():
        found = re.fullmatch(r"torch\s*>=\s*([0-9.]+)\s*(?:,\s*<\s*([0-9.]+))?", requirement.strip())
        if found:
            return found.group(1), found.group(2)
    raise RuntimeError("pyproject.toml declares no torch>= floor")


def declared_floor() -> str:
    """The torch floor ``pyproject.toml`` declares (``torch>=X``, a ceiling after it or not)."""
    return _declared_range()[0]


def declared_ceiling() -> str | None:
    """The first torch release ``pyproject.toml`` excludes (``torch>=X,<Y``: Y), if it declares one."""
    return _declared_range()[1]


def extras(torch: str) -> list[str]:
    """The packages only this end installs (:data:`CEILING_EXTRAS` on the ceiling), pinned."""
    return list(CEILING_EXTRAS) if torch == ENDS[-1][0] else []


def constraints(torch: str, release: str) -> list[str]:
    """``release``'s pins with torch pinned to ``torch`` instead, and the end's :func:`extras`."""
    lines = [line for line in pin_lines(release) if line.split("==", 1)[0].strip().lower() != "torch"]
    return [f"torch=={torch}", *lines, *extras(torch)]


def packages(torch: str, release: str) -> list[str]:
    """What the end installs after torch: the requirements, the release's optional packages, the extras."""
    return requirements() + optional(release) + [line.split("==", 1)[0] for line in extras(torch)]


def env_hash(torch: str, release: str) -> str:
    return fingerprint(
        RECIPE_VERSION,
        f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
        "\n".join(constraints(torch, release)),
        "\n".join(requirements()),
    )


def env_dir(cache: Path, torch: str, release: str) -> Path:
    return cache / f"torch-{torch}-{env_hash(torch, release)}"


def env_is_built(path: Path) -> bool:
    try:
        return json.loads((path / STAMP).read_text()).get("hash") == path.name.rsplit("-", 1)[-1]
    except (OSError, json.JSONDecodeError):
        return False


def build_env(cache: Path, torch: str, release: str, log, echo: bool, rebuild: bool) -> tuple[Path, bool]:
    """The environment of one end, built unless a complete one with the same hash exists; (path, built now)."""
    path = env_dir(cache, torch, release)
    with locked(cache / f"torch-{torch}.lock"):
        if env_is_built(path) and not rebuild:
            return path, False
        shutil.rmtree(path, ignore_errors=True)
        pins = path.with_name(path.name + ".constraints.txt")
        pins.write_text("\n".join(constraints(torch, release)) + "\n")
        for step in build_steps(path, pins, f"torch=={torch}", packages(torch, release)):
            if run_logged(step, log, env=UNCAPPED, echo=echo) != 0:
                raise RuntimeError(f"environment build failed at: {' '.join(step)}")
        versions = json.loads(subprocess.run(
            [str(path / "bin" / "python"), "-c", "import json, torch, transformers; "
             "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__}))"],
            capture_output=True, text=True, check=True,
        ).stdout)
        if versions["torch"].split("+", 1)[0] != torch or versions["transformers"] != release:
            raise RuntimeError(f"environment has {versions}, expected torch {torch}, transformers {release}")
        (path / STAMP).write_text(json.dumps({"hash": path.name.rsplit("-", 1)[-1], **versions}) + "\n")
        for stale in cache.glob(f"torch-{torch}-*.constraints.txt"):
            if stale != pins:
                stale.unlink(missing_ok=True)
        remove_stale(cache, f"torch-{torch}-*", keep=path)
        return path, True


def skip_reasons(junit: Path) -> list[str]:
    """The distinct reasons of the tests a JUnit report marks skipped (xfails left out), sorted."""
    reasons = set()
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        for skipped in case.iter("skipped"):
            if skipped.get("type") != "pytest.xfail":
                reasons.add((skipped.get("message") or "").strip())
    return sorted(reasons)


def run_end(torch: str, release: str, args: argparse.Namespace, echo: bool) -> dict:
    """Build (or reuse) one end's environment and run the suite there; its result as a JSON-ready dict."""
    result = Result(release, pins=constraints(torch, release))
    out = args.out / f"torch-{torch}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    junit = out / "junit.xml"
    with open(out / "log.txt", "w") as log:
        started = time.monotonic()
        try:
            path, result.env_built_now = build_env(args.cache_dir, torch, release, log, echo, args.rebuild)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as error:
            result.problem = f"environment: {error}"
        result.build_seconds = time.monotonic() - started
        if result.problem is None and args.build_only:
            result.exit_status = 0
        elif result.problem is None:
            result.env = str(path)
            # the sample sweep's report too: ci/matrix.py --adopt-floor takes the floor end as its oldest release
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   "PYTHONDONTWRITEBYTECODE": "1", "HF_CKPT_SWEEP_REPORT": str(out / "sweep.json")}
            if args.jobs > 1:
                env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
            command = [str(path / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider",
                       f"--junitxml={junit}", *(args.pytest_args or RELEASE_BOUND)]
            started = time.monotonic()
            result.exit_status = run_logged(command, log, env=env, echo=echo)
            result.test_seconds = time.monotonic() - started
    reasons: list[str] = []
    if junit.is_file():
        read_junit(junit, result)
        reasons = skip_reasons(junit)
    elif result.problem is None and result.exit_status not in (0, None):
        result.problem = f"pytest exited with status {result.exit_status} and wrote no report"
    return {"torch": torch, **asdict(result), "skip_reasons": reasons, "ok": result.ok,
            "line": f"torch {torch} + {result.line()}"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--torch", nargs="+", metavar="X", help="ends to run, by torch release (default: all)")
    parser.add_argument("--list", action="store_true", help="list the ends, their environments, and exit")
    parser.add_argument("--jobs", type=int, default=1, help="ends run at once (default 1)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"where environments live ({DEFAULT_CACHE})")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "torch", help="logs and reports (build/torch)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the environments even if they exist")
    parser.add_argument("--build-only", action="store_true", help="build the environments, run no test")
    parser.add_argument("pytest_args", nargs="*",
                        help="after --: what pytest runs (default: the tests whose outcome can depend on the release, "
                             "matrix.RELEASE_BOUND)")
    args = parser.parse_args(argv)
    known = [torch for torch, _ in ENDS]
    chosen = [t for item in (args.torch or known) for t in item.split(",") if t]
    unknown = [t for t in chosen if t not in known]
    if unknown:
        parser.error(f"unknown torch release(s) {', '.join(unknown)}; known: {', '.join(known)}")
    args.ends = [end for end in ENDS if end[0] in chosen]
    args.out = args.out.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if declared_floor() != ".".join(ENDS[0][0].split(".")[:2]):
        say(f"pyproject.toml declares torch>={declared_floor()}, but the floor tested here is {ENDS[0][0]}")
        return 2
    if args.list:
        for torch, release in args.ends:
            path = env_dir(args.cache_dir, torch, release)
            say(f"torch {torch:7} transformers {release:7} env {path} ({'built' if env_is_built(path) else 'not built'})")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    echo = args.jobs == 1
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_end, torch, release, args, echo) for torch, release in args.ends]
        results = [future.result() for future in futures]
    if not echo:
        for result in results:
            say(f"===== torch {result['torch']} =====", (args.out / f"torch-{result['torch']}" / "log.txt").read_text())
    say("", "===== torch range =====", *(result["line"] for result in results))
    for result in results:
        for name in result["failures"]:
            say(f"  FAILED [torch {result['torch']}] {name}")
    report = {"floor": declared_floor(), "ceiling": declared_ceiling(), "ends": results,
              "seconds": round(time.monotonic() - started, 1)}
    (args.out / "torch.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(result["ok"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
