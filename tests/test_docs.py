"""Every ```python block of README.md and docs/ runs (tests/_docs_runner.py says how, and how to mark a block).

All pages in one fresh interpreter, each in its own temporary directory, each block on a tiny Llama built from
its config: the snippets cannot drift from the code. A block that cannot run here carries ``<!-- docs-test: skip (REASON) -->``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _docs_runner  # noqa: E402

pytestmark = pytest.mark.slow  # every page in one run: minutes (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WITH_CODE = [page for page in PAGES if _docs_runner.blocks(page)]


def _run(pages: list[Path], cwd: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    runner, out = Path(_docs_runner.__file__), cwd / "results.json"
    done = subprocess.run(
        [sys.executable, str(runner), "--json", str(out), *map(str, pages)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=900,
    )
    return done, (json.loads(out.read_text()) if out.exists() else {})


RAISING = "Intro.\n\n```python\nx = 1\n```\n\n```python\nraise ValueError('stale snippet')\n```\n"
MARKED = (
    "<!-- docs-test: skip (needs a GPU) -->\n```python\nraise RuntimeError\n```\n\n"
    "```python\nvalue = 41\n```\n<!-- docs-test: continue -->\n```python\nassert value == 41\n```\n\n"
    "```python\nassert 'value' not in globals()\n```\n"
)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every page run once, in one interpreter, with two pages that test the runner itself (one raises)."""
    folder = tmp_path_factory.mktemp("docs")
    (folder / "raising.md").write_text(RAISING)
    (folder / "marked.md").write_text(MARKED)
    pages = [folder / "raising.md", *WITH_CODE, folder / "marked.md"]
    done, results = _run(pages, folder)
    assert results, f"the docs runner did not finish:\n{done.stdout}\n{done.stderr}"
    return done, folder, results


@pytest.mark.parametrize("page", WITH_CODE, ids=[str(page.relative_to(ROOT)) for page in WITH_CODE])
def test_python_blocks_run(page, outcomes):
    result = outcomes[2][str(page)]
    log = "\n".join(result["log"])
    assert result["ok"], log
    assert len(result["log"]) == len(_docs_runner.blocks(page)), log  # each block ran or was skipped with a reason


def test_every_page_with_python_is_checked():
    assert {"README.md", "docs/index.md", "docs/guides/budget.md"} <= {str(p.relative_to(ROOT)) for p in WITH_CODE}


def test_a_block_that_raises_fails_the_run_naming_its_line(outcomes):
    done, folder, results = outcomes
    page = folder / "raising.md"
    assert done.returncode == 1
    assert f"{page}:7: the block raised" in done.stderr and "ValueError: stale snippet" in done.stderr
    assert results[str(page)]["ok"] is False
    assert results[str(WITH_CODE[0])]["ok"]  # the pages after it still run


def test_markers(outcomes):
    done, folder, results = outcomes
    page = folder / "marked.md"
    found = _docs_runner.blocks(page)
    assert [(block.marker, block.reason) for block in found] == [
        ("skip", "needs a GPU"), (None, None), ("continue", None), (None, None)
    ]
    assert results[str(page)]["ok"], results[str(page)]["log"]
    assert f"{page}:2: skipped (needs a GPU)" in results[str(page)]["log"]


@pytest.mark.parametrize("marker", ["skip", "skip ()", "skipp (typo)"])
def test_a_skip_without_a_reason_or_an_unknown_marker_is_an_error(marker, tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"<!-- docs-test: {marker} -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="docs-test marker"):
        _docs_runner.blocks(page)
