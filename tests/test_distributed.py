"""hf_ckpt under DDP, FSDP2 and FSDP1 (two processes over gloo, on CPU), ``hf_ckpt.distributed.apply`` and the guard.

The two-process runs happen once per module (``two_ranks``): ``_distributed_worker.py`` runs every scenario on
both ranks and reports losses, gradients, recomputed blocks (counted), all-gathers and per-rank activation
memory (``hf_ckpt.measure.StorageTracker``). Every distributed number is compared with a single-process run of
the same model on the same global batch, or with the same engine without checkpointing.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

import hf_ckpt
import hf_ckpt.distributed
from _distributed_worker import clean_name, global_batch
from hf_ckpt import HfCkptWarning
from hf_ckpt.runtime.counting import BlockRunCounter
from hf_ckpt.distributed.checks import DDP_REENTRANT_MESSAGE
from helpers import MODEL_BUILDERS, batch_for, max_grad_diff, tiny_llama
from test_head import HAS_LOSS_FUNCTION
from torch_capabilities import has, requires

WORKER = Path(__file__).with_name("_distributed_worker.py")
TIMEOUT_S = 420

EVERY_OTHER = [0, 2]  # every_n_layers=2 on the 4-block model
LAYERS = [1, 2]  # layers=[1, 2]
CHECKPOINTED = {
    "ddp:enable-before": EVERY_OTHER,
    "ddp:enable-after": EVERY_OTHER,
    "ddp:apply-before": EVERY_OTHER,
    "ddp:apply-after": EVERY_OTHER,
    "ddp:reentrant-static": EVERY_OTHER,
    "fsdp2:enable-before": EVERY_OTHER,
    "fsdp2:enable-after": EVERY_OTHER,
    "fsdp2:enable-layers": LAYERS,
    "fsdp2:apply-before": EVERY_OTHER,
    "fsdp2:apply-after": EVERY_OTHER,
    "fsdp2:apply-layers": LAYERS,
    "fsdp2:double": [0, 1, 2, 3],
    "fsdp2:double-unguarded": [0, 1, 2, 3],
    "ddp:enable-wrapped": EVERY_OTHER,
    "fsdp1:enable-after": EVERY_OTHER,
    "fsdp1:enable-wrapped": EVERY_OTHER,
    "fsdp1:enable-before": EVERY_OTHER,
    "fsdp1:apply-before": EVERY_OTHER,
    "fsdp1:apply-after": EVERY_OTHER,
}
BASELINES = ["ddp:none", "fsdp2:none", "fsdp1:none"]
SCENARIOS = BASELINES + list(CHECKPOINTED) + ["ddp:reentrant-unused"]
#: What the worker runs: the scenarios of the engines this torch has (FSDP2's are skipped without it).
RUNNABLE = [s for s in SCENARIOS if has("distributed.fsdp.fully_shard") or not s.startswith("fsdp2")]

def _scenarios(names: list[str]) -> list:
    """``names`` as parameters; an FSDP2 scenario needs ``torch.distributed.fsdp.fully_shard`` (skipped without it)."""
    return [pytest.param(name, marks=requires("distributed.fsdp.fully_shard")) if name.startswith("fsdp2") else name
            for name in names]


def _double_checkpointing(messages: list[str], blocks: str, whose: str = "torch.distributed's checkpoint_wrapper") -> bool:
    """Exactly one warning that blocks are checkpointed twice, naming the blocks, whose wrapper has them and the two
    ways out (switch the other checkpointing off, or let hf_ckpt.distributed.apply do the wrapping)."""
    found = [message for message in messages if "already checkpointed" in message]
    assert len(found) == 1, found
    for part in (blocks, whose, "fsdp_activation_checkpointing: false", "hf_ckpt.distributed.apply"):
        assert part in found[0], (part, found[0])
    return True


def _launch(out_dir: Path, scenarios: list[str] = RUNNABLE) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    init_file = out_dir / "rendezvous"
    command = [sys.executable, str(WORKER), "{rank}", "2", str(init_file), str(out_dir), ",".join(scenarios)]
    processes = [
        subprocess.Popen(
            [part.format(rank=rank) for part in command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for rank, (process, output) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0, f"rank {rank} exited with {process.returncode}:\n{output[-4000:]}"
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    return _launch(tmp_path_factory.mktemp("distributed"))


@pytest.fixture(scope="module")
def single_process() -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of one process on the whole global batch, no checkpointing."""
    model = tiny_llama()
    model.train()
    ids = global_batch()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def _ok(two_ranks: list[dict], scenario: str) -> list[dict]:
    results = [rank[scenario] for rank in two_ranks]
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}: {result.get('traceback')}"
    return results


