#!/usr/bin/env python3
"""Run the test suite against every supported transformers release, one cached virtualenv per release.

    python ci/matrix.py                         # every release, the whole suite (pytest tests)
    python ci/matrix.py --releases 4.45.2 5.24.0 -- tests/test_architectures.py
    python ci/matrix.py --list                  # releases, their pins and whether their environment is built

Each release has a constraints file, ``ci/pins/transformers-<release>.txt``, pinning torch, transformers and the
``huggingface_hub``/``tokenizers`` that release needs (4.x and 5.x need different ones). Its environment is built
once and kept outside the clone, in ``~/.cache/hf_ckpt/venvs/matrix-<release>-<hash>`` (``--cache-dir`` or
``HF_CKPT_MATRIX_CACHE`` to move it): the hash covers the pins (not their comments), the requirements in
``pyproject.toml`` (the core dependencies and the ``test`` extra), the Python version and this recipe, so that a
change to any of them builds a fresh environment and a fresh clone on the same machine reuses the existing one. An
environment counts as built only once its stamp file is written, so an interrupted build is redone, not reused.

torch is installed first, on its own, so that pip takes the CPU build on local disk. hf_ckpt itself is not
installed: the tests import it from the clone under test through ``PYTHONPATH``.

Output: the pytest output of each release, then one line per release, ``transformers X: N passed, M failed`` (with
xfailed/skipped counts), and a final ``matrix: N passed, M failed``. The exit status is non-zero if any release
failed, its environment could not be built, or its pytest run ended with a non-zero status. ``--out`` (default
``build/matrix``) receives each release's log, JUnit XML and the architecture sweep's JSON, and ``matrix.json``,
the input of ``ci/compat_report.py``.

``--adopt DIR`` takes one release's results from a run that has already happened in *this* interpreter (CI's
default run and slow tests, on the newest release): the JUnit files ``DIR/*.xml`` and the sweep report
``DIR/sweep.json``. It is adopted only if this interpreter has that release's pins installed, each package at its
pinned version; otherwise the release runs as usual, and the line says why.

``--adopt-floor FILE`` takes the oldest release's results from the torch range's floor end (``ci/torch_range.py``'s
``torch.json``): that release's pins with the floor torch, the same suite. Its pins are recorded as that run's. The
file is read once the other releases have run (CI runs the torch range beside the matrix); a missing or unreadable
one makes that release fail, saying why.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _venvs import DEFAULT_CACHE, build_steps, fingerprint, locked, read_pins, remove_stale  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[1]
PINS_DIR = ROOT / "ci" / "pins"

#: Supported releases, oldest first; each needs ``ci/pins/transformers-<release>.txt``.
RELEASES = ("4.45.2", "4.51.3", "4.57.6", "5.0.0", "5.15.1", "5.22.2", "5.24.0", "5.25.0")

#: Optional packages that model types import (scipy: Inkling's vision tower; timm: TimmWrapper towers). A release's
#: environment installs those its pins pin, so adding one changes that release's hash alone (one rebuild, not 7).
#: timm is not pinned anywhere: it needs torchvision, and the index's torchvision is the CUDA build, which does not
#: load beside the CPU torch ("operator torchvision::nms does not exist").
OPTIONAL = ("scipy", "timm")

#: What a release other than the newest runs unless told otherwise (and each end of ``ci/torch_range.py``): the default
#: run less the tests marked ``any_release``, whose outcome cannot depend on the release (``tests/release_guard.py``
#: fails a marked test that builds a transformers model or config, runs autograd or starts a process); the newest
#: release runs them, in CI's default run.
RELEASE_BOUND = ["-m", "not slow and not any_release", "tests"]
#: What a release between the oldest and the newest runs: :data:`RELEASE_BOUND` less the tests marked
#: ``edge_releases`` (the estimator's figures and the checks of hf_ckpt's own source: about 45 % of a release's run),
#: which the ends run (``tests/release_guard.py`` says why).
BETWEEN_ENDS = ["-m", "not slow and not any_release and not edge_releases", "tests"]

#: Bump to rebuild every environment after a change to how they are built.
RECIPE_VERSION = "1"
STAMP = ".hf_ckpt-matrix-stamp.json"

_print_lock = threading.Lock()


def say(*lines: str) -> None:
    with _print_lock:
        for line in lines:
            print(line, flush=True)


# --------------------------------------------------------------------------------------------------- environments


def pins_file(release: str) -> Path:
    return PINS_DIR / f"transformers-{release}.txt"


def requirements() -> list[str]:
    """What each environment installs: hf_ckpt's dependencies and its ``test`` extra, from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project.get("optional-dependencies", {}).get("test", []))


