"""hf_ckpt under ``accelerate launch`` with an FSDP config: checkpointing set up before ``accelerator.prepare``.

    accelerate launch --config_file examples/accelerate_fsdp/fsdp_config.yaml examples/accelerate_fsdp/train.py

A tiny Llama with random weights trains a few steps on random tokens. The main process prints how accelerate
distributed the model, the blocks selected, and per step the loss and the blocks measured as recomputed.

On accelerators this is FSDP (``distributed_type: DistributedType.FSDP``). On a machine without one, accelerate
does not use FSDP, and says nothing about it: the command above starts two processes that each train alone on all
the data (both print ``distributed_type: DistributedType.NO, 1 processes, model: LlamaForCausalLM``); in CPU mode
(``ACCELERATE_USE_CPU=true`` under ``torchrun``) it wraps the model in DDP instead. docs/guides/distributed.md
("accelerate") shows where in accelerate's source, and what to run on CPUs (``examples/fsdp_train.py``).

Needs accelerate (``pip install accelerate``).
"""

from __future__ import annotations

import sys

try:
    from accelerate import Accelerator
except ImportError:
    sys.exit("examples/accelerate_fsdp/train.py needs accelerate: pip install accelerate")

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_ckpt
from hf_ckpt.runtime.counting import BlockRunCounter

STEPS = 3
VOCAB = 128


def main() -> None:
    accelerator = Accelerator()
    torch.manual_seed(0)  # the same initial weights in every process
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    ))
    runs = BlockRunCounter(model)  # before prepare: block indices stay those of the plain model

    hf_ckpt.enable(model, every_n_layers=2)  # before prepare: FSDP units then enclose the checkpointed blocks
    hf_ckpt.distributed.guard(model)  # if fsdp_activation_checkpointing were true, keep one checkpoint per block
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)

    accelerator.print(f"distributed_type: {accelerator.distributed_type}, {accelerator.num_processes} processes, "
                      f"model: {type(model).__name__}")
    accelerator.print("checkpointed blocks:", hf_ckpt.checkpointed_layers(accelerator.unwrap_model(model)))
    generator = torch.Generator().manual_seed(1)
    model.train()
    for step in range(STEPS):
        ids = torch.randint(0, VOCAB, (accelerator.num_processes, 2, 64), generator=generator)
        ids = ids[accelerator.process_index].to(accelerator.device)
        runs.reset()
        with runs:
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        loss = accelerator.reduce(loss.detach(), reduction="mean")
        accelerator.print(f"step {step}: loss {loss.item():.4f}, recomputed blocks (measured) {runs.recomputed()}")
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
