"""hf-ckpt: arguments checked while parsing, one-line errors, --check, --progress, the table, --json and --plot."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hf_ckpt import cli
from hf_ckpt.cli import arguments, bench

ROOT = str(Path(__file__).resolve().parents[1])
TINY = ["--layers", "2", "--hidden", "32", "--seq", "8", "--batch", "1", "--repeat", "1", "--warmup", "0"]


def run_main(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _python(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)


def _one_line_error(code, out, err, command="bench"):
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"hf-ckpt {command}: error: "), lines[0]
    return lines[0]


@pytest.fixture
def no_model_is_built(monkeypatch):
    """Any attempt to build a model or profile one fails the test: the error must come from parsing."""
    import hf_ckpt.measure.workload
    import hf_ckpt.planning.planner

    def fail(*args, **kwargs):
        raise AssertionError("a model was built before the arguments were checked")

    monkeypatch.setattr(hf_ckpt.measure.workload, "build_workload", fail)
    monkeypatch.setattr(hf_ckpt.planning.planner, "profile_blocks", fail)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--settings", "none,bogus"], ("--settings", "'bogus'", "every_n:N", "plan:F")),
        (["--settings", "every_n:x"], ("--settings", "every_n:x")),
        (["--settings", "full,full"], ("--settings", "full")),
        (["--batch", "0"], ("--batch", "'0'")),
        (["--dtype", "float8"], ("--dtype", "'float8'", "bfloat16")),
        (["--autocast", "float32"], ("--autocast", "'float32'", "bfloat16 or float16")),
        (["--device", "cuda:99"], ("--device", "'cuda:99'")),
        (["--model", "/no/such/model/dir"], ("--model", "/no/such/model/dir")),
        (["--model", "no-such-type"], ("--model", "'no-such-type'", "llama")),
        (["--json", "/no/such/dir/out.json"], ("--json", "/no/such/dir")),
        (["--repeat", "-1"], ("--repeat", "'-1'")),
    ],
)
@pytest.mark.any_release
def test_bench_bad_arguments_are_rejected_while_parsing_in_one_line(argv, named, capsys, no_model_is_built):
    line = _one_line_error(*run_main(["bench", *argv], capsys))
    for text in named:
        assert text in line, line
    assert line.endswith("(see hf-ckpt bench --help)")


@pytest.mark.any_release
def test_unknown_option_names_the_program(capsys):
    code, out, err = run_main(["bench", "--frobnicate"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("hf-ckpt: error: unrecognized arguments: --frobnicate")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--budget", "2.0"], ("--budget", "'2.0'", "(0, 1]", "%", "GiB")),
        (["--budget", "-1"], ("--budget", "'-1'")),
        (["--budget", "0%"], ("--budget", "'0%'")),
        (["--budget", "0"], ("--budget", "'0'")),
        (["--budget", "512"], ("--budget", "'512'", "512B", "MiB")),  # bytes need a unit
        (["--budget", "abc"], ("--budget", "'abc'", "40GiB")),
        (["--budget", "0.5", "--strategies", "half"], ("--strategies", "'half'", "none, selective, full")),
        (["--budget", "0.5", "--strategies", ""], ("--strategies",)),
        (["--budget", "0.5", "--json", "/no/such/dir/p.json"], ("--json", "/no/such/dir")),
        (["--budget", "0.5", "--layers", "0"], ("--layers", "'0'")),
        (["--strategies", "full"], ("--budget",)),  # required
    ],
)
@pytest.mark.any_release
def test_plan_bad_arguments_are_rejected_before_any_model_is_built(argv, named, capsys, no_model_is_built):
    line = _one_line_error(*run_main(["plan", *argv], capsys), command="plan")
    for text in named:
        assert text in line, line


@pytest.mark.any_release
def test_plan_json_pointing_at_a_directory_is_one_line_naming_it(tmp_path, capsys, no_model_is_built):
    line = _one_line_error(*run_main(["plan", "--budget", "0.5", "--json", str(tmp_path)], capsys), command="plan")
    assert f"argument --json: {tmp_path} is a directory" in line


@pytest.mark.parametrize("budget, expected", [("1", 1.0), ("0.5", 0.5), ("50%", 0.5), ("2MiB", 2 * 2**20), ("2e9B", 2 * 10**9)])
@pytest.mark.any_release
def test_plan_budget_forms(budget, expected):
    from hf_ckpt.cli.plan import budget as parse

    value = parse(budget)
    assert value == expected and type(value) is type(expected)  # a fraction stays a float, bytes an int


@pytest.mark.any_release
def test_plan_strategies_are_those_the_planner_accepts():
    import inspect

    import hf_ckpt
    from hf_ckpt.cli.plan import PLAN_STRATEGIES

    default = inspect.signature(hf_ckpt.plan).parameters["strategies"].default
    assert tuple(getattr(s, "value", s) for s in default) == PLAN_STRATEGIES


@pytest.mark.any_release
def test_help_text_matches_the_registered_settings_and_workload_defaults():
    from hf_ckpt.measure import available_settings, workload

    assert bench.SETTING_SYNTAX == ", ".join(available_settings())
    for name in ("DEFAULT_MODEL", "DEFAULT_LAYERS", "DEFAULT_HIDDEN", "DEFAULT_BATCH", "DEFAULT_SEQ"):
        assert getattr(arguments, name) == getattr(workload, name), name
    import torch

    for name in ("float32", "bf16", "fp16", "torch.float16"):
        assert workload.parse_dtype(name) is getattr(torch, arguments.dtype_name(name))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["bench", "--help"],
        ["plan", "--help"],
        ["verify", "--help"],
        ["estimate", "--help"],
        ["bench", "--batch", "0"],
        ["plan", "--budget", "2.0"],
    ],
)
def test_help_and_argument_errors_import_neither_torch_nor_transformers(argv):
    code = (
        "import sys; from hf_ckpt.cli import main; status = main(sys.argv[1:]); "
        "heavy = sorted({'torch', 'transformers'} & set(sys.modules)); "
        "print('heavy:', heavy, file=sys.stderr); sys.exit(status)"
    )
    done = _python("-c", code, *argv)
    assert done.returncode == (0 if "--help" in argv else 2), done.stderr
    assert done.stderr.splitlines()[-1] == "heavy: []", done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_python_dash_m_reports_errors_in_one_line_without_traceback():
    done = _python("-m", "hf_ckpt", "bench", "--settings", "nonsense")
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("hf-ckpt bench: error: argument --settings: ") and "'nonsense'" in line


@pytest.mark.any_release
def test_no_command_prints_help_and_exits_2(capsys):
    code, out, err = run_main([], capsys)
    assert code == 2
    assert "bench" in err and "plan" in err and "verify" in err and "usage: hf-ckpt" in err


@pytest.mark.any_release
def test_a_command_module_in_the_list_is_a_subcommand(monkeypatch, capsys):
    module = types.ModuleType("hf_ckpt_test_echo")
    module.NAME, module.HELP = "echo-test", "test"
    module.add_arguments = lambda parser: parser.add_argument("--code", type=int, default=0)
    module.run = lambda args: args.code
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert cli.main(["echo-test", "--code", "3"], commands=(*cli.COMMANDS, module.__name__)) == 3
    assert cli.main(["bench", "--help"], commands=(*cli.COMMANDS, module.__name__)) == 0
    assert "echo-test" not in [action.dest for action in cli.build_parser()._actions]


@pytest.mark.any_release
def test_no_import_registers_a_command():
    import hf_ckpt.verification  # noqa: F401  (registered a command on import before 0.2)

    parser = cli.build_parser(commands=())
    assert parser.parse_args([]).command is None


# -- model directories a user may point --model at -------------------------------------------------------------


def _tiny_llama_dir(path: Path) -> Path:
    from transformers import LlamaConfig

    LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2, vocab_size=64).save_pretrained(path)
    return path


@pytest.mark.any_release
def test_model_directory_with_invalid_config_json(tmp_path, capsys, no_model_is_built):
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    line = _one_line_error(*run_main(["bench", "--model", str(tmp_path)], capsys))
    assert str(tmp_path / "config.json") in line and "not valid JSON" in line


@pytest.mark.any_release
def test_model_directory_with_unknown_model_type(tmp_path, capsys, no_model_is_built):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    line = _one_line_error(*run_main(["bench", "--model", str(tmp_path)], capsys))
    assert str(tmp_path / "config.json") in line and "'no_such_architecture'" in line


@pytest.mark.parametrize(
    "content",
    [b"not a safetensors file at all", struct.pack("<Q", 10**6) + b"{}", struct.pack("<Q", 2) + b"{x"],
    ids=["garbage", "header-longer-than-file", "header-not-json"],
)
def test_model_directory_with_corrupt_safetensors(tmp_path, capsys, no_model_is_built, content):
    _tiny_llama_dir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(content)
    line = _one_line_error(*run_main(["bench", "--model", str(tmp_path)], capsys))
    assert str(tmp_path / "model.safetensors") in line and "not a valid safetensors file" in line


def test_model_directory_with_truncated_safetensors(tmp_path, capsys, no_model_is_built):
    import torch
    from safetensors.torch import save_file

    _tiny_llama_dir(tmp_path)
    weights = tmp_path / "model.safetensors"
    save_file({"lm_head.weight": torch.zeros(64, 16)}, str(weights))
    weights.write_bytes(weights.read_bytes()[:-100])
    line = _one_line_error(*run_main(["bench", "--model", str(tmp_path)], capsys))
    assert str(weights) in line and "truncated" in line


@pytest.mark.slow
def test_model_directory_that_fails_to_load_is_one_line_naming_it(tmp_path):
    _tiny_llama_dir(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle")  # passes the parse-time checks, fails to load
    done = _python("-m", "hf_ckpt", "verify", "--model", str(tmp_path), timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if "error:" in line]
    assert line.startswith(f"hf-ckpt verify: error: cannot load the model in {tmp_path}: ")


# -- runs ---------------------------------------------------------------------------------------------------------


def test_bench_prints_table_and_checks_and_writes_json(tmp_path, capsys):
    json_path = tmp_path / "bench.json"
    argv = ["bench", *TINY, "--settings", "full,every_n:2", "--json", str(json_path)]
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    assert err == ""  # stderr is not a terminal here: no progress bar unless asked
    header = out.splitlines()[4]
    assert [cell.strip() for cell in header.strip("|").split("|")] == [
        "setting", "retained", "% of none", "peak", "FLOPs ratio", "step ms", "speed", "recomputed blocks"
    ]
    assert "PASS  every_n:2: recomputed blocks == selected blocks: 0 (limit 0)" in out

    data = json.loads(json_path.read_text())
    assert set(data) == {"info", "repeat", "warmup", "clock", "settings", "checks"}
    assert set(data["info"]) >= {"model", "environment", "wall_time_s"}
    assert [row["setting"] for row in data["settings"]] == ["none", "full", "every_n:2"]
    rows = {row["setting"]: row for row in data["settings"]}
    assert rows["full"]["recomputed_blocks"] == [0, 1] and rows["every_n:2"]["recomputed_blocks"] == [0]
    assert rows["full"]["retained_bytes"] < rows["every_n:2"]["retained_bytes"] < rows["none"]["retained_bytes"]
    assert rows["none"]["flops"] < rows["every_n:2"]["flops"] < rows["full"]["flops"]


@pytest.mark.parametrize("failing", [False, True])
def test_bench_check_exits_1_on_a_failed_check_and_a_plain_run_exits_0(failing, monkeypatch, capsys):
    from hf_ckpt.measure import report

    real = report.checks

    def outcome(result):  # the real checks, all passing, plus one failure when asked
        passed = [report.Check(c.name, c.measured, c.limit, True) for c in real(result)]
        return passed + ([report.Check("a criterion that did not hold", "2", "<= 1", False)] if failing else [])

    monkeypatch.setattr(report, "checks", outcome)
    argv = ["bench", *TINY, "--settings", "full", "--no-progress"]
    code, out, err = run_main(argv, capsys)
    assert code == 0 and ("FAIL  a criterion that did not hold" in out) == failing
    code, out, err = run_main([*argv, "--check"], capsys)
    assert code == (1 if failing else 0)
    assert ("1 check(s) failed: a criterion that did not hold" in err) == failing


@pytest.mark.parametrize(
    ("overhead", "noise", "label", "code"),
    [
        (0.0, 0.005, "PASS", 0),  # no overhead
        (0.05, 0.005, "FAIL", 1),  # a 5% slowdown in every hf_ckpt step
        (0.02, 0.06, "INCONCLUSIVE (noisy machine)", 0),  # a noisy machine: no failure
    ],
)
def test_bench_check_fails_on_a_real_overhead_only(overhead, noise, label, code, monkeypatch, capsys):
    """The timed rounds are replaced by synthetic ones (no timing in tests): ours = upstream x (1 + overhead) x
    noise."""
    import hf_ckpt.measure.bench
    from hf_ckpt.runtime.util import compat as _compat

    if not _compat.upstream_supports_every_n_layers():
        pytest.skip("this transformers release has no upstream every_n_layers (the upstream:every_n:2 setting)")

    def rounds(names, run, *, repeat, **options):
        reference = [0.2 * (1 + 0.3 * (i % 4)) for i in range(repeat)]  # drift both see
        wobble = [noise * (2 * i / (repeat - 1) - 1) for i in range(repeat)]
        wobble = wobble[::2] + wobble[1::2]
        return {name: [t * (1 + overhead) * (1 + w) if not name.startswith(("upstream:", "none")) else t
                       for t, w in zip(reference, wobble)] for name in names}

    monkeypatch.setattr(hf_ckpt.measure.bench, "interleaved_step_times", rounds)
    argv = ["bench", *TINY[:-4], "--repeat", "25", "--settings", "every_n:2,upstream:every_n:2", "--no-progress",
            "--check"]
    status, out, err = run_main(argv, capsys)
    line = next(line for line in out.splitlines() if "hf_ckpt step time vs upstream:every_n:2" in line)
    assert line.startswith(f"{label}  every_n:2: "), line
    assert "95% CI" in line and "25 rounds" in line
    assert status == code, err
    assert ("INCONCLUSIVE (noisy machine): the 95% interval straddles the limit" in out) == label.startswith("INC")
    assert ("1 check(s) failed: every_n:2: hf_ckpt step time" in err) == (code == 1)


def test_bench_progress_is_shown_when_forced_with_stderr_redirected(capsys):
    code, out, err = run_main(["bench", *TINY, "--settings", "full", "--progress"], capsys)
    assert code == 0, err
    total = "4/4"  # none and full: one measured step each, then one timed round of both
    assert "hf-ckpt bench: 100%" in err and total in err


def test_bench_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # in the bench extra; without it --plot is refused (next test)
    png_path = tmp_path / "bench.png"
    code, out, err = run_main(["bench", *TINY, "--settings", "full,upstream:full", "--plot", str(png_path)], capsys)
    assert code == 0, err
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.any_release
def test_bench_plot_without_matplotlib_is_refused_while_parsing(tmp_path, capsys, monkeypatch, no_model_is_built):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    line = _one_line_error(*run_main(["bench", "--plot", str(tmp_path / "b.png")], capsys))
    assert "--plot" in line and "pip install 'hf_ckpt[bench]'" in line
    assert not (tmp_path / "b.png").exists()


@pytest.mark.any_release
def test_progress_is_on_by_default_on_a_terminal_and_off_otherwise(monkeypatch):
    import io

    from tqdm.auto import tqdm

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        bar = bench._progress_bar(tqdm, 3, None)
        bar.update(3)
        bar.close()
        assert ("hf-ckpt bench" in stream.getvalue()) == shown


def test_bench_under_autocast_measures_the_step_the_trainer_runs(tmp_path, capsys):
    """``--autocast bf16``: forward wrapped in autocast as accelerate wraps it; the header says so and the rows are
    the measured steps of that model."""
    import torch

    from hf_ckpt.measure import measure_step
    from hf_ckpt.measure.workload import build_workload

    path = tmp_path / "bench.json"
    code, out, err = run_main(["bench", *TINY, "--settings", "none,full", "--autocast", "bf16", "--json", str(path)],
                              capsys)
    assert code == 0, err
    assert "batch 1 x seq 8, float32 with bfloat16 autocast on cpu;" in out
    rows = {row["setting"]: row for row in json.loads(path.read_text())["settings"]}
    work = build_workload(layers=2, hidden=32, seq=8, batch=1, autocast=torch.bfloat16)
    assert rows["none"]["retained_bytes"] == measure_step(work.model, work.batch).retained_bytes
    plain = build_workload(layers=2, hidden=32, seq=8, batch=1)
    assert rows["none"]["retained_bytes"] != measure_step(plain.model, plain.batch).retained_bytes