def optional(release: str) -> list[str]:
    """The :data:`OPTIONAL` packages ``release``'s pins pin: installed in its environment beside the requirements."""
    return [package for package in OPTIONAL if pinned(release, package)]


def pin_lines(release: str) -> list[str]:
    """``release``'s pins, without comments."""
    return read_pins(pins_file(release))


def pinned(release: str, package: str) -> str | None:
    """The line of ``release``'s pins that pins ``package``, if any."""
    for line in pin_lines(release):
        if line.split("==", 1)[0].strip().lower().replace("_", "-") == package:
            return line
    return None


def env_hash(release: str) -> str:
    return fingerprint(
        RECIPE_VERSION,
        f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
        "\n".join(pin_lines(release)),  # comments may change without a rebuild
        "\n".join(requirements()),
    )


def env_dir(cache: Path, release: str) -> Path:
    return cache / f"matrix-{release}-{env_hash(release)}"


def env_is_built(path: Path) -> bool:
    stamp = path / STAMP
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("hash") == path.name.rsplit("-", 1)[-1]
    except json.JSONDecodeError:
        return False


def run_logged(command: list[str], log, env: dict[str, str] | None = None, echo: bool = False) -> int:
    """Run ``command``, appending its output to ``log`` (and echoing it live when ``echo``)."""
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, bufsize=1
    )
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)
        if echo:
            say(line.rstrip("\n"))
    return process.wait()


def build_env(cache: Path, release: str, log, echo: bool, rebuild: bool) -> tuple[Path, bool]:
    """The environment for ``release``, built unless a complete one with the same hash exists; (path, built now)."""
    path = env_dir(cache, release)
    with locked(cache / f"matrix-{release}.lock"):
        if env_is_built(path) and not rebuild:
            return path, False
        shutil.rmtree(path, ignore_errors=True)
        python = path / "bin" / "python"
        for step in build_steps(path, pins_file(release), pinned(release, "torch") or "torch",
                                requirements() + optional(release)):
            if run_logged(step, log, echo=echo) != 0:
                raise RuntimeError(f"environment build failed at: {' '.join(step)}")
        versions = subprocess.run(
            [str(python), "-c", "import json, torch, transformers; "
             "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__}))"],
            capture_output=True, text=True, check=True,
        ).stdout
        installed = json.loads(versions)
        if installed["transformers"] != release:
            raise RuntimeError(f"environment has transformers {installed['transformers']}, expected {release}")
        (path / STAMP).write_text(json.dumps({"hash": path.name.rsplit("-", 1)[-1], **installed}) + "\n")
        remove_stale(cache, f"matrix-{release}-*", keep=path)
        return path, True


# --------------------------------------------------------------------------------------------------------- tests


@dataclass
class Result:
    release: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    xfailed: int = 0
    exit_status: int | None = None
    problem: str | None = None
    env: str | None = None
    env_built_now: bool = False
    build_seconds: float = 0.0
    test_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    pins: list[str] = field(default_factory=list)
    sweep: dict | None = None
    adopted: str | None = None  # the folder whose results were adopted (--adopt)

    @property
    def ok(self) -> bool:
        return self.problem is None and self.exit_status == 0 and self.failed == 0 and self.errors == 0

    def line(self) -> str:
        if self.problem is None and self.exit_status == 0 and self.test_seconds == 0 and not self.passed:
            return f"transformers {self.release}: environment ready ({self._timing()})"
        failed = self.failed + self.errors
        line = f"transformers {self.release}: {self.passed} passed, {failed} failed"
        extras = [f"{n} {what}" for n, what in ((self.xfailed, "xfailed"), (self.skipped, "skipped")) if n]
        line += "".join(f", {extra}" for extra in extras)
        if self.problem:
            line += f" [{self.problem}]"
        elif self.exit_status not in (0, None) and not failed:
            line += f" [pytest exited with status {self.exit_status}]"
        return f"{line} ({self._timing()}, tests {self.test_seconds:.0f} s)"

    def _timing(self) -> str:
        if self.adopted:
            return f"adopted from {self.adopted}"
        return f"env built in {self.build_seconds:.0f} s" if self.env_built_now else "env reused"


