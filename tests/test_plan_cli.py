"""``hf-ckpt plan`` and the bench strategies ``selective`` and ``plan:F``."""

import json
import subprocess
import sys

import pytest
import torch

from hf_ckpt.cli import main
from hf_ckpt.measure import parse_strategy, run_benchmark
from hf_ckpt.measure.report import checks
from hf_ckpt.plans import CheckpointPlan

TINY = ["--layers", "4", "--hidden", "64", "--seq", "32", "--batch", "2"]


def test_plan_command_prints_and_writes_a_loadable_plan(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "--budget", "40%", "--json", str(path), *TINY]) == 0
    out = capsys.readouterr().out
    plan = CheckpointPlan.load(path)
    assert str(plan) in out
    assert plan.num_blocks == 4 and plan.predicted_bytes <= plan.budget_bytes
    assert json.loads(path.read_text())["format"] == "hf_ckpt.CheckpointPlan"


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["plan", "--budget", "0.001", *TINY], 1, "hf-ckpt plan: error: no plan fits a budget of"),
        (["plan", "--budget", "abc"], 2, "expected a fraction (0.5), a percentage (50%) or a size in bytes"),
        (["plan", "--budget", "0.5", "--strategies", "half", *TINY], 2,
         "strategies must be a non-empty subset of none, selective, full, oplevel; got ['half']"),
        (["plan", "--budget", "0.5", "--json", "/no/such/dir/p.json"], 2, "--json: the folder of"),
        (["plan"], 2, "the following arguments are required: --budget"),
    ],
)
def test_plan_command_errors_are_one_line(argv, code, message, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_plan_command_runs_as_a_module(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hf_ckpt", "plan", "--budget", "64MiB", *TINY],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "CheckpointPlan for 4 blocks" in result.stdout


@pytest.mark.parametrize("spec, message", [
    ("plan", "plan needs the budget as a fraction of the no-checkpointing activation memory in (0, 1], e.g. plan:0.5; got plan:"),
    ("plan:2", "got plan:2"),
    ("selective:fast", "selective takes a policy name, one of attention, matmuls, matmuls_and_attention; got selective:fast"),
])
def test_bad_strategy_specs(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        parse_strategy(spec)


def test_bench_with_selective_and_plans_reports_their_checks():
    from hf_ckpt.measure import build_workload

    work = build_workload("llama", layers=4, hidden=64, batch=2, seq=32, dtype=torch.float32, device=torch.device("cpu"), seed=0)
    report = run_benchmark(
        work.model, work.batch, ["none", "full", "every_n:2", "selective", "plan:0.5"], repeat=1, warmup=0,
    )
    plan = report["plan:0.5"]
    assert plan.details["budget_bytes"] == int(0.5 * report.baseline.measurement.retained_bytes)
    assert plan.measurement.recomputed_blocks == [i for i, s in enumerate(plan.details["strategies"]) if s != "none"]
    names = {check.name for check in checks(report)}
    assert {
        "selective: saves >= 30% of none's activation memory",
        "selective: FLOPs <= 1.02x none",
        "plan:0.5: retained <= budget",
        "plan:0.5: predicted bytes within 10% of measured",
        "plans: strictly cheaper than every_n for at least one budget",
    } <= names
    by_name = {check.name: check for check in checks(report)}
    assert by_name["plan:0.5: retained <= budget"].passed
    assert by_name["plan:0.5: predicted bytes within 10% of measured"].passed
