"""One rank of ``test_deepspeed_sharding.py``: a tiny Llama under DeepSpeed ZeRO-2 or ZeRO-3 (``DS_ACCELERATOR=cpu``,
gloo), DeepSpeed's defaults, ``torch.optim.AdamW`` as the client optimizer, one step; the bytes this rank holds.

Run as ``python _deepspeed_sharding_worker.py RANK WORLD_SIZE INIT_FILE OUT_DIR STAGE``; writes
``OUT_DIR/rank{RANK}-zero{STAGE}.json``.

Measured as distinct tensor storages (``untyped_storage().nbytes()``, each storage once: what an allocator hands
out), read from the tensors the engine keeps:

* ``parameters``: ZeRO-2: the model's parameters (views into the flat ``bit16_groups_flat`` buffers); ZeRO-3:
  the flat partitions (``fp16_partitioned_groups_flat``) and the parameters kept whole (``ds_persist``);
* ``gradients``: after backward, ZeRO-2's ``grads_in_partition`` and ``averaged_gradients`` (the gradients of the
  parameters overlapping this rank's partition, whole), ZeRO-3's ``grad_partitions_flat_buffer``;
* ``optimizer``: after the step, the fp32 master partitions (``single_partition_of_fp32_groups`` /
  ``fp32_partitioned_groups_flat``, not counted twice where they are the parameters) and every tensor in the
  client optimizer's ``state``;
* ``buffers``: the gradient buckets (``ipg_buckets``) after backward, and ``buffers_in_backward`` while the first
  block's backward runs;
* ``retained``: storages created during forward and alive when it returns
  (``hf_ckpt.measure.StorageTracker.current_bytes``).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from hf_ckpt.measure import StorageTracker  # noqa: E402

BATCH = 2
SEQ = 16


def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=67, hidden_size=32, intermediate_size=45, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def ds_config(stage: int, world_size: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "train_batch_size": BATCH * world_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


def storages(tensors) -> dict[int, int]:
    seen: dict[int, int] = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            if storage.nbytes():
                seen[storage.data_ptr()] = storage.nbytes()
    return seen


def _flat(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _flat(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flat(item)


def held(zero, model, stage: int) -> dict[str, dict[int, int]]:
    """Storages per category, read from the ZeRO optimizer ``zero`` and the model."""
    if stage == 3:
        params = storages(_flat(zero.fp16_partitioned_groups_flat))
        params.update(storages(p.data for p in model.parameters() if getattr(p, "ds_persist", False)))
        grads = storages([zero.grad_partitions_flat_buffer])
        master = storages(_flat(zero.fp32_partitioned_groups_flat))
    else:
        params = storages(p.data for p in model.parameters())
        grads = storages(_flat([zero.grads_in_partition, getattr(zero, "averaged_gradients", None)]))
        master = storages(_flat(zero.single_partition_of_fp32_groups))
    state = storages(_flat(list(zero.optimizer.state.values())))
    optimizer = {k: v for k, v in {**master, **state}.items() if k not in params}
    buffers = storages(_flat([bucket.buffer for bucket in zero.ipg_buckets.values()]))
    return {"parameters": params, "gradients": grads, "optimizer": optimizer, "buffers": buffers}


def run(rank: int, world_size: int, stage: int) -> dict:
    import deepspeed
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config()).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(stage, world_size))
    ids = torch.randint(1, 67, (BATCH, SEQ), generator=torch.Generator().manual_seed(rank))
    during: list[int] = []  # the buckets while backward runs (ZeRO-1/2 release theirs at its end)
    engine.module.model.layers[0].register_full_backward_hook(
        lambda *_: during.append(sum(held(engine.optimizer, engine.module, stage)["buffers"].values())))
    with StorageTracker() as tracker:
        loss = engine(input_ids=ids, labels=ids).loss
        retained = tracker.current_bytes().get("cpu", 0)
        engine.backward(loss)
    after_backward = held(engine.optimizer, engine.module, stage)
    engine.step()
    after_step = held(engine.optimizer, engine.module, stage)
    return {
        "parameters": sum(after_step["parameters"].values()),
        "gradients": sum(after_backward["gradients"].values()),
        "optimizer": sum(after_step["optimizer"].values()),
        "buffers": sum(after_backward["buffers"].values()),
        "buffers_in_backward": max(during, default=0),
        "retained": retained,
    }


def main() -> None:
    rank, world_size, init_file, out_dir, stage = sys.argv[1:6]
    rank, world_size, stage = int(rank), int(world_size), int(stage)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    try:
        result = run(rank, world_size, stage)
    finally:
        dist.destroy_process_group()
    (Path(out_dir) / f"rank{rank}-zero{stage}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
