"""LoRA fine-tuning with PEFT and the stock ``Trainer``, recomputing every other block.

Runs on a CPU in seconds: a tiny Llama with random weights, LoRA adapters on the attention projections, a tiny
in-memory dataset, 4 steps. Before training, ``hf_ckpt.verify`` checks on one batch that checkpointing leaves the
adapters' gradients exact; after training, the script prints which blocks were recomputed (measured) and that
the adapters (and only they) were updated.

    pip install 'hf_ckpt[peft]'
    python examples/lora_finetune.py
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile

try:
    from peft import LoraConfig, get_peft_model
except ImportError:
    sys.exit("examples/lora_finetune.py needs peft: pip install 'hf_ckpt[peft]'")

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
    """``gradient_checkpointing=True`` and its kwargs, under the names the installed release uses
    (``activation_checkpointing*`` from transformers 5.23 on)."""
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    prefix = "activation" if "activation_checkpointing" in fields else "gradient"
    return {f"{prefix}_checkpointing": True, f"{prefix}_checkpointing_kwargs": kwargs}


def main() -> None:
    hf_ckpt.patch_transformers()

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(LlamaForCausalLM(config), lora)
    model.print_trainable_parameters()
    dataset = RandomTokens()

    # use_reentrant=True is the hard case for adapters: hf_ckpt makes the hidden states require grad so that
    # the LoRA weights inside recomputed blocks still get gradients.
    checkpoint_kwargs = {"every_n_layers": 2, "use_reentrant": True}

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
            **checkpointing_arguments(checkpoint_kwargs),
        )
        trainer = Trainer(model=model, args=args, train_dataset=dataset)

        # The Trainer enables checkpointing when training starts; enable the same setting now to verify it first.
        hf_ckpt.enable(model, **checkpoint_kwargs)
        batch = {"input_ids": dataset.ids[:4], "labels": dataset.ids[:4]}
        report = hf_ckpt.verify(model, batch)
        print(report)
        if not report.ok:
            raise SystemExit("checkpointing changed the gradients: not training")

        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        with BlockRunCounter(model) as runs:
            trainer.train()

    steps = trainer.state.global_step
    changed = [name for name, p in model.named_parameters() if not torch.equal(before[name], p.detach())]
    print(f"trained {steps} steps")
    print("checkpointed blocks (flags):  ", hf_ckpt.checkpointed_layers(model))
    print("recomputed blocks (measured): ", runs.recomputed(forward_passes=steps))
    print(f"updated tensors: {len(changed)}, all LoRA: {all('lora_' in name for name in changed)}")


if __name__ == "__main__":
    main()