def read_junit(path: Path, result: Result, skipped_before: set[str] | None = None) -> float:
    """Count outcomes from pytest's JUnit XML: passed, failed, errors, skipped and (strict or not) xfailed; return
    the time its test suites report.

    ``skipped_before``: the cases already counted as skipped from another report of the same release, counted
    once (a module skipped at collection, the clients', is reported skipped by every run that collects it)."""
    root = ElementTree.parse(path).getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag: child for child in case}
        if "failure" in tags:
            result.failed += 1
            result.failures.append(name)
        elif "error" in tags:
            result.errors += 1
            result.failures.append(name)
        elif "skipped" in tags:
            if tags["skipped"].get("type") == "pytest.xfail":
                result.xfailed += 1
            elif skipped_before is None or name not in skipped_before:
                result.skipped += 1
                if skipped_before is not None:
                    skipped_before.add(name)
        else:
            result.passed += 1
    return sum(float(suite.get("time", 0)) for suite in root.iter("testsuite"))


def _base_version(version: str) -> str:
    return version.split("+", 1)[0]  # torch 2.13.0+cpu is the pin torch==2.13.0


def installed_version(package: str) -> str | None:
    """``package``'s version in this interpreter, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def pin_mismatches(release: str) -> list[str]:
    """How this interpreter's packages differ from ``release``'s pins (empty: it is that release's environment)."""
    found = []
    for line in pin_lines(release):
        name, _, wanted = line.partition("==")
        installed = installed_version(name.strip())
        if installed is None or _base_version(installed) != wanted.strip():
            found.append(f"{name.strip()} {installed or 'missing'} (pinned {wanted.strip()})")
    return found


def adoptable(folder: Path) -> tuple[str | None, str]:
    """The release whose results ``folder`` holds, if this interpreter is that release's environment; else why not."""
    reports = sorted(folder.glob("*.xml"))
    if not reports:
        return None, f"--adopt {folder}: no JUnit report (*.xml) there"
    version = installed_version("transformers")
    if version not in RELEASES:
        return None, f"--adopt {folder}: this interpreter has transformers {version}, not a release of the matrix"
    mismatches = pin_mismatches(version)
    if mismatches:
        return None, f"--adopt {folder}: not transformers {version}'s pins: {', '.join(mismatches)}"
    return version, ""


def adopt(release: str, folder: Path) -> Result:
    """``release``'s result from the JUnit reports and the sweep report already written in ``folder``."""
    result = Result(release, pins=pin_lines(release), exit_status=0, env=sys.prefix, adopted=str(folder))
    skipped: set[str] = set()
    for report in sorted(folder.glob("*.xml")):
        result.test_seconds += read_junit(report, result, skipped)
    sweep = folder / "sweep.json"
    if sweep.is_file():
        result.sweep = json.loads(sweep.read_text())
    else:
        result.problem = f"no sweep report in {folder}"
    return result


def adopt_floor(path: Path) -> tuple[Result | None, str]:
    """The result of the torch range's floor end (the first of ``torch.json``'s ends), adopted for its release."""
    try:
        end = json.loads(path.read_text())["ends"][0]
    except (OSError, ValueError, KeyError, IndexError) as error:
        return None, f"--adopt-floor {path}: no torch range report ({error})"
    folder = path.parent / f"torch-{end['torch']}"
    if not sorted(folder.glob("*.xml")):
        return None, f"--adopt-floor {path}: no JUnit report in {folder}"
    result = adopt(end["release"], folder)
    result.pins, result.env = end.get("pins", result.pins), end.get("env")
    result.adopted = f"the torch range's floor run (torch {end['torch']})"
    return result, ""


def default_tests(release: str) -> list[str]:
    """What pytest runs on ``release`` when no test is named: every default test on the newest release, the tests
    whose outcome can depend on the release (:data:`RELEASE_BOUND`) on the oldest, and those less the ones marked
    ``edge_releases`` (:data:`BETWEEN_ENDS`) on the releases between."""
    if release == RELEASES[-1]:
        return ["tests"]
    return RELEASE_BOUND if release == RELEASES[0] else BETWEEN_ENDS


def run_release(release: str, args: argparse.Namespace, echo: bool) -> Result:
    result = Result(release, pins=pin_lines(release))
    out = args.out / release
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with open(out / "log.txt", "w") as log:
        started = time.monotonic()
        try:
            path, result.env_built_now = build_env(args.cache_dir, release, log, echo, args.rebuild)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as error:
            result.problem = f"environment: {error}"
            result.build_seconds = time.monotonic() - started
            return result
        result.env = str(path)
        result.build_seconds = time.monotonic() - started
        if args.build_only:
            result.exit_status = 0
            return result

        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "HF_CKPT_SWEEP_REPORT": str(out / "sweep.json"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if args.jobs > 1:
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
        junit = out / "junit.xml"
        command = [
            str(path / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider",
            f"--junitxml={junit}", *(args.pytest_args or default_tests(release)),
        ]
        started = time.monotonic()
        result.exit_status = run_logged(command, log, env=env, echo=echo)
        result.test_seconds = time.monotonic() - started
    if junit.is_file():
        read_junit(junit, result)
    elif result.exit_status != 0:
        result.problem = f"pytest exited with status {result.exit_status} and wrote no report"
    sweep = out / "sweep.json"
    if sweep.is_file():
        result.sweep = json.loads(sweep.read_text())
    return result


# ----------------------------------------------------------------------------------------------------------- CLI


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--releases", nargs="+", metavar="X", help="releases to run (default: all); commas work too")
    parser.add_argument("--list", action="store_true", help="list the releases, their pins and environments, and exit")
    parser.add_argument("--newest-pins", action="store_true",
                        help="print the newest release's pins file (the default run's constraints in .ci/run), and exit")
    parser.add_argument("--newest-optional", action="store_true",
                        help="print the optional packages the newest release's environment installs, and exit")
    parser.add_argument("--jobs", type=int, default=1, help="releases run at once (default 1)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"where environments live ({DEFAULT_CACHE})")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "matrix", help="logs and reports (build/matrix)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the environments even if they exist")
    parser.add_argument("--build-only", action="store_true", help="build the environments, run no test")
    parser.add_argument("--adopt", type=Path, metavar="DIR",
                        help="take this interpreter's release's results from DIR/*.xml and DIR/sweep.json")
    parser.add_argument("--adopt-floor", type=Path, metavar="FILE",
                        help="take the oldest release's results from ci/torch_range.py's torch.json (its floor end)")
    parser.add_argument("pytest_args", nargs="*",
                        help="after --: what pytest runs (default: tests; on the oldest release, those whose "
                             "outcome can depend on the release: RELEASE_BOUND; on the releases between, those less "
                             "the ones marked edge_releases: BETWEEN_ENDS)")
    args = parser.parse_args(argv)
    chosen = [r for item in (args.releases or RELEASES) for r in item.split(",") if r]
    unknown = [r for r in chosen if r not in RELEASES]
    if unknown:
        parser.error(f"unknown release(s) {', '.join(unknown)}; known: {', '.join(RELEASES)}")
    args.releases = [r for r in RELEASES if r in chosen]
    args.out = args.out.resolve()
    return args


def list_releases(args: argparse.Namespace) -> None:
    for release in args.releases:
        path = env_dir(args.cache_dir, release)
        state = "built" if env_is_built(path) else "not built"
        say(f"{release:8} pins {pins_file(release).relative_to(ROOT)}  env {path} ({state})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        list_releases(args)
        return 0
    if args.newest_pins:
        say(str(pins_file(RELEASES[-1])))
        return 0
    if args.newest_optional:
        say(" ".join(optional(RELEASES[-1])))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    echo = args.jobs == 1
    started = time.monotonic()
    results: dict[str, Result] = {}
    if args.adopt:
        release, why = adoptable(args.adopt.resolve())
        if release in args.releases:
            results[release] = adopt(release, args.adopt.resolve())
            say(results[release].line())
        else:
            say(why or f"--adopt {args.adopt}: transformers {release} is not among the releases run")
    # the oldest release, paired with the floor torch by the torch range, is adopted from it
    floor_release = RELEASES[0] if args.adopt_floor and RELEASES[0] in args.releases and RELEASES[0] not in results \
        else None
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_release, release, args, echo): release
                   for release in args.releases if release not in results and release != floor_release}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results[result.release] = result
            if not echo:
                say(f"===== transformers {result.release} =====", (args.out / result.release / "log.txt").read_text())
            say(result.line())
    if floor_release is not None:  # read once the other releases have run: CI runs the torch range beside them
        floor, why = adopt_floor(args.adopt_floor.resolve())
        if floor is not None and floor.release != floor_release:
            floor, why = None, f"--adopt-floor {args.adopt_floor}: its floor end runs {floor.release}, not {floor_release}"
        results[floor_release] = floor or Result(floor_release, pins=pin_lines(floor_release), problem=why)
        say(results[floor_release].line())
    ordered = [results[release] for release in args.releases]
    say("", "===== transformers release matrix =====")
    say(*(result.line() for result in ordered))
    for result in ordered:
        for name in result.failures:
            say(f"  FAILED [{result.release}] {name}")
    report = {
        "releases": [{**asdict(result), "ok": result.ok} for result in ordered],
        "seconds": round(time.monotonic() - started, 1),
    }
    (args.out / "matrix.json").write_text(json.dumps(report, indent=1) + "\n")
    passed = sum(r.passed for r in ordered)
    failed = sum(r.failed + r.errors for r in ordered)
    say(f"matrix: {passed} passed, {failed} failed")
    return 0 if all(r.ok for r in ordered) else 1


if __name__ == "__main__":
    sys.exit(main())
