"""Sharding in the estimate: ``world_size`` / ``shard`` / offload, per-device states, the CLI, the 70B example.

The per-rank figures are measured against real FSDP2 and DeepSpeed runs in ``tests/test_sharding_measured.py`` and
``tests/clients/test_deepspeed_sharding.py``; here: what follows from the engines' layouts whatever the model
(shards of a whole, what offload moves, what the peak and the plan include) and the arguments' errors.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys

import pytest
import transformers

from hf_ckpt import cli
from hf_ckpt.estimation import estimate
from hf_ckpt.estimation._sharding import SHARDS

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

FAST = ("none", "full")


@pytest.fixture(scope="module")
def config():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                    num_key_value_heads=2, num_hidden_layers=4, vocab_size=256,
                                    max_position_embeddings=64)


@pytest.fixture(scope="module")
def made(config):
    return {shard: estimate(config, batch_size=2, seq_len=16, dtype="float32", device="cpu", strategies=FAST,
                            world_size=4, shard=shard) for shard in SHARDS}


@pytest.mark.slow
def test_shards_divide_the_whole_model_states(made):
    whole = made["none"]
    assert whole.model_parameters_bytes == whole.parameters_bytes  # unsharded: one device holds the whole model
    for shard in ("fsdp-full", "fsdp-grad-op", "zero3"):
        sharded = made[shard]
        assert sharded.model_parameters_bytes == whole.parameters_bytes
        # a quarter each, plus the padding of each parameter to a multiple of 4 (rows or elements); ZeRO-3 also
        # keeps the parameters under its persistence threshold whole (all of this small model's)
        kept_whole = whole.parameters_bytes if shard == "zero3" else 0
        assert whole.parameters_bytes / 4 <= sharded.parameters_bytes - kept_whole < whole.parameters_bytes / 4 * 1.05
        assert whole.gradients_bytes / 4 <= sharded.gradients_bytes < whole.gradients_bytes / 4 * 1.1
    # ZeRO-1/2 keep the whole flat parameters on every rank; ZeRO-2 shards the gradients, ZeRO-1 does not
    assert made["zero1"].parameters_bytes == made["zero2"].parameters_bytes >= whole.parameters_bytes
    assert made["zero1"].gradients_bytes >= whole.gradients_bytes > 3 * made["zero2"].gradients_bytes
    # ZeRO's optimizer: fp32 master partition + fp32 Adam states of a quarter each
    assert made["zero2"].optimizer_bytes == pytest.approx(3 * whole.gradients_bytes / 4, rel=0.01)


@pytest.mark.slow
def test_the_peak_adds_gathers_and_buffers(made):
    for shard in SHARDS[1:]:
        sharded = made[shard]
        assert sharded.fixed_bytes == (sharded.parameters_bytes + sharded.gradients_bytes + sharded.optimizer_bytes
                                       + sharded.buffer_bytes + sharded.gather_bytes)
        for name in FAST:
            assert sharded.peak_bytes[name] >= sharded.fixed_bytes + sharded.activation_bytes[name]
        # activations per strategy do not depend on the sharding
        assert sharded.activation_bytes == made["none"].activation_bytes
    assert made["fsdp-grad-op"].gather_bytes > made["fsdp-full"].gather_bytes  # every unit stays gathered
    # ZeRO-3 keeps its gradient bucket; ZeRO-1/2 hold theirs through backward only; FSDP has none
    assert made["zero3"].buffer_bytes == made["zero2"].gather_bytes > 0 == made["zero2"].buffer_bytes
    assert made["fsdp-full"].buffer_bytes == 0


@pytest.mark.slow
def test_offload_moves_states_to_the_host(config):
    def run(**kwargs):
        return estimate(config, batch_size=1, seq_len=8, dtype="bfloat16", device="cpu", strategies=FAST,
                        world_size=2, **kwargs)

    on_device, offloaded = run(shard="zero3"), run(shard="zero3", offload_optimizer=True)
    assert offloaded.optimizer_bytes == 0 and offloaded.gradients_bytes == 0
    assert offloaded.host_bytes >= on_device.optimizer_bytes + on_device.gradients_bytes
    both = run(shard="zero3", offload_optimizer=True, offload_parameters=True)
    assert both.host_bytes > offloaded.host_bytes
    fsdp = run(shard="fsdp-full", offload_parameters=True)
    assert fsdp.parameters_bytes == fsdp.gradients_bytes == fsdp.optimizer_bytes == 0 and fsdp.host_bytes > 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"world_size": 0}, "world_size must be a positive int; got 0"),
    ({"shard": "zero4"}, "shard must be one of none, fsdp-full, fsdp-grad-op, zero1, zero2, zero3; got 'zero4'"),
    ({"shard": "fsdp-full", "offload_optimizer": True}, "offload_optimizer: FSDP offloads parameters"),
    ({"shard": "zero2", "offload_parameters": True}, "offload_parameters: DeepSpeed offloads parameters with zero3"),
    ({"offload_optimizer": True}, "offload_optimizer / offload_parameters need a shard"),
    ({"shard": "zero3", "offload_optimizer": "yes"}, "offload_optimizer must be True or False"),
    ({"fsdp_param_dtype": "bf16"}, "fsdp_param_dtype: FSDP2's mixed precision needs shard='fsdp-full' or "
     "'fsdp-grad-op'; got shard='none'"),
    ({"shard": "fsdp-full", "fsdp_param_dtype": "float32"}, "fsdp_param_dtype must be None, bfloat16 or float16 (or "
     "bf16, fp16, or the torch dtype); got 'float32'"),
    ({"shard": "fsdp-full", "fsdp_param_dtype": "bf16", "dtype": "float32", "autocast": "bf16"},
     "fsdp_param_dtype: FSDP2's mixed precision runs the forward in it already; leave autocast None"),
])
def test_bad_sharding_arguments_name_the_argument(config, kwargs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        estimate(config, batch_size=1, seq_len=8, **kwargs)


@pytest.fixture(scope="module")
def config_path(config, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-sharded")
    config.save_pretrained(folder)
    return str(folder / "config.json")


@pytest.mark.slow
def test_cli_json_gains_the_sharding_and_the_plan_fits_per_device(config_path, tmp_path, capsys):
    out_json = tmp_path / "est.json"
    argv = ["estimate", config_path, "--batch", "2", "--seq", "16", "--dtype", "float32", "--device", "cpu",
            "--strategies", "none,full", "--world-size", "4", "--shard", "zero3", "--json", str(out_json)]
    assert cli.main(argv) == 0
    data = json.loads(out_json.read_text())
    for key in ("world_size", "shard", "buffer_bytes", "gather_bytes", "host_bytes", "model_parameters_bytes"):
        assert key in data
    assert data["world_size"] == 4 and data["shard"] == "zero3"
    # a device that holds the per-device states and half the activations: "none" does not fit, a plan does
    device_memory = data["peak_bytes"]["full"] + (data["activation_bytes"]["none"] - data["activation_bytes"]["full"]) // 2
    capsys.readouterr()
    assert cli.main([*argv, "--device-memory", f"{device_memory}B"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert {name: data["fits"][name] for name in ("none", "full")} == {"none": False, "full": True}
    assert "per device of 4 (zero3)" in out and "cheapest plan that fits:" in out
    assert data["plan"]["budget_bytes"] + data["parameters_bytes"] + data["gradients_bytes"] + data[
        "optimizer_bytes"] + data["buffer_bytes"] + data["gather_bytes"] + max(data["transient_bytes"].values()) \
        == device_memory


def test_cli_fsdp_mixed_precision_says_what_is_gathered_in_it(config_path, tmp_path, capsys):
    out_json = tmp_path / "est.json"
    argv = ["estimate", config_path, "--batch", "2", "--seq", "16", "--dtype", "float32", "--device", "cpu",
            "--strategies", "none", "--world-size", "2", "--shard", "fsdp-full", "--json", str(out_json)]
    assert cli.main([*argv, "--fsdp-param-dtype", "bf16"]) == 0
    mixed = json.loads(out_json.read_text())
    assert "(fsdp-full, units gathered and computed in bfloat16)" in capsys.readouterr().out
    assert cli.main(argv) == 0
    plain = json.loads(out_json.read_text())
    assert (mixed["fsdp_param_dtype"], plain["fsdp_param_dtype"]) == ("bfloat16", None)
    assert mixed["optimizer_bytes"] == plain["optimizer_bytes"] and mixed["gather_bytes"] * 2 == plain["gather_bytes"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--world-size", "0"], "--world-size must be a positive int; got 0"),
    (["--shard", "fsdp"], "--shard must be one of none, fsdp-full, fsdp-grad-op, zero1, zero2, zero3; got 'fsdp'"),
    (["--shard", "zero1", "--offload-parameters"], "--offload-parameters: DeepSpeed offloads parameters with zero3"),
    (["--shard", "zero3", "--fsdp-param-dtype", "bf16"], "--fsdp-param-dtype: FSDP2's mixed precision needs shard="),
])
def test_cli_sharding_errors_name_the_option(config_path, argv, message, capsys):
    code = cli.main(["estimate", config_path, "--batch", "1", "--seq", "8", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def _llama_70b(folder) -> str:
    """A Llama-3.1-70B-shaped config.json, written here (no download)."""
    transformers.LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
    ).save_pretrained(folder)
    return str(folder / "config.json")


@pytest.mark.slow
def test_70b_on_8_devices_zero3_prints_per_device_figures_and_a_plan_that_fits(tmp_path):
    """The issue's done-when, in a fresh process: within 60 s of CPU and 2 GiB RSS. Full AdamW states of 70B over 8
    devices take 16 bytes x 70.6e9 / 8 = 131 GiB each: no plan fits 80 GiB with the states on the device, and
    the command says so; with the optimizer offloaded (ZeRO-3 + offload_optimizer) a plan fits."""
    config = _llama_70b(tmp_path)
    argv = [sys.executable, "-m", "hf_ckpt", "estimate", config, "--batch", "1", "--seq", "8192", "--world-size", "8",
            "--shard", "zero3", "--device-memory", "80GiB", "--json", str(tmp_path / "est.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    plain = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert plain.returncode == 1 and "no plan fits a budget of 80.00 GiB" in plain.stdout, plain.stdout + plain.stderr
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    offloaded = subprocess.run([*argv, "--offload-optimizer"], capture_output=True, text=True, env=env, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds, not wall clock: the bound holds on an idle machine (42 s wall there), and a loaded one only
    # stretches the wall clock
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    rss = after.ru_maxrss * 1024
    assert offloaded.returncode == 0, offloaded.stdout + offloaded.stderr
    assert "per device of 8 (zero3, offload optimizer)" in offloaded.stdout
    assert "cheapest plan that fits:" in offloaded.stdout
    data = json.loads((tmp_path / "est.json").read_text())
    assert data["plan"] is not None and data["host_bytes"] > 0
    assert math.isclose(data["model_parameters_bytes"] / data["parameters_bytes"], 8, rel_tol=0.01)
    assert cpu_s < 60 and rss < 2 * 2**30, (cpu_s, rss)


def test_the_whole_model_optimizer_is_counted_as_the_per_device_one(config):
    """Under ZeRO the whole model's optimizer is what the ranks hold together (fp32 master weights and fp32 states,
    12 bytes a parameter for AdamW), not two states in the parameters' dtype; the output says which definition."""
    bf16 = {shard: estimate(config, batch_size=2, seq_len=16, dtype="bfloat16", device="cuda", strategies=("full",),
                            world_size=4, shard=shard) for shard in ("none", "zero2", "zero3", "fsdp-full")}
    trainable = bf16["none"].gradients_bytes // 2  # bf16 gradients: 2 bytes an element
    for shard in ("zero2", "zero3"):
        assert bf16[shard].model_optimizer_bytes == 12 * trainable
        # the ranks' shares add up to it, give or take the partitions' padding
        assert 4 * bf16[shard].optimizer_bytes == pytest.approx(bf16[shard].model_optimizer_bytes, rel=0.01)
        assert "optimizer figures count fp32 master weights and fp32 states, as DeepSpeed keeps them" in str(bf16[shard])
    # FSDP's optimizer states live on the sharded parameters, in their dtype: the single-device definition
    assert bf16["fsdp-full"].model_optimizer_bytes == bf16["none"].optimizer_bytes == 4 * trainable
    assert "optimizer figures count states in the parameters' dtype, as torch.optim keeps them" in str(bf16["fsdp-full"])
