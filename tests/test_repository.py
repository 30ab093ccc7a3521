"""What the repository holds: no large file is committed (a build, a wheel or a data dump belongs elsewhere)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The largest file the repository may track.
LIMIT = 1024 * 1024


def test_no_tracked_file_is_over_1_mb() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing is tracked here")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    tracked = [ROOT / name for name in listed.decode().split("\0") if name]
    assert len(tracked) > 100  # the listing worked
    large = {str(path.relative_to(ROOT)): path.stat().st_size for path in tracked
             if path.is_file() and path.stat().st_size > LIMIT}
    assert not large, f"tracked files over {LIMIT} bytes: {large}"
