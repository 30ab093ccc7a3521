"""hf-ckpt estimate: the table, --device-memory with the plan that fits, --json keys, one-line argument errors."""

from __future__ import annotations

import json
import re

import pytest
import transformers

from hf_ckpt import CheckpointPlan
from hf_ckpt import cli

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                             num_hidden_layers=6, vocab_size=128, max_position_embeddings=64).save_pretrained(folder)
    return str(folder / "config.json")


@pytest.mark.slow
def test_table_json_and_the_plan_that_fits(config_path, tmp_path, capsys):
    out_json, plan_json = tmp_path / "est.json", tmp_path / "plan.json"
    fast = ["--strategies", "none,full"]
    code = cli.main(["estimate", config_path, "--batch", "2", "--seq", "16", "--dtype", "float32", "--device", "cpu",
                     "--json", str(out_json), *fast])
    assert code == 0
    data = json.loads(out_json.read_text())
    # a device between the two peaks, with room for the planner's bound on every block full: "none" does not fit,
    # "full" does, and so does a plan
    peaks, held = data["peak_bytes"], data["held_above_bytes"][""]
    device_memory = max((peaks["none"] + peaks["full"]) // 2, held + data["activation_bytes"]["full"])
    assert peaks["full"] <= device_memory < peaks["none"]
    capsys.readouterr()
    code = cli.main(["estimate", config_path, "--batch", "2", "--seq", "16", "--dtype", "float32", "--device", "cpu",
                     "--device-memory", f"{device_memory}B", "--json", str(out_json), "--plan-json", str(plan_json),
                     *fast])
    out = capsys.readouterr().out
    assert code == 0
    assert "strategy" in out and "FLOPs ratio" in out and "cheapest plan that fits:" in out
    data = json.loads(out_json.read_text())
    for key in ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activation_bytes", "peak_bytes",
                "flops_ratio"):
        assert key in data
    assert {"none", "full"} <= set(data["activation_bytes"])
    assert data["fits"]["none"] is False and data["fits"]["full"] is True
    plan = CheckpointPlan.load(plan_json)
    assert plan.num_blocks == 6 and set(plan.strategies) - {"none"}
    assert plan.predicted_bytes <= plan.budget_bytes


@pytest.mark.slow
def test_keep_outputs_is_estimated_and_said_in_the_json(config_path, tmp_path, capsys):
    """--keep-outputs counts the logits the kept output object holds (float32: 4 bytes each) and the JSON says
    which loop was estimated."""
    data = {}
    for flag in ([], ["--keep-outputs"]):
        path = tmp_path / f"est{len(flag)}.json"
        code = cli.main(["estimate", config_path, "--batch", "2", "--seq", "16", "--dtype", "float32", "--device",
                         "cpu", "--strategies", "none,full", "--json", str(path), *flag])
        assert code == 0
        data[bool(flag)] = json.loads(path.read_text())
    out = capsys.readouterr().out
    assert "outputs kept through backward" in out and "outputs dropped" in out
    assert data[True]["keep_outputs"] is True and data[False]["keep_outputs"] is False
    logits = 2 * 16 * 128 * 4
    for strategy in ("none", "full"):
        # at least the logits (older releases' outputs also hold the key/value cache)
        assert data[True]["activation_bytes"][strategy] - data[False]["activation_bytes"][strategy] >= logits


def test_keep_outputs_with_check_is_refused(config_path, capsys):
    code = cli.main(["estimate", config_path, "--batch", "1", "--seq", "8", "--check", "--keep-outputs"])
    err = capsys.readouterr().err
    assert code == 2 and "--keep-outputs: --check compares the Trainer's step" in err


def test_nothing_fits_is_exit_status_1(config_path, capsys):
    code = cli.main(["estimate", config_path, "--batch", "1", "--seq", "8", "--device-memory", "1KiB",
                     "--strategies", "none,full"])
    assert code == 1
    assert "no plan fits a budget of" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch", "0"], "batch_size must be a positive int; got 0"),
        (["--dtype", "float8"], "dtype must be one of float32, bfloat16, float16"),
        (["--device", "tpu"], "device must be one of cuda, cpu; got 'tpu'"),
        (["--optimizer", "lion"], "optimizer must be one of adamw_torch, adamw_torch_fused, adafactor, sgd, rmsprop, adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit, paged_adamw_32bit, lion_8bit, lion_32bit, paged_lion_8bit, paged_lion_32bit, rmsprop_bnb, rmsprop_bnb_8bit, rmsprop_bnb_32bit, ademamix, ademamix_8bit, paged_ademamix_8bit, paged_ademamix_32bit (the Trainer's optim names) or adamw, adam, sgd_momentum; got 'lion'"),
        (["--device-memory", "80"], "--device-memory: expected a size with a unit"),
        (["--json", "/no/such/dir/x.json"], "--json: the folder of '/no/such/dir/x.json' does not exist"),
        (["--plan-json", "plan.json"], "--plan-json needs --device-memory"),
        (["--lora-r", "0"], "--lora-r must be a positive int; got 0"),
    ],
)
def test_argument_errors_are_one_line_with_exit_status_2(config_path, argv, message, capsys):
    base = {"--batch": "1", "--seq": "8"}
    for option, value in zip(argv[::2], argv[1::2]):
        base[option] = value
    flat = [item for pair in base.items() for item in pair]
    code = cli.main(["estimate", config_path, *flat])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hf-ckpt estimate: error: ") and message in err and err.count("\n") == 1


