"""The ``any_release`` mark's guard (tests/release_guard.py): a marked test that reaches what can differ between
releases fails, naming what it reached; an unmarked one, or a marked one that reaches nothing, is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

SUITE = '''
import subprocess

import pytest
import torch
import transformers

from release_guard import MARK


@pytest.fixture(scope="module")
def model():
    return torch.nn.Linear(2, 2)


@pytest.mark.any_release
def test_arithmetic():
    assert sum(range(4)) == 6


@pytest.mark.any_release
def test_config():
    transformers.GPT2Config(n_embd=8, n_head=2, n_layer=1)


@pytest.mark.any_release
def test_backward():
    x = torch.ones(2, requires_grad=True)
    (x * 2).sum().backward()


def test_unmarked(model):
    transformers.GPT2Config(n_embd=8, n_head=2, n_layer=1)


@pytest.mark.any_release
def test_wider_fixture(model):
    pass


@pytest.fixture(scope="module")
def results():
    return {"loss": 1.0}


@pytest.mark.any_release
def test_results_fixture(results, tmp_path):
    assert results["loss"] == 1.0


@pytest.mark.any_release
def test_process():
    subprocess.run(["true"], check=True)
'''


def test_a_marked_test_that_reaches_the_release_fails_naming_what_it_reached(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                          "pytest_plugins = ('release_guard',)\n")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=7, errors=5)  # each of the 5 offending tests: passed, then an error at teardown
    text = result.stdout.str()
    for test, reached in (("test_config", "builds a transformers config"), ("test_backward", "runs autograd (backward)"),
                          ("test_wider_fixture", "uses fixture 'model', which holds a torch module (Linear)"),
                          ("test_results_fixture", "uses fixture 'results', which holds a fixture of scope 'module', "
                                                   "set up before the test is watched"),
                          ("test_process", "starts a process")):
        block = text.split(f"ERROR at teardown of {test} ", 1)[1].split("\n", 2)[1]
        assert block == (f"marked any_release, but its outcome can depend on the release: it {reached}. "
                         "Remove the mark (the test then runs on every release)."), block
    assert "of test_arithmetic " not in text and "of test_unmarked " not in text
