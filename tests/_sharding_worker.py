"""One rank of ``test_sharding_measured.py``: a tiny Llama under FSDP2 ``fully_shard`` (gloo, CPU), one AdamW step,
and the bytes this rank holds.

Run as ``python _sharding_worker.py RANK WORLD_SIZE INIT_FILE OUT_DIR [PARAM_DTYPE]``; writes
``OUT_DIR/rank{RANK}.json``. With ``PARAM_DTYPE`` (``bfloat16``) every unit is sharded with FSDP2's mixed precision,
``MixedPrecisionPolicy(param_dtype=...)``, over float32 parameters.

What is measured, on this rank, as distinct tensor storages (``untyped_storage().nbytes()``, each storage once):

* ``parameters``: the local tensors of the sharded parameters (``DTensor.to_local()``), after the step;
* ``gradients``: the local tensors of the gradients (FSDP2 keeps each unit's reduce-scatter output, padded);
* ``optimizer``: every tensor in ``optimizer.state`` (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``);
* ``retained``: what the step holds when forward returns (``hf_ckpt.measure.StorageTracker.current_bytes``:
  storages created during forward, alive, at their size now: FSDP2 frees a block's unsharded parameters after its
  forward by resizing their storage to 0), which under FSDP2 is the activations plus the root unit's parameters,
  which ``fully_shard`` leaves unsharded after the root's forward;
* ``peak``: the tracker's peak over forward and backward, an upper bound (it counts storages at the size they were
  created with, so it misses FSDP2's frees by resizing).

Storages are what an allocator hands out: the figure that ``torch.cuda.memory_allocated`` would count on a GPU,
without its rounding. The process's RSS would also count the Python heap, gloo's buffers and torch's code.
"""

from __future__ import annotations

import gc

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hf_ckpt.measure import StorageTracker  # noqa: E402

BATCH = 2  # per rank
SEQ = 16


def tiny_config():
    """Odd row counts (vocabulary 67, intermediate 45), so that FSDP2's dim-0 padding shows."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=67, hidden_size=32, intermediate_size=45, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer: torch.optim.Optimizer):
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def run(rank: int, param_dtype: str | None = None) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config()).train()
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, param_dtype) if param_dtype else None)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids = torch.randint(1, 67, (BATCH, SEQ), generator=torch.Generator().manual_seed(rank))
    with StorageTracker() as tracker:
        loss = model(input_ids=ids, labels=ids).loss
        gc.collect()  # what only the collector frees (a cycle around a unit's gathered buffer) is not retained
        retained = tracker.current_bytes().get("cpu", 0)
        loss.backward()
    peak = tracker.peak_bytes().get("cpu", 0)
    optimizer.step()
    return {
        "parameters": storage_bytes(model.parameters()),
        "gradients": storage_bytes(p.grad for p in model.parameters()),
        "optimizer": storage_bytes(optimizer_tensors(optimizer)),
        "retained": retained,
        "peak": peak,
    }


def main() -> None:
    rank, world_size, init_file, out_dir = sys.argv[1:5]
    param_dtype = sys.argv[5] if len(sys.argv) > 5 else None
    rank, world_size = int(rank), int(world_size)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        result = run(rank, param_dtype)
    finally:
        dist.destroy_process_group()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