@pytest.mark.any_release
def test_missing_config_is_named(capsys):
    code = cli.main(["estimate", "/no/such/config.json", "--batch", "1", "--seq", "8"])
    assert code == 2
    assert "model_or_config: no config.json at '/no/such/config.json'" in capsys.readouterr().err


@pytest.mark.parametrize("autocast", [[], ["--dtype", "float32", "--autocast", "bf16"]])
@pytest.mark.slow
def test_encoders_with_a_mask_are_estimated_for_cuda_with_every_strategy(autocast, capsys):
    """BERT passes an attention mask: on ``--device cuda`` (the default) its modelled fused attention must also
    serve a checkpoint's recompute in backward (it raised a CheckpointError before), in float32 and under autocast."""
    from pathlib import Path

    config = Path(__file__).parent / "data" / "configs" / "bert-base-uncased.json"
    argv = ["estimate", str(config), "--batch", "1", "--seq", "128", "--strategies", "none,full,every_n:2,selective"]
    assert cli.main([*argv, *autocast]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "modelled, unverified on hardware" in out
    for strategy in ("none", "full", "every_n:2", "selective"):
        assert f"\n{strategy} " in out


def test_the_check_model_repeats_the_layer_types_of_a_config_with_fewer_blocks():
    """``estimate --check`` builds BLOCKS blocks; a config with fewer (a 2-layer Gemma-2) has its layer pattern
    repeated to that many, not cut short (which made the tiny model's build fail with an IndexError)."""
    from transformers import Gemma2Config

    from hf_ckpt.estimation._check import BLOCKS, tiny_config

    config = Gemma2Config(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    tiny = tiny_config(config)
    assert tiny.num_hidden_layers == BLOCKS
    assert tiny.layer_types == ["sliding_attention", "full_attention"] * (BLOCKS // 2)


def test_offload_adds_the_offloaded_rows_with_their_host_memory(config_path, tmp_path, capsys):
    """--offload: each row with every block full gets its +offload row, less on the device by all but two blocks'
    inputs, the host column saying what the host holds (the 6 blocks' float32 inputs); the other rows show '-'."""
    path = tmp_path / "est.json"
    code = cli.main(["estimate", config_path, "--batch", "2", "--seq", "16", "--dtype", "float32", "--device", "cpu",
                     "--strategies", "none,full", "--offload", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(path.read_text())
    one_input = 2 * 16 * 32 * 4
    every_block = [name for name in data["activation_bytes"]
                   if (name == "full" or name.startswith("full+")) and not name.endswith("+offload")]
    assert "full" in every_block  # and the chunked head's row, on releases where it runs
    assert data["activation_host_bytes"] == {f"{name}+offload": 6 * one_input for name in every_block}
    assert data["activation_bytes"]["full"] - data["activation_bytes"]["full+offload"] == 6 * one_input
    # the step's peak falls in the first block's backward, when every other block's activations are freed and its
    # own input is back on the device: the offload lowers the activations, not that peak
    assert data["peak_phase"]["full"] == data["peak_phase"]["full+offload"] == "the backward of block 0"
    assert data["peak_bytes"]["full"] == data["peak_bytes"]["full+offload"]
    header = next(line for line in out.splitlines() if line.startswith("strategy"))
    assert header.split() == ["strategy", "activations", "peak", "fits", "FLOPs", "ratio", "host", "first", "step",
                              "peak", "in"]
    rows = {line.split()[0]: re.split(r"\s{2,}", line.strip()) for line in out.splitlines()
            if line.split() and line.split()[0] in ("none", "full", "full+offload")}
    host = re.split(r"\s{2,}", header.strip()).index("host")
    assert rows["none"][host] == rows["full"][host] == "-"
    assert rows["full+offload"][host] == "0.02 MiB"


def test_offload_activations_must_be_a_bool():
    from hf_ckpt.estimation import estimate

    with pytest.raises(ValueError, match="offload_activations"):
        estimate(transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=64),
                 batch_size=1, seq_len=8, offload_activations="yes")


def test_offload_on_cuda_says_whether_the_copies_hide_behind_compute(config_path, capsys):
    """On CUDA an offloaded row's copies are compared with a block's forward at --pcie-bandwidth: a bandwidth slow
    enough makes them not hide (a tiny model's blocks compute little: only a bandwidth far beyond PCIe hides them)."""
    for bandwidth, verdict in (("1000000", ": hidden behind compute"), ("25", ": NOT hidden behind compute")):
        code = cli.main(["estimate", config_path, "--batch", "1", "--seq", "16", "--strategies", "none,full",
                         "--offload", "--pcie-bandwidth", bandwidth])
        out = capsys.readouterr().out
        assert code == 0
        [line] = [line for line in out.splitlines() if line.startswith("offload copies: ")]
        assert f"at {float(bandwidth):g} GB/s" in line and verdict in line
