"""One rank of the two-process runs of ``test_distributed.py`` (DDP, FSDP2 and FSDP1 over gloo, on CPU).

Run as ``python _distributed_worker.py RANK WORLD_SIZE INIT_FILE OUT_DIR SCENARIO[,SCENARIO...]``. The ranks meet
through a file store (no port to pick), run every scenario in order and write ``OUT_DIR/rank{RANK}.pt``: for each
scenario the global loss, the full gradients (rank 0), the blocks recomputed (``BlockRunCounter``), the
all-gathers issued (``CommDebugMode``), the activation memory retained after forward on this rank
(``hf_ckpt.measure.StorageTracker``), the hf_ckpt warnings and the error, if any. The test compares them with a
single-process run; this module only measures.

A scenario is ``ENGINE:METHOD``: the engine (``ddp``, ``fsdp2``, ``fsdp1``) and how checkpointing is set up:
``none``; ``enable-before`` / ``enable-after`` (on the module inside the engine) / ``enable-wrapped`` (on the engine's
wrapper) / ``enable-layers``; ``apply-before`` / ``apply-after`` / ``apply-layers`` (``hf_ckpt.distributed.apply``);
``double`` / ``double-unguarded`` (``hf_ckpt.enable``, with or without an explicit guard, then the engine wraps every
block in a reentrant ``checkpoint_wrapper``); ``reentrant-unused`` / ``reentrant-static`` (reentrant checkpointing
under DDP with ``find_unused_parameters=True``, without or with ``static_graph``); ``head-before`` / ``head-wrapped``
(``every_n_layers=2`` with the head and loss in checkpointed chunks, ``head_chunk_size``, enabled on the model
before the engine wraps it or on the engine's wrapper).
"""

from __future__ import annotations

import sys
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hf_ckpt  # noqa: E402
import hf_ckpt.distributed  # noqa: E402
from hf_ckpt.runtime.util.warn import HfCkptWarning  # noqa: E402
from hf_ckpt.runtime.counting import BlockRunCounter  # noqa: E402
from hf_ckpt.measure import StorageTracker  # noqa: E402
from helpers import tiny_llama  # noqa: E402

GLOBAL_BATCH = 4
SEQ = 8
VOCAB = 64
#: The selection every checkpointed scenario uses, unless its name says otherwise.
SELECTION = {"every_n_layers": 2}
LAYERS_SELECTION = {"layers": [1, 2]}
#: ``head_chunk_size`` of the ``head-*`` scenarios: 5 does not divide a rank's 2 x 8 tokens (the last chunk is short).
HEAD_CHUNK = 5
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "module.")


def global_batch() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(1, VOCAB, (GLOBAL_BATCH, SEQ), generator=generator)


def local_batch(rank: int, world_size: int) -> torch.Tensor:
    per_rank = GLOBAL_BATCH // world_size
    return global_batch()[rank * per_rank : (rank + 1) * per_rank]


def clean_name(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules to shard one by one: the blocks, or the checkpoint wrappers around them."""
    return list(model.model.layers)


def _fully_shard(model: nn.Module) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in _decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)


def _fsdp1(model: nn.Module, block_class: type) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy({block_class}),
        use_orig_params=True,
        device_id=torch.device("cpu"),
    )


def _foreign_checkpoint_wrappers(model: nn.Module, reentrant: bool) -> None:
    """What accelerate's FSDP plugin does with ``activation_checkpointing=True``: wrap every block."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    block_class = _block_class_of(model)
    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=impl),
        check_fn=lambda module: isinstance(module, block_class),
    )


def _block_class_of(model: nn.Module) -> type:
    from hf_ckpt.runtime.blocks import find_blocks

    return type(find_blocks(model)[0].module)


