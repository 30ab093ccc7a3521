"""The cached virtualenvs of ``ci/matrix.py`` (one per transformers release) and ``ci/clients.py`` (the clients).

Both keep their environments outside the clone, in ``~/.cache/hf_ckpt/venvs`` (``HF_CKPT_MATRIX_CACHE`` moves
it), name each by a hash of what it is built from, build it under a lock, torch first and alone (so that pip takes
the CPU build, not a multi-GB CUDA one), and delete the older builds of the same kind once a new one is complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

DEFAULT_CACHE = Path(os.environ.get("HF_CKPT_MATRIX_CACHE", "~/.cache/hf_ckpt/venvs")).expanduser()


def read_pins(path: Path) -> list[str]:
    """The requirement lines of a constraints file, without comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def fingerprint(*parts: str) -> str:
    """12 hex digits that change when any part does (the environment's name suffix)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (two CI runs on one machine must not build the same environment at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_steps(path: Path, pins: Path, torch_requirement: str, requirements: list[str]) -> list[list[str]]:
    """The commands that build the environment at ``path``: the venv, torch alone, the rest, ``pip check``."""
    python = str(path / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "-q", "-c", str(pins)]
    return [
        [sys.executable, "-m", "venv", str(path)],
        pip + [torch_requirement],  # first and alone: the CPU build on local disk, not a multi-GB CUDA one
        pip + requirements,
        [python, "-m", "pip", "check"],
    ]


def remove_stale(cache: Path, pattern: str, keep: Path) -> None:
    """Delete the environments matching ``pattern`` in ``cache`` other than ``keep`` (superseded builds)."""
    for stale in cache.glob(pattern):
        if stale != keep and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
