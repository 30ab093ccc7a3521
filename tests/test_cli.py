"""hf-ckpt: one-line argument errors, the table, --json and --plot; in-process and via ``python -m hf_ckpt``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_ckpt import cli

TINY = ["--layers", "2", "--hidden", "32", "--seq", "8", "--batch", "1", "--repeat", "1", "--warmup", "0"]


def run_main(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--strategies", "none,bogus"],
            "argument --strategies: unknown strategy 'bogus'; accepted: none, full, every_n:N, offload, "
            "upstream:full|upstream:every_n:N, selective[:POLICY], plan:F, oplevel:F, compile:F (see hf-ckpt bench --help)",
        ),
        (
            ["--strategies", "every_n:x"],
            "argument --strategies: every_n needs a positive int (every_n:2 recomputes every other block); "
            "got every_n:x (see hf-ckpt bench --help)",
        ),
        (["--strategies", "full,full"], "argument --strategies: strategy given more than once: full (see hf-ckpt bench --help)"),
        (["--batch", "0"], "argument --batch: expected a positive int, got '0' (see hf-ckpt bench --help)"),
        (
            ["--dtype", "float8"],
            "argument --dtype: dtype must be one of float32, bfloat16, float16 (or fp32, bf16, fp16); got 'float8' "
            "(see hf-ckpt bench --help)",
        ),
        (
            ["--device", "cuda:99"],
            "argument --device: device 'cuda:99' is not available on this machine; available: ",
        ),
        (["--model", "/no/such/model/dir"], "model directory '/no/such/model/dir' does not exist"),
        (
            ["--model", "no-such-type"],
            "unknown model 'no-such-type': not a directory, and not a transformers model type (e.g. llama, gpt2, bert, t5)",
        ),
        (["--json", "/no/such/dir/out.json"], "--json /no/such/dir/out.json: directory /no/such/dir does not exist"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate (see hf-ckpt --help)"),
    ],
)
def test_bench_argument_errors_are_one_line_with_exit_status_2(argv, message, capsys):
    code, out, err = run_main(["bench", *argv], capsys)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefix = "hf-ckpt bench: error: " if argv[0] != "--frobnicate" else "hf-ckpt: error: "
    assert lines[0].startswith(prefix + message), lines[0]


def test_python_dash_m_reports_errors_in_one_line_without_traceback():
    root = str(Path(__file__).resolve().parents[1])  # this checkout's hf_ckpt, installed or not
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "hf_ckpt", "bench", "--strategies", "nonsense"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "hf-ckpt bench: error: argument --strategies: unknown strategy 'nonsense'; accepted: none, full, every_n:N, "
        "offload, upstream:full|upstream:every_n:N, selective[:POLICY], plan:F, oplevel:F, compile:F (see hf-ckpt bench --help)"
    ]


def test_no_command_prints_help_and_exits_2(capsys):
    code, out, err = run_main([], capsys)
    assert code == 2
    assert "bench" in err and "usage: hf-ckpt" in err


def test_registered_command_runs(capsys):
    def add_arguments(parser):
        parser.add_argument("--code", type=int, default=0)

    cli.register_command("echo-test", help="test", add_arguments=add_arguments, run=lambda args: args.code)
    try:
        assert cli.main(["echo-test", "--code", "3"]) == 3
    finally:
        del cli._COMMANDS["echo-test"]


def test_bench_prints_table_and_checks_and_writes_json(tmp_path, capsys):
    json_path = tmp_path / "bench.json"
    code, out, err = run_main(["bench", *TINY, "--strategies", "full,every_n:2", "--json", str(json_path)], capsys)
    assert code == 0, err
    header = out.splitlines()[4]
    for column in ("strategy", "retained MiB", "% of none", "peak MiB", "FLOPs ratio", "step ms", "speed", "recomputed blocks"):
        assert column in header
    assert "PASS  every_n:2: recomputed blocks == selected blocks: 0 (limit 0)" in out

    data = json.loads(json_path.read_text())
    assert set(data) == {"info", "repeat", "warmup", "clock", "strategies", "checks"}
    assert set(data["info"]) >= {"model", "environment", "wall_time_s"}
    assert [row["strategy"] for row in data["strategies"]] == ["none", "full", "every_n:2"]
    assert set(data["strategies"][0]) == {
        "strategy", "description", "recomputed_blocks", "selected_blocks", "retained_bytes", "retained_fraction",
        "peak_bytes", "retained_bytes_by_device", "peak_bytes_by_device", "allocator_retained_bytes",
        "allocator_peak_bytes", "flops", "flops_ratio", "step_time_s", "step_times_s", "speed_ratio", "loss", "details",
    }
    rows = {row["strategy"]: row for row in data["strategies"]}
    assert rows["full"]["recomputed_blocks"] == [0, 1] and rows["every_n:2"]["recomputed_blocks"] == [0]
    assert rows["full"]["retained_bytes"] < rows["every_n:2"]["retained_bytes"] < rows["none"]["retained_bytes"]
    assert rows["none"]["flops"] < rows["every_n:2"]["flops"] < rows["full"]["flops"]


def test_bench_plot_writes_a_png_or_says_matplotlib_is_missing(tmp_path, capsys):
    import importlib.util

    png_path = tmp_path / "bench.png"
    code, out, err = run_main(["bench", *TINY, "--strategies", "full", "--plot", str(png_path)], capsys)
    if importlib.util.find_spec("matplotlib") is not None:
        assert code == 0, err
        assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # matplotlib is an optional dependency (hf_ckpt[bench]): refused before anything runs
        assert (code, out) == (2, "")
        assert err == "hf-ckpt bench: error: --plot needs matplotlib: pip install 'hf_ckpt[bench]'\n"
        assert not png_path.exists()
