"""``hf-ckpt plan`` and the bench strategies ``selective`` and ``plan:F``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_ckpt.cli import main
from hf_ckpt.measure import parse_setting, run_benchmark
from hf_ckpt.measure.report import checks
from hf_ckpt.runtime.plans import CheckpointPlan

TINY = ["--layers", "4", "--hidden", "64", "--seq", "32", "--batch", "2"]


def test_plan_command_prints_and_writes_a_loadable_plan(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "--budget", "40%", "--json", str(path), *TINY]) == 0
    out = capsys.readouterr().out
    plan = CheckpointPlan.load(path)
    assert str(plan) in out
    assert plan.num_blocks == 4 and plan.predicted_bytes <= plan.budget_bytes
    assert json.loads(path.read_text())["format"] == "hf_ckpt.CheckpointPlan"


def test_plan_command_exits_1_when_no_plan_fits(capsys):
    assert main(["plan", "--budget", "0.001", *TINY]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hf-ckpt plan: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "budget" in err


@pytest.mark.slow
def test_plan_command_runs_as_a_module(tmp_path):
    root = str(Path(__file__).resolve().parents[1])  # this checkout's hf_ckpt, installed or not
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-m", "hf_ckpt", "plan", "--budget", "64MiB", *TINY],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "CheckpointPlan for 4 blocks" in result.stdout


@pytest.mark.parametrize("spec, named", [
    ("plan", ("got plan:", "(0, 1]", "plan:0.5")),  # the accepted range and an example
    ("plan:2", ("got plan:2", "(0, 1]")),
    ("selective:fast", ("got selective:fast", "attention", "matmuls", "matmuls_and_attention")),  # the policy names
])
@pytest.mark.any_release
def test_bad_setting_specs_quote_the_spec_and_name_what_is_accepted(spec, named):
    with pytest.raises(ValueError) as error:
        parse_setting(spec)
    assert all(part in str(error.value) for part in named)


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


@pytest.mark.slow
def test_plan_from_a_config_needs_no_model_here(tmp_path, capsys, monkeypatch):
    """``--config``: a plan for a model that does not fit this machine, from shapes alone (no model is built)."""
    import hf_ckpt.measure.workload

    def forbidden(*args, **kwargs):
        raise AssertionError("no workload may be built for --config")

    monkeypatch.setattr(hf_ckpt.measure.workload, "build_workload", forbidden)
    config = Path(__file__).parent / "data" / "configs" / "llama-3.1-8b.json"
    path = tmp_path / "plan.json"
    args = ["plan", "--config", str(config), "--batch", "1", "--seq", "1024", "--dtype", "bfloat16"]
    assert main([*args, "--budget", "2GiB", "--json", str(path)]) == 0
    plan = CheckpointPlan.load(path)
    assert plan.num_blocks == 32 and plan.predicted_bytes <= plan.budget_bytes == 2 * 2**30
    assert "(estimated)" in capsys.readouterr().out
    assert main([*args, "--budget", "2GiB", "--model", "llama"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.slow
def test_autocast_plans_as_hf_ckpt_plan_does_under_autocast(tmp_path, capsys):
    """``--autocast bf16``: the measured plan is the one ``hf_ckpt.plan`` makes under autocast; with ``--config``
    the estimate's, traced under the same autocast."""
    import hf_ckpt
    from hf_ckpt.measure.workload import build_workload

    small = ["--layers", "4", "--hidden", "64", "--seq", "128", "--batch", "2"]
    path = tmp_path / "plan.json"
    assert main(["plan", "--budget", "0.5", "--autocast", "bf16", "--json", str(path), *small]) == 0
    assert "float32 with bfloat16 autocast on cpu" in capsys.readouterr().out
    work = build_workload("llama", layers=4, hidden=64, seq=128, batch=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = hf_ckpt.plan(work.model, work.batch, 0.5)
    made = CheckpointPlan.load(path)
    assert (made.strategies, made.predicted_bytes) == (expected.strategies, expected.predicted_bytes)

    config = Path(__file__).parent / "data" / "configs" / "llama-3.1-8b.json"
    args = ["plan", "--config", str(config), "--batch", "1", "--seq", "1024", "--dtype", "float32", "--budget", "4GiB"]
    assert main([*args, "--autocast", "bf16", "--json", str(path)]) == 0
    assert "float32 with bfloat16 autocast on cuda (estimated)" in capsys.readouterr().out
    mixed = CheckpointPlan.load(path)
    assert main([*args, "--json", str(path)]) == 0
    # an 8B at batch 1 x seq 1024: the bf16 casts of the weights, which backward keeps, outweigh the narrower
    # activations, so autocast retains more than float32 without checkpointing
    assert mixed.baseline_bytes > CheckpointPlan.load(path).baseline_bytes


@pytest.mark.slow
def test_a_plan_with_the_finer_strategies_is_made_and_verified_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "plan.json"
    small = ["--layers", "2", "--hidden", "64", "--seq", "32", "--batch", "2"]
    assert main(["plan", "--budget", "0.5", "--strategies", "none,full,partition,outside", "--json", str(path), *small]) == 0
    plan = CheckpointPlan.load(path)
    assert plan.outside_blocks and all(s in ("none", "full") or s.startswith("partition:") for s in plan.strategies)
    capsys.readouterr()
    assert main(["verify", "--plan", str(path), *small]) == 0
    out = capsys.readouterr().out
    assert f"plan=<{plan.summary()}>" in out and "[ok] gradient parity" in out
    assert f"outside {len(plan.outside_blocks)} module" in plan.summary()


@pytest.mark.parametrize("argv, message", [
    (["verify", "--plan", "missing.json"],
     "hf-ckpt verify: error: argument --plan: plan file 'missing.json' does not exist (see hf-ckpt verify --help)"),
    (["verify", "--plan", "{plan}", "--every-n-layers", "2"],
     "hf-ckpt verify: error: give --plan or --every-n-layers, not both: a plan already chooses every block's strategy"),
    (["plan", "--budget", "0.5", "--strategies", "none,half"],
     "hf-ckpt plan: error: argument --strategies: expected a comma-separated subset of none, selective, full, oplevel, "
     "partition, outside; got 'none,half' (see hf-ckpt plan --help)"),
    (["plan", "--budget", "0.5", "--autocast", "fp32"],
     "hf-ckpt plan: error: argument --autocast: --autocast must be bfloat16 or float16 (or bf16, fp16); got 'fp32' "
     "(see hf-ckpt plan --help)"),
    (["plan", "--budget", "0.5", "--config", "{config}", "--strategies", "none,full"],
     "hf-ckpt plan: error: --strategies cannot be combined with --config: a plan from shapes chooses among none, "
     "selective, full; leave --strategies out, or profile a real step with --model"),
])
@pytest.mark.any_release
def test_plan_and_verify_arguments_that_cannot_work_are_named_at_the_call(tmp_path, capsys, argv, message):
    plan_path = tmp_path / "plan.json"
    CheckpointPlan(("full",) * 8).save(plan_path)
    config = Path(__file__).parent / "data" / "configs" / "bert-base-uncased.json"
    argv = [a.format(plan=plan_path, config=config) for a in argv]
    assert main(argv) == 2
    assert capsys.readouterr().err == message + "\n"