# --- the same training, whatever the engine ----------------------------------------------------------------------


@pytest.mark.parametrize("scenario", _scenarios(BASELINES + list(CHECKPOINTED)))
def test_loss_and_gradients_equal_single_process(two_ranks, single_process, scenario):
    rank0, rank1 = _ok(two_ranks, scenario)
    loss, grads = single_process
    assert rank0["loss"] == pytest.approx(loss, abs=1e-5)
    assert rank1["loss"] == pytest.approx(loss, abs=1e-5)
    assert max_grad_diff(grads, rank0["grads"]) <= 1e-5


@pytest.mark.parametrize("scenario", _scenarios(list(CHECKPOINTED)))
def test_each_rank_recomputes_exactly_the_selected_blocks(two_ranks, scenario):
    for result in _ok(two_ranks, scenario):
        assert result["recomputed"] == CHECKPOINTED[scenario]


@pytest.mark.parametrize("scenario", _scenarios(BASELINES))
def test_without_checkpointing_nothing_is_recomputed(two_ranks, scenario):
    for result in _ok(two_ranks, scenario):
        assert result["recomputed"] == []


@pytest.mark.parametrize("scenario", _scenarios(list(CHECKPOINTED)))
def test_each_rank_keeps_less_activation_memory(two_ranks, scenario):
    baseline = f"{scenario.split(':')[0]}:none"
    for with_checkpointing, without in zip(_ok(two_ranks, scenario), _ok(two_ranks, baseline)):
        assert 0 < with_checkpointing["retained_bytes"] < without["retained_bytes"]


@pytest.mark.parametrize("scenario", _scenarios([s for s in CHECKPOINTED if s.startswith("fsdp")]))
def test_backward_issues_no_extra_allgather(two_ranks, scenario):
    """The recompute runs on the parameters FSDP already gathered for backward: checkpoint regions sit in the units."""
    baseline = f"{scenario.split(':')[0]}:none"
    for with_checkpointing, without in zip(_ok(two_ranks, scenario), _ok(two_ranks, baseline)):
        assert without["allgathers"] > 0
        assert with_checkpointing["allgathers"] == without["allgathers"]


@pytest.mark.parametrize("scenario", _scenarios(list(CHECKPOINTED)))
def test_checkpointed_layers_reports_the_selection_under_the_engine(two_ranks, scenario):
    for result in _ok(two_ranks, scenario):
        assert result["checkpointed_layers"] == CHECKPOINTED[scenario]


@pytest.mark.parametrize("scenario", _scenarios([s for s in CHECKPOINTED if "apply" in s]))
def test_wrapped_layers_reports_the_selection_under_the_engine(two_ranks, scenario):
    for result in _ok(two_ranks, scenario):
        assert result["wrapped_layers"] == CHECKPOINTED[scenario]


# --- DDP and reentrant checkpointing ------------------------------------------------------------------------------


def test_ddp_find_unused_parameters_with_reentrant_checkpointing_is_caught_at_forward(two_ranks):
    for rank in two_ranks:
        assert rank["ddp:reentrant-unused"]["error"] == ("RuntimeError", DDP_REENTRANT_MESSAGE)


def test_ddp_static_graph_with_reentrant_checkpointing_trains(two_ranks):
    for result in _ok(two_ranks, "ddp:reentrant-static"):
        assert result["recomputed"] == EVERY_OTHER


# --- one checkpoint per block ------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", _scenarios(["fsdp2:double", "fsdp2:double-unguarded"]))
def test_engine_checkpoint_wrappers_win_over_hf_ckpt_under_fsdp2(two_ranks, scenario):
    """hf_ckpt.enable on every block, then the engine wraps every block (reentrant): each block runs twice, not 3x.

    ``hf_ckpt.enable`` installs the guard itself; calling ``guard`` as well changes nothing.
    """
    for result in _ok(two_ranks, scenario):
        assert result["block_runs"] == {0: 2, 1: 2, 2: 2, 3: 2}
        assert _double_checkpointing(result["warnings"], "[0, 1, 2, 3]")
        assert result["wrapped_layers"] == [0, 1, 2, 3]


def _wrap_every_block(model, impl=CheckpointImpl.REENTRANT):
    block_class = type(model.model.layers[0])
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=impl),
        check_fn=lambda module: isinstance(module, block_class),
    )


