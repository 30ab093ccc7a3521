"""One rank of the DeepSpeed runs of ``test_deepspeed.py`` (``DS_ACCELERATOR=cpu``, gloo, 1 or 2 processes).

Run as ``python _deepspeed_worker.py RANK WORLD_SIZE INIT_FILE OUT_DIR SCENARIO[,SCENARIO...]``. The ranks meet
through a file store, run every scenario in order and write ``OUT_DIR/rank{RANK}.pt``: for each scenario the loss
of this rank's batch, the full gradients (``deepspeed.utils.safe_get_full_grad``) after one backward, the blocks
recomputed (``BlockRunCounter``), the all-gathers issued in the backward, the hf_ckpt warnings and the error, if
any. The test compares the scenarios; this module only measures.

A scenario is ``STAGE:METHOD[:OPTION]``: the ZeRO stage (0-3) and how checkpointing is set up: ``none``;
``enable-before`` (``hf_ckpt.enable`` on the model, then ``deepspeed.initialize``); ``enable-engine`` (on the
engine, and ``hf_ckpt.verify`` on the engine at stage 2, then ``hf_ckpt.disable``); ``apply-engine`` (``hf_ckpt.distributed.apply`` on the engine); ``ds-checkpoint``
(``checkpoint_fn=deepspeed.checkpointing.checkpoint``); ``ds-nonreentrant``
(``checkpoint_fn=deepspeed.checkpointing.non_reentrant_checkpoint``); ``ds-cpu`` (DeepSpeed's own
``checkpoint_in_cpu``); ``config-block`` (the config carries an ``"activation_checkpointing"`` block, checkpointing
via ``hf_ckpt.enable``); ``trainer`` (the stock ``Trainer``, patched, with ``TrainingArguments(deepspeed=...,
use_cpu=True)``, a config with that block and ``gradient_checkpointing_kwargs={"every_n_layers": 2}``);
``trainer-off`` (the same with ``gradient_checkpointing=False``: the block alone). ``OPTION``: ``reuse0`` sets ``stage3_max_reuse_distance`` (and the prefetch bucket) to 0; ``step2`` takes one
optimizer step first and measures the second step; ``mlp`` adds ``mlp_chunk_size=3`` to ``enable-before``; several
join with ``+``.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import hf_ckpt  # noqa: E402
import hf_ckpt.distributed  # noqa: E402
from hf_ckpt.runtime.util.warn import HfCkptWarning  # noqa: E402
from hf_ckpt.runtime.counting import BlockRunCounter  # noqa: E402
from helpers import tiny_llama  # noqa: E402

MICRO_BATCH = 2
SEQ = 8
VOCAB = 64
SELECTION = {"every_n_layers": 2}
CONFIG_BLOCK = {"partition_activations": True, "contiguous_memory_optimization": False, "cpu_checkpointing": True}


def batch(rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(10 + rank)
    return torch.randint(1, VOCAB, (MICRO_BATCH, SEQ), generator=generator)


def ds_config(stage: int, world_size: int, options: set, block: bool) -> dict:
    zero: dict = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # every parameter is partitioned and gathered for real
        if "reuse0" in options:
            zero["stage3_max_reuse_distance"] = 0
            zero["stage3_prefetch_bucket_size"] = 0
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "train_batch_size": MICRO_BATCH * world_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if block:
        config["activation_checkpointing"] = dict(CONFIG_BLOCK)
    return config


class _AllGatherCounter:
    """Counts all-gathers issued through ``deepspeed.comm`` (what ZeRO-3 uses to fetch parameters)."""

    NAMES = ("all_gather_into_tensor", "all_gather", "allgather_fn", "all_gather_coalesced")

    def __init__(self) -> None:
        self.count = 0
        self._saved: dict = {}

    def __enter__(self):
        from deepspeed import comm

        self._module = comm
        for name in self.NAMES:
            original = getattr(comm, name, None)
            if original is None:
                continue
            self._saved[name] = original

            def counted(*args, _original=original, **kwargs):
                self.count += 1
                return _original(*args, **kwargs)

            setattr(self._module, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(self._module, name, original)


def run_trainer(stage: int, world_size: int, rank: int, out_dir: str, checkpointing: bool = True) -> dict:
    """The stock ``Trainer`` with ``TrainingArguments(deepspeed=config, use_cpu=True)``, patched, one step;
    ``checkpointing`` False: ``gradient_checkpointing=False``, the config's block alone."""
    from transformers import Trainer, TrainingArguments

    hf_ckpt.patch_transformers()
    torch.manual_seed(0)
    model = tiny_llama()
    inputs = torch.cat([batch(r) for r in range(world_size)])
    dataset = [{"input_ids": row, "labels": row} for row in inputs]
    config = ds_config(stage, world_size, set(), block=True)
    config["train_micro_batch_size_per_gpu"] = config["train_batch_size"] = "auto"
    args = TrainingArguments(
        output_dir=out_dir, deepspeed=config, use_cpu=True, max_steps=1, per_device_train_batch_size=MICRO_BATCH,
        learning_rate=0.0, report_to=[], save_strategy="no", logging_strategy="no",
        gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs={"every_n_layers": 2} if checkpointing else None,
        max_grad_norm=0.0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    with BlockRunCounter(model) as runs:
        trainer.train()
    result = {"recomputed": runs.recomputed(), "checkpointed_layers": hf_ckpt.checkpointed_layers(model)}
    hf_ckpt.unpatch_transformers()
    return result


def run(scenario: str, rank: int, world_size: int) -> dict:
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    parts = scenario.split(":")
    stage, method, options = int(parts[0]), parts[1], set(parts[2].split("+") if len(parts) > 2 else ())
    if method in ("trainer", "trainer-off"):
        return run_trainer(stage, world_size, rank, os.environ["HF_CKPT_WORKER_OUT"], method == "trainer")
    torch.manual_seed(0)
    model = tiny_llama()
    model.train()
    config = ds_config(stage, world_size, options, block=method == "config-block")
    if method in ("enable-before", "config-block"):
        hf_ckpt.enable(model, **SELECTION, **({"mlp_chunk_size": 3} if "mlp" in options else {}))  # 3: 16 tokens uneven
    elif method in ("ds-checkpoint", "ds-nonreentrant", "ds-cpu", "ds-config"):
        if method == "ds-config":  # DeepSpeed's checkpoint, configured from the config's own block
            deepspeed.checkpointing.configure(None, deepspeed_config=ds_config(stage, world_size, options, block=True))
        else:
            deepspeed.checkpointing.configure(
                None, partition_activations=method == "ds-cpu", checkpoint_in_cpu=method == "ds-cpu"
            )
        from deepspeed.runtime.activation_checkpointing import checkpointing as ds_checkpointing

        result_config = {"partition": ds_checkpointing.PARTITION_ACTIVATIONS, "cpu": ds_checkpointing.CPU_CHECKPOINT}
        function = (
            deepspeed.checkpointing.non_reentrant_checkpoint
            if method == "ds-nonreentrant"
            else deepspeed.checkpointing.checkpoint
        )
        hf_ckpt.enable(model, checkpoint_fn=function, **SELECTION)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    result: dict = {"ds_checkpointing": locals().get("result_config")}
    if "step2" in options:  # measure the second step: ZeRO-3 traced the first one and now prefetches and reuses
        inputs = batch(rank)
        engine.backward(engine(input_ids=inputs, labels=inputs).loss)
        engine.step()
    if method == "enable-engine":
        hf_ckpt.enable(engine, **SELECTION)
        result["checkpointed_layers"] = hf_ckpt.checkpointed_layers(engine)
        if stage == 2:  # verify runs its own two steps (at stage 0 DeepSpeed refuses a direct loss.backward())
            inputs = batch(rank)
            try:
                report = hf_ckpt.verify(engine, {"input_ids": inputs, "labels": inputs})
                result["verify"] = {"recomputed": report.recomputed, "gradients_ok": report.gradients_ok}
            except Exception as error:
                result["verify"] = f"{type(error).__name__}: {error}"
    elif method == "apply-engine":
        hf_ckpt.distributed.apply(engine, **SELECTION)
        hf_ckpt.distributed.guard(engine)
        result["checkpointed_layers"] = hf_ckpt.checkpointed_layers(engine)
    if method == "config-block":
        from hf_ckpt.integrations.deepspeed import warn_ignored_config

        result["ignored_keys"] = warn_ignored_config(engine, owner=engine)
    inputs = batch(rank)
    with BlockRunCounter(engine.module) as runs:
        loss = engine(input_ids=inputs, labels=inputs).loss
        with _AllGatherCounter() as gathers:
            engine.backward(loss)
    result["loss"] = loss.detach().clone()
    result["recomputed"] = runs.recomputed()
    result["backward_all_gathers"] = gathers.count
    grads = {}
    for name, parameter in engine.module.named_parameters():
        grad = safe_get_full_grad(parameter)
        grads[name.replace("_checkpoint_wrapped_module.", "")] = None if grad is None else grad.detach().clone()
    result["grads"] = grads
    if method == "enable-engine":
        hf_ckpt.disable(engine)
        result["after_disable"] = hf_ckpt.checkpointed_layers(engine)
    engine.destroy() if hasattr(engine, "destroy") else None
    return result


def main() -> None:
    rank, world_size, init_file, out_dir, scenarios = sys.argv[1:6]
    rank, world_size = int(rank), int(world_size)
    os.environ["HF_CKPT_WORKER_OUT"] = out_dir
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size, timeout=timedelta(seconds=300)
    )
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for scenario in scenarios.split(","):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", HfCkptWarning)
            try:
                results[scenario] = run(scenario, rank, world_size)
            except Exception as error:  # measured: the test asserts which scenarios fail and how
                results[scenario] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        results[scenario]["warnings"] = [str(w.message) for w in caught if issubclass(w.category, HfCkptWarning)]
        dist.barrier()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
