"""ci/mutants.py, the proof that the suite guards each promised behaviour, cannot rot or lie.

Its mutant list must match the code (a refactor that moves a snippet fails here, in the default suite, not only
in the CI step that runs the mutants); a mutant the suite catches is reported with the failing test and the
mutated file is put back; a mutant nothing catches is reported as surviving.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_mutants():
    spec = importlib.util.spec_from_file_location("hf_ckpt_ci_mutants", ROOT / "ci" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


mutants = _load_mutants()


def test_every_mutant_snippet_stands_once_in_the_code():
    assert mutants.check_snippets(ROOT, mutants.MUTANTS) == []


def test_a_snippet_the_code_no_longer_has_is_reported_by_name(tmp_path):
    mutant = mutants.MUTANTS[0]
    (tmp_path / mutant.path).parent.mkdir(parents=True)
    (tmp_path / mutant.path).write_text("# the code was refactored\n")
    problems = mutants.check_snippets(tmp_path, (mutant,))
    assert problems and all(problem.startswith(f"{mutant.name}:") for problem in problems)
    assert any("0 times" in problem for problem in problems)


def _toy_repository(path: Path) -> None:
    (path / "tests").mkdir()
    (path / "toy.py").write_text("VALUE = 1  # the promise\n")
    (path / "tests" / "test_toy.py").write_text("import toy\n\n\ndef test_value():\n    assert toy.VALUE == 1\n")


def test_a_caught_mutant_names_the_failing_test_and_the_file_is_restored(tmp_path):
    _toy_repository(tmp_path)
    before = (tmp_path / "toy.py").read_text()
    broken = mutants.Mutant("toy", "VALUE is 1", "toy.py", "VALUE = 1", "VALUE = 2", ("tests/test_toy.py",))
    killed, verdict, seconds = mutants.run_mutant(broken, tmp_path, sys.executable, timeout=120)
    assert killed and verdict == "tests/test_toy.py::test_value" and seconds > 0
    assert (tmp_path / "toy.py").read_text() == before


def test_a_mutant_nothing_catches_survives(tmp_path):
    _toy_repository(tmp_path)
    harmless = mutants.Mutant("comment", "-", "toy.py", "# the promise", "# reworded", ("tests/test_toy.py",))
    killed, verdict, _ = mutants.run_mutant(harmless, tmp_path, sys.executable, timeout=120)
    assert not killed and verdict == "SURVIVED its named tests (tests/test_toy.py)"


def test_only_the_named_tests_run_unless_the_whole_suite_is_asked_for(tmp_path):
    """A mutant its named tests miss survives without the rest of the suite (CI's time stays bounded); with
    whole_suite the rest runs and finds the killer."""
    _toy_repository(tmp_path)
    (tmp_path / "tests" / "test_other.py").write_text("def test_nothing():\n    assert True\n")
    broken = mutants.Mutant("toy", "VALUE is 1", "toy.py", "VALUE = 1", "VALUE = 2", ("tests/test_other.py",))
    killed, verdict, _ = mutants.run_mutant(broken, tmp_path, sys.executable, timeout=120)
    assert not killed and verdict == "SURVIVED its named tests (tests/test_other.py)"
    killed, verdict, _ = mutants.run_mutant(broken, tmp_path, sys.executable, timeout=120, whole_suite=True)
    assert killed and verdict == "tests/test_toy.py::test_value"
