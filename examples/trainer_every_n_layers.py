"""The stock ``transformers.Trainer`` recomputing every other block, after ``hf_ckpt.patch_transformers()``.

Runs on a CPU in seconds: a tiny Llama with random weights, a tiny in-memory dataset, 4 training steps. It prints
the blocks the flags say are recomputed and the blocks that were measured to be recomputed during training.

    python examples/trainer_every_n_layers.py
"""

from __future__ import annotations

import dataclasses
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import hf_ckpt
from hf_ckpt.runtime.counting import BlockRunCounter

STEPS = 4


class RandomTokens(torch.utils.data.Dataset):
    """A few sequences of random token ids; each one is its own label (causal LM)."""

    def __init__(self, size: int = 16, seq: int = 32, vocab: int = 128) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (size, seq), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def checkpointing_arguments(kwargs: dict) -> dict:
    """``gradient_checkpointing=True`` and its kwargs, under the names the installed release uses.

    transformers >= 5.23 renamed them ``activation_checkpointing*`` (the old names still work, with a
    FutureWarning); older releases only know ``gradient_checkpointing*``.
    """
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    prefix = "activation" if "activation_checkpointing" in fields else "gradient"
    return {f"{prefix}_checkpointing": True, f"{prefix}_checkpointing_kwargs": kwargs}


def main() -> None:
    hf_ckpt.patch_transformers()  # the stock Trainer now understands every_n_layers on every release

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config)

    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir=output_dir,
            max_steps=STEPS,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            **checkpointing_arguments({"every_n_layers": 2}),
        )
        trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())
        with BlockRunCounter(model) as runs:
            trainer.train()

    steps = trainer.state.global_step
    losses = [float(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    print(f"trained {steps} steps; loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print("checkpointed blocks (flags):        ", hf_ckpt.checkpointed_layers(model))
    print("recomputed blocks (measured):       ", runs.recomputed(forward_passes=steps))
    print("runs per block over the whole run:  ", [runs.counts[block.index] for block in runs.blocks])


if __name__ == "__main__":
    main()