def build(scenario: str, model: nn.Module) -> nn.Module:
    """Apply the engine and the checkpointing ``scenario`` names; return the module to call."""
    engine, method = scenario.split(":")
    block_class = _block_class_of(model)
    if method == "enable-before":
        hf_ckpt.enable(model, **SELECTION)
    elif method == "head-before":
        hf_ckpt.enable(model, head_chunk_size=HEAD_CHUNK, **SELECTION)
    elif method == "enable-layers":
        hf_ckpt.enable(model, **LAYERS_SELECTION)
    elif method in ("apply-before", "apply-layers"):
        hf_ckpt.distributed.apply(model, **(LAYERS_SELECTION if method == "apply-layers" else SELECTION))
    elif method == "double":
        hf_ckpt.distributed.guard(hf_ckpt.enable(model))
    elif method == "double-unguarded":
        hf_ckpt.enable(model)
    elif method in ("reentrant-unused", "reentrant-static"):
        hf_ckpt.distributed.guard(hf_ckpt.enable(model, use_reentrant=True, **SELECTION))

    if engine == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(
            model,
            find_unused_parameters=method.startswith("reentrant"),
            static_graph=method == "reentrant-static",
        )
        inner = wrapped.module
    elif engine == "fsdp2":
        _fully_shard(model)
        wrapped = inner = model
    elif engine == "fsdp1":
        wrapped = _fsdp1(model, block_class)
        inner = wrapped.module
    else:
        raise ValueError(f"unknown engine {engine!r}")

    if method == "enable-after":
        hf_ckpt.enable(inner, **SELECTION)
    elif method == "head-wrapped":
        hf_ckpt.enable(wrapped, head_chunk_size=HEAD_CHUNK, **SELECTION)
    elif method == "enable-wrapped":
        hf_ckpt.enable(wrapped, **SELECTION)
    elif method == "apply-after":
        hf_ckpt.distributed.apply(wrapped, **SELECTION)
    elif method.startswith("double"):
        _foreign_checkpoint_wrappers(inner, reentrant=True)
    return wrapped


def full_gradients(engine: str, wrapped: nn.Module, model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded gradient of every parameter, by its name in the plain model (a collective under FSDP)."""
    if engine == "fsdp2":
        return {clean_name(n): p.grad.full_tensor() for n, p in model.named_parameters()}
    if engine == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(wrapped, with_grads=True):
            return {clean_name(n): p.grad.detach().clone() for n, p in wrapped.named_parameters()}
    return {clean_name(n): p.grad.detach().clone() for n, p in model.named_parameters()}


class _NoModuleTracker:
    """Stands in for ``CommDebugMode``'s per-module tracker, of which only the collective counts are read here:
    torch 2.13's tracker pops its module stack once per name a module was entered under, so a module called from
    several parents (transformers 5.25's kernelized rotary embedding, one module shared by every attention layer)
    empties the stack ("IndexError: list index out of range")."""

    name, is_bw, activation_checkpointing = "Global", False, False
    module_parents_dict = {"Global": set()}

    def __enter__(self) -> "_NoModuleTracker":
        return self

    def __exit__(self, *args: object) -> None:
        return None


def run(scenario: str, rank: int, world_size: int) -> dict:
    from torch.distributed.tensor.debug import CommDebugMode

    model = tiny_llama()
    model.train()
    runs = BlockRunCounter(model)  # built on the plain model: the blocks keep their indices under any wrapper
    result: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", HfCkptWarning)
        try:
            wrapped = build(scenario, model)
            ids = local_batch(rank, world_size)
            comm = CommDebugMode()
            comm.advanced_module_tracker = _NoModuleTracker()  # only the counts are read
            with runs, comm, StorageTracker() as tracker:
                output = wrapped(input_ids=ids, labels=ids)
                loss = output.loss
                result["logits"] = None if output.get("logits") is None else tuple(output.logits.shape)
                result["retained_bytes"] = tracker.live_bytes().get("cpu", 0)
                loss.backward()
        except Exception as error:  # recorded for the test to assert on; both ranks fail alike
            result["error"] = (type(error).__name__, str(error))
            result["traceback"] = traceback.format_exc()
        result["warnings"] = [str(w.message) for w in caught if issubclass(w.category, HfCkptWarning)]
    if "error" in result:
        return result
    global_loss = loss.detach().clone()
    dist.all_reduce(global_loss)
    result["loss"] = global_loss.item() / world_size
    engine = scenario.split(":")[0]
    grads = full_gradients(engine, wrapped, model)
    if rank == 0:
        result["grads"] = grads
    result["recomputed"] = runs.recomputed()
    result["block_runs"] = dict(runs.counts)
    result["allgathers"] = sum(count for op, count in comm.get_comm_counts().items() if "allgather" in str(op))
    plain = wrapped.module if engine in ("ddp", "fsdp1") else wrapped
    result["checkpointed_layers"] = hf_ckpt.checkpointed_layers(plain)
    result["wrapped_layers"] = hf_ckpt.distributed.wrapped_layers(plain)
    return result


def main() -> None:
    rank, world_size, init_file, out_dir, scenarios = sys.argv[1:6]
    rank, world_size = int(rank), int(world_size)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    results = {}
    try:
        for scenario in scenarios.split(","):
            results[scenario] = run(scenario, rank, world_size)
            dist.barrier()
    finally:
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
