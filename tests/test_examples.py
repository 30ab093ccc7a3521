"""Every example runs as a user runs it (a fresh interpreter, CPU) and prints what it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each example is a fresh interpreter and a short training run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _launch(name: str, *, without: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    repo = str(EXAMPLES.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    env["CUDA_VISIBLE_DEVICES"] = ""  # the examples promise a CPU run
    command = [sys.executable, str(EXAMPLES / name)]
    if without is not None:  # run the example as if the package `without` were not installed
        hide = (
            f"import runpy, sys; sys.modules[{without!r}] = None; sys.argv = [{str(EXAMPLES / name)!r}]; "
            f"runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        command = [sys.executable, "-c", hide]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=repo, timeout=300)


def _run(name: str) -> str:
    result = _launch(name)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.parametrize(
    "name, package, install",
    [
        ("lora_finetune.py", "peft", "pip install 'hf_ckpt[peft]'"),
        ("accelerate_fsdp/train.py", "accelerate", "pip install accelerate"),
    ],
)
def test_examples_name_their_missing_optional_dependency_in_one_line(name, package, install):
    result = _launch(name, without=package)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"examples/{name} needs {package}: {install}"]


def _listed(output: str, label: str) -> str:
    match = re.search(rf"^{re.escape(label)}\s*(\[.*\])$", output, flags=re.MULTILINE)
    assert match, f"no line {label!r} in:\n{output}"
    return match.group(1)


def test_custom_model():
    output = _run("custom_model.py")
    assert _listed(output, "checkpointed blocks (flags):") == "[0, 2, 4]"
    [verdict] = [line for line in output.splitlines() if line.startswith("hf_ckpt.verify: TinyLM")]
    assert "every_n_layers=2" in verdict and verdict.endswith(": OK")
    [rng] = [line for line in output.splitlines() if "RNG replay" in line]
    assert rng.strip().startswith("[ok]") and "[0, 2, 4]" in rng
    steps = re.findall(r"^step \d: loss [\d.]+, recomputed blocks \(measured\) (\[.*\])$", output, flags=re.MULTILINE)
    assert steps == ["[0, 2, 4]"] * 3


def test_trainer_every_n_layers():
    output = _run("trainer_every_n_layers.py")
    assert "trained 4 steps" in output
    assert _listed(output, "checkpointed blocks (flags):") == "[0, 2, 4]"
    assert _listed(output, "recomputed blocks (measured):") == "[0, 2, 4]"
    # over 4 steps, recomputed blocks ran twice per step (forward + recompute), the others once
    assert _listed(output, "runs per block over the whole run:") == "[8, 4, 8, 4, 8, 4]"


def test_lora_finetune():
    pytest.importorskip("peft")  # in the test extra; CI installs it
    output = _run("lora_finetune.py")
    assert "(hf_ckpt.enable(every_n_layers=2, use_reentrant=True)): OK" in output
    assert _listed(output, "checkpointed blocks (flags):") == "[0, 2, 4]"
    assert _listed(output, "recomputed blocks (measured):") == "[0, 2, 4]"
    assert "updated tensors: 24, all LoRA: True" in output  # 6 blocks x (q, v) x (A, B)


def test_plan_budget():
    output = _run("plan_budget.py")
    assert "within budget: True" in output
    checkpointed = _listed(output, "blocks checkpointed:")
    assert _listed(output, "recomputed blocks (measured):") == checkpointed
    match = re.search(r"^extra FLOPs: (\d+) \(predicted (\d+)\)$", output, flags=re.MULTILINE)
    assert match and match.group(1) == match.group(2)
