"""DeepSpeed 0.19 on CPU (``DS_ACCELERATOR=cpu``, gloo), 1 and 2 processes, ZeRO 2 and 3, with hf_ckpt.

Runs in the clients environment (``python ci/clients.py``, which caches ``TORCH_EXTENSIONS_DIR``: the first
``deepspeed.initialize`` compiles a small op); skipped where DeepSpeed is not installed.

Each rank runs ``_deepspeed_worker.py`` (one process per rank, meeting through a file store) and saves what it
measured; the tests compare scenarios: loss and full gradients (``safe_get_full_grad``) against the same run without
checkpointing (``gradient_clipping`` 0, ``stage3_param_persistence_threshold`` 0 so that every parameter is gathered
for real), the blocks recomputed (``BlockRunCounter``), the all-gathers of the backward.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

deepspeed = pytest.importorskip("deepspeed")

WORKER = Path(__file__).with_name("_deepspeed_worker.py")
ROOT = Path(__file__).resolve().parents[2]
SELECTED = [0, 2]  # the worker's every_n_layers=2 on a 4-block Llama

ONE_PROCESS = (
    "2:none", "2:enable-engine", "2:enable-before", "3:none", "3:enable-before", "3:enable-engine",
    "3:apply-engine", "3:ds-checkpoint", "3:ds-nonreentrant", "3:config-block", "3:trainer",
)
TWO_PROCESSES = (
    "2:none", "2:enable-before", "3:none", "3:enable-before", "3:ds-checkpoint", "3:ds-cpu", "3:ds-config",
    "3:none:step2", "3:enable-before:step2", "3:none:reuse0+step2", "3:enable-before:reuse0+step2", "2:trainer",
    "3:enable-before:mlp",
)


def _run(world_size: int, scenarios: tuple[str, ...], tmp: Path) -> list[dict]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(world_size), str(tmp / "init"), str(tmp), ",".join(scenarios)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp,
        )
        for rank in range(world_size)
    ]
    outputs = [process.communicate(timeout=900)[0] for process in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-4000:]
    return [torch.load(tmp / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return _run(1, ONE_PROCESS, tmp_path_factory.mktemp("ds1"))


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    return _run(2, TWO_PROCESSES, tmp_path_factory.mktemp("ds2"))


def _ok(result: dict) -> dict:
    assert "error" not in result, result.get("traceback")
    return result


def _max_grad_diff(reference: dict, other: dict) -> float:
    assert reference.keys() == other.keys()
    assert all(grad is not None for grad in reference.values())
    return max((reference[name] - other[name]).abs().max().item() for name in reference)


def _assert_parity(ranks: list[dict], reference: str, scenario: str) -> None:
    for results in ranks:
        ref, run = _ok(results[reference]), _ok(results[scenario])
        assert ref["recomputed"] == []
        assert run["recomputed"] == SELECTED
        assert torch.equal(run["loss"], ref["loss"])
        assert _max_grad_diff(ref["grads"], run["grads"]) == 0.0


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("world_size", [1, 2])
def test_enable_before_initialize_is_exact(one_process, two_processes, world_size, stage):
    ranks = one_process if world_size == 1 else two_processes
    _assert_parity(ranks, f"{stage}:none", f"{stage}:enable-before")


def test_the_chunked_mlp_and_norms_under_zero3_are_exact(two_processes):
    """mlp_chunk_size (each block's MLP and norms in checkpointed chunks, run from their hooks) on parameters ZeRO-3
    partitions over two ranks: the loss and every gradient as without checkpointing (to float rounding: the chunks
    sum the weights' gradients in another order)."""
    for results in two_processes:
        reference, run = _ok(results["3:none"]), _ok(results["3:enable-before:mlp"])
        assert run["recomputed"] == SELECTED
        assert torch.equal(run["loss"], reference["loss"])
        assert _max_grad_diff(reference["grads"], run["grads"]) < 1e-6


def test_two_ranks_see_different_batches(two_processes):
    losses = [results["3:none"]["loss"] for results in two_processes]
    assert not torch.equal(losses[0], losses[1])  # the gradients compared above are reduced across ranks


@pytest.mark.parametrize("scenario", ["2:enable-engine", "3:enable-engine", "3:apply-engine"])
def test_functions_accept_the_engine(one_process, scenario):
    result = _ok(one_process[0][scenario])
    assert result["checkpointed_layers"] == SELECTED
    _assert_parity(one_process, scenario.split(":")[0] + ":none", scenario)
    if scenario.endswith("enable-engine"):
        assert result["after_disable"] == []


def test_verify_accepts_the_engine(one_process):
    # ZeRO-2: verify's own loss.backward() goes through DeepSpeed's backward hooks (at stage 0 DeepSpeed refuses
    # a direct backward and asks for engine.backward; verify is then not usable on the engine).
    assert one_process[0]["2:enable-engine"]["verify"] == {"recomputed": SELECTED, "gradients_ok": True}


@pytest.mark.parametrize("world_size", [1, 2])
def test_checkpoint_fn_deepspeed_checkpoint_is_exact(one_process, two_processes, world_size):
    ranks = one_process if world_size == 1 else two_processes
    _assert_parity(ranks, "3:none", "3:ds-checkpoint")


def test_deepspeed_cpu_checkpointing_as_measured(two_processes):
    """DeepSpeed's own partition_activations + checkpoint_in_cpu, through checkpoint_fn, on a CPU host."""
    for scenario in ("3:ds-cpu", "3:ds-config"):
        assert two_processes[0][scenario]["ds_checkpointing"] == {"partition": True, "cpu": True}
        _assert_parity(two_processes, "3:none", scenario)


def test_deepspeed_non_reentrant_checkpoint_fails_under_zero3(one_process):
    assert "size of tensor a (0)" in one_process[0]["3:ds-nonreentrant"]["error"]


def test_zero3_regathers_checkpointed_blocks_depending_on_reuse_distance(two_processes):
    gathers = {name: two_processes[0][name]["backward_all_gathers"] for name in two_processes[0] if "step2" in name}
    # Default reuse distance: after the traced first step, the parameters stay gathered: nothing re-gathered.
    assert gathers["3:none:step2"] == gathers["3:enable-before:step2"] == 0
    # stage3_max_reuse_distance 0: the backward gathers again, and the recompute of each checkpointed block gathers
    # that block's parameters once more (at most one all-gather per parameter).
    assert gathers["3:none:reuse0+step2"] > 0
    extra = gathers["3:enable-before:reuse0+step2"] - gathers["3:none:reuse0+step2"]
    assert len(SELECTED) <= extra <= sum(1 for _ in _block_parameters()) * len(SELECTED)
    _assert_parity(two_processes, "3:none:reuse0+step2", "3:enable-before:reuse0+step2")


def _block_parameters():
    from helpers import tiny_llama

    return tiny_llama().model.layers[0].parameters()


def test_config_block_is_named_in_one_warning(one_process):
    result = _ok(one_process[0]["3:config-block"])
    assert result["ignored_keys"] == ["partition_activations", "cpu_checkpointing"]
    warned = [w for w in result["warnings"] if '"activation_checkpointing" block' in w]
    assert len(warned) == 1
    assert "partition_activations, cpu_checkpointing" in warned[0] and "offload=True" in warned[0]


@pytest.fixture(scope="module")
def trainer_without_checkpointing(tmp_path_factory):
    return _run(1, ("3:trainer-off",), tmp_path_factory.mktemp("ds-off"))


def test_trainer_with_the_config_block_and_checkpointing_off_warns_once(trainer_without_checkpointing):
    """TrainingArguments(deepspeed=config with the block, gradient_checkpointing=False), patched: nothing is
    recomputed (the block alone checkpoints nothing), and one warning at the start of training says so, naming
    the keys set and what to do instead."""
    result = _ok(trainer_without_checkpointing[0]["3:trainer-off"])
    assert result["recomputed"] == [] and result["checkpointed_layers"] == []
    warned = [w for w in result["warnings"] if '"activation_checkpointing" block' in w]
    assert len(warned) == 1, result["warnings"]
    assert "sets partition_activations, cpu_checkpointing, but activation checkpointing is off" in warned[0]
    assert "gradient_checkpointing=True" in warned[0] and "cpu_checkpointing: offload=True" in warned[0]


@pytest.mark.parametrize("world_size, scenario", [(1, "3:trainer"), (2, "2:trainer")])
def test_trainer_with_deepspeed_config(one_process, two_processes, world_size, scenario):
    """TrainingArguments(deepspeed=config, use_cpu=True), patched: every_n_layers applies, the block is named."""
    for results in one_process if world_size == 1 else two_processes:
        result = _ok(results[scenario])
        assert result["recomputed"] == SELECTED and result["checkpointed_layers"] == SELECTED
        warned = [w for w in result["warnings"] if '"activation_checkpointing" block' in w]
        assert len(warned) == 1 and "partition_activations, cpu_checkpointing" in warned[0]