def _train(model, batch, runs: BlockRunCounter) -> tuple[dict[int, int], dict[str, torch.Tensor]]:
    """One step; ``runs`` must be built on the model before any wrapping, so that blocks keep their identity."""
    model.train()
    model.zero_grad(set_to_none=True)
    runs.reset()
    with runs:
        model(**batch).loss.backward()
    grads = {clean_name(n): p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return dict(runs.counts), grads


def _counted(model) -> tuple:
    """``model`` and a run counter built before any wrapper goes in, so that blocks keep their identity."""
    return model, BlockRunCounter(model)


def test_without_the_guard_reentrant_wrappers_over_hf_ckpt_recompute_three_times():
    """What the guard prevents: the block runs in forward, in the wrapper's recompute and in hf_ckpt's."""
    model, runs = _counted(hf_ckpt.distributed.unguard(hf_ckpt.enable(tiny_llama())))
    _wrap_every_block(model)
    counts, _ = _train(model, batch_for(model), runs)
    assert counts == {0: 3, 1: 3, 2: 3, 3: 3}


def test_guard_keeps_the_wrapper_and_turns_hf_ckpt_off_on_those_blocks():
    reference, reference_runs = _counted(tiny_llama())
    batch = batch_for(reference)
    _, expected = _train(reference, batch, reference_runs)
    model, runs = _counted(hf_ckpt.enable(tiny_llama()))  # installs the guard
    _wrap_every_block(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        counts, grads = _train(model, batch, runs)
        _train(model, batch, runs)
    assert counts == {0: 2, 1: 2, 2: 2, 3: 2}
    assert max_grad_diff(expected, grads) <= 1e-5
    assert _double_checkpointing([str(w.message) for w in record], "[0, 1, 2, 3]")
    assert hf_ckpt.distributed.wrapped_layers(model) == [0, 1, 2, 3]
    assert hf_ckpt.checkpointed_layers(model) == [0, 1, 2, 3]


def test_disable_removes_the_guard_with_everything_else_enable_added():
    model = hf_ckpt.enable(tiny_llama())
    assert len(model._forward_pre_hooks) > 0
    hf_ckpt.disable(model)
    assert len(model._forward_pre_hooks) == 0


def test_disable_also_turns_off_the_wrappers_of_apply():
    model, runs = _counted(tiny_llama())
    hf_ckpt.distributed.apply(model, every_n_layers=2)
    hf_ckpt.disable(model)
    counts, _ = _train(model, batch_for(model), runs)
    assert counts == {0: 1, 1: 1, 2: 1, 3: 1}
    assert hf_ckpt.checkpointed_layers(model) == []


def test_enable_replaces_the_wrappers_of_apply():
    model, runs = _counted(tiny_llama())
    hf_ckpt.distributed.apply(model, every_n_layers=1)
    hf_ckpt.enable(model, layers=[3])
    counts, _ = _train(model, batch_for(model), runs)
    assert counts == {0: 1, 1: 1, 2: 1, 3: 2}
    assert hf_ckpt.distributed.wrapped_layers(model) == []
    assert hf_ckpt.checkpointed_layers(model) == [3]


def test_guard_names_accelerates_fsdp_plugin_when_it_is_the_source(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    monkeypatch.delitem(sys.modules, "accelerate.state", raising=False)
    model, runs = _counted(hf_ckpt.distributed.guard(hf_ckpt.enable(tiny_llama(), every_n_layers=2)))
    _wrap_every_block(model, CheckpointImpl.NO_REENTRANT)
    with pytest.warns(HfCkptWarning) as record:
        counts, _ = _train(model, batch_for(model), runs)
    assert counts == {0: 2, 1: 2, 2: 2, 3: 2}
    assert _double_checkpointing([str(w.message) for w in record], "[0, 2]", "accelerate's FSDP plugin")


def test_guard_installs_once_and_unguard_removes_it():
    model = tiny_llama()
    hf_ckpt.distributed.guard(model)
    hf_ckpt.distributed.guard(model)
    assert len(model._forward_pre_hooks) == 1
    hf_ckpt.distributed.unguard(model)
    assert len(model._forward_pre_hooks) == 0


# --- hf_ckpt.distributed.apply on one process ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODEL_BUILDERS))
@pytest.mark.parametrize(
    "options", [{"every_n_layers": 2}, {"layers": [1]}, {"every_n_layers": 1, "use_reentrant": True}]
)
def test_apply_recomputes_what_enable_recomputes(name, options):
    enabled, enabled_runs = _counted(hf_ckpt.enable(MODEL_BUILDERS[name](), **options))
    batch = batch_for(enabled)
    enable_counts, enable_grads = _train(enabled, batch, enabled_runs)
    applied, applied_runs = _counted(MODEL_BUILDERS[name]())
    hf_ckpt.distributed.apply(applied, **options)
    apply_counts, apply_grads = _train(applied, batch, applied_runs)
    assert apply_counts == enable_counts
    assert max_grad_diff(enable_grads, apply_grads) <= 1e-5
    assert hf_ckpt.distributed.wrapped_layers(applied) == hf_ckpt.checkpointed_layers(enabled)
    assert hf_ckpt.checkpointed_layers(applied) == hf_ckpt.checkpointed_layers(enabled)


_OUTSIDE_OR_PARTITION = {
    "outside_blocks": (("full", "full"), ("model.norm",)),
    "partition": (("partition:0.5", "partition:0.5"), ()),
}


@pytest.mark.parametrize("kind", sorted(_OUTSIDE_OR_PARTITION))
def test_apply_keeps_a_plans_outside_blocks_and_partitions_as_enable_does(kind):
    """A plan's ``outside_blocks`` and ``partition:`` blocks through ``distributed.apply``: the saved-tensor hook, the
    recomputed modules and the partitioned graphs go on as ``enable`` puts them, measured (memory kept and FLOPs of
    one step, blocks recomputed), with no fallback warning; the plan's memory differs from the plain full one."""
    from hf_ckpt.measure import measure_step
    from hf_ckpt.strategies.partition.graph import partition_unavailable

    if kind == "partition" and partition_unavailable() is not None:
        pytest.skip(str(partition_unavailable()))
    strategies, outside = _OUTSIDE_OR_PARTITION[kind]
    plan = hf_ckpt.CheckpointPlan(strategies, outside_blocks=outside)
    ids = torch.randint(1, 64, (2, 64), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids.clone()}
    enabled = measure_step(hf_ckpt.enable(tiny_llama(layers=2), plan=plan), batch)
    plain = measure_step(hf_ckpt.distributed.apply(tiny_llama(layers=2), every_n_layers=1), batch)
    model, runs = _counted(tiny_llama(layers=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "checkpointed in full instead of partitioned"
        hf_ckpt.distributed.apply(model, plan=plan)
        applied = measure_step(model, batch)
        counts, _ = _train(model, batch, runs)
    assert (applied.retained_bytes, applied.flops) == (enabled.retained_bytes, enabled.flops)
    assert applied.retained_bytes != plain.retained_bytes
    assert counts == {0: 2, 1: 2}
    assert hf_ckpt.checkpointed_layers(model) == [0, 1]
    hf_ckpt.disable(model)
    assert "forward" not in vars(model.model.norm)  # the recomputed modules' forwards taken back


def test_apply_again_replaces_the_selection_and_remove_passes_every_block_through():
    model, runs = _counted(tiny_llama())
    batch = batch_for(model)
    hf_ckpt.distributed.apply(model, every_n_layers=2)
    hf_ckpt.distributed.apply(model, layers=[3])
    counts, _ = _train(model, batch, runs)
    assert counts == {0: 1, 1: 1, 2: 1, 3: 2}
    assert hf_ckpt.distributed.wrapped_layers(model) == [3]
    hf_ckpt.distributed.remove(model)
    counts, _ = _train(model, batch, runs)
    assert counts == {0: 1, 1: 1, 2: 1, 3: 1}
    assert hf_ckpt.distributed.wrapped_layers(model) == []


def test_apply_replaces_checkpointing_set_by_enable():
    model, runs = _counted(hf_ckpt.enable(tiny_llama(), every_n_layers=1))
    hf_ckpt.distributed.apply(model, every_n_layers=2)
    counts, _ = _train(model, batch_for(model), runs)
    assert counts == {0: 2, 1: 1, 2: 2, 3: 1}
    assert hf_ckpt.distributed.wrapped_layers(model) == [0, 2]
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


def test_apply_keeps_state_dict_names_loadable_into_a_plain_model():
    plain = tiny_llama()
    model = hf_ckpt.distributed.apply(tiny_llama(), every_n_layers=2)
    assert model.state_dict().keys() == plain.state_dict().keys()
    plain.load_state_dict(model.state_dict())


def test_apply_checkpoints_only_in_training_and_generates_like_the_plain_model():
    plain = tiny_llama().eval()
    model, runs = _counted(tiny_llama())
    hf_ckpt.distributed.apply(model, every_n_layers=1).eval()
    batch = batch_for(model)
    with runs:
        model(**batch).loss.backward()  # eval mode, grad enabled: no checkpointing, as in transformers' layers
    assert dict(runs.counts) == {0: 1, 1: 1, 2: 1, 3: 1}
    ids = batch["input_ids"][:1, :4]
    assert torch.equal(
        model.generate(ids, max_new_tokens=3, do_sample=False), plain.generate(ids, max_new_tokens=3, do_sample=False)
    )


def test_apply_refuses_blocks_another_checkpointing_already_wraps():
    model = tiny_llama()
    _wrap_every_block(model)
    with pytest.raises(ValueError) as error:
        hf_ckpt.distributed.apply(model, every_n_layers=2)
    message = str(error.value)  # which blocks, whose wrapper, and the setting that turns it off
    for part in ("[0, 1, 2, 3]", "checkpoint_wrapper", "fsdp_activation_checkpointing: false"):
        assert part in message
    assert "_hf_ckpt_state" not in model.__dict__  # nothing of hf_ckpt's added
    assert hf_ckpt.checkpointed_layers(model) == [0, 1, 2, 3]  # the other wrappers left as they were


@pytest.mark.parametrize(
    "options",
    [{"every_n_layers": 0}, {"every_n_layers": "2"}, {"layers": [7]}, {"no_such_option": 1}],
)
def test_apply_rejects_bad_options_exactly_as_enable_does(options):
    with pytest.raises((TypeError, ValueError)) as from_enable:
        hf_ckpt.enable(tiny_llama(), **options)
    model = tiny_llama()
    with pytest.raises(from_enable.type) as from_apply:
        hf_ckpt.distributed.apply(model, **options)
    assert str(from_apply.value) == str(from_enable.value)
    assert hf_ckpt.distributed.wrapped_layers(model) == []


# --- the examples -------------------------------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
@requires("distributed.fsdp.fully_shard")
def test_fsdp_train_example_runs_under_torchrun_on_two_processes():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path (gloo); the same script takes nccl where CUDA is visible
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(EXAMPLES / "fsdp_train.py"), "--engine", "fsdp2", "--steps", "2",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "fsdp2 over gloo on cpu, 2 processes, method enable, every_n_layers=2" in lines
    assert "checkpointed blocks: [0, 2, 4]" in lines
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 2 and all(line.endswith("recomputed blocks (measured) [0, 2, 4]") for line in steps)


@pytest.mark.any_release
def test_accelerate_example_config_is_fsdp2_without_accelerates_own_checkpointing():
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    config = load_config_from_file(str(EXAMPLES / "accelerate_fsdp" / "fsdp_config.yaml"))
    assert config.distributed_type == DistributedType.FSDP
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert config.fsdp_config["fsdp_activation_checkpointing"] is False  # hf_ckpt checkpoints: never both


# --- the chunked head (head_chunk_size) under the engines -----------------------------------------------------------

HEAD_SCENARIOS = ["ddp:head-before", "ddp:head-wrapped", "fsdp2:head-before", "fsdp1:head-before", "fsdp1:head-wrapped"]


@pytest.fixture(scope="module")
def chunked_head_ranks(tmp_path_factory) -> list[dict]:
    """The ``head-*`` scenarios on two ranks (a launch of their own: ``-k head`` runs only these)."""
    runnable = [s for s in HEAD_SCENARIOS if has("distributed.fsdp.fully_shard") or not s.startswith("fsdp2")]
    return _launch(tmp_path_factory.mktemp("distributed-head"), runnable)


@pytest.mark.skipif(not HAS_LOSS_FUNCTION, reason="no PreTrainedModel.loss_function: the chunked head is refused")
@pytest.mark.parametrize("scenario", _scenarios(HEAD_SCENARIOS))
def test_chunked_head_loss_and_gradients_equal_single_process(chunked_head_ranks, single_process, scenario):
    """Each rank runs its 2 x 8 tokens' head and loss in chunks of 5 under the engine: the global loss and every
    gradient equal one process's unchunked step on the whole batch; the selection is recomputed as without it."""
    results = _ok(chunked_head_ranks, scenario)
    loss, grads = single_process
    assert results[0]["loss"] == pytest.approx(loss, abs=1e-5)
    assert results[1]["loss"] == pytest.approx(loss, abs=1e-5)
    assert max_grad_diff(grads, results[0]["grads"]) <= 1e-5
    for result in results:
        assert result["recomputed"] == EVERY_OTHER
        assert result["logits"] is None  # the head ran in chunks on this rank
