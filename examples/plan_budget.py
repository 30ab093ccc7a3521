"""Plan and apply an activation-memory budget: the least recompute that fits, per block.

    python examples/plan_budget.py

Builds a small Llama from its config (random weights, no download), asks hf_ckpt for the cheapest plan that keeps
50% of the activation memory of training without checkpointing, saves it as JSON (what a training script loads),
applies it, and measures the step to show the plan holds. Runs on a CPU in a few seconds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_ckpt
from hf_ckpt.measure import measure_step

torch.manual_seed(0)
model = LlamaForCausalLM(
    LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2,
    )
)
ids = torch.randint(0, 256, (2, 64))
batch = {"input_ids": ids, "labels": ids}

plan = hf_ckpt.plan(model, batch, budget=0.5)  # 50% of the no-checkpointing activation memory
print(plan)

path = Path(tempfile.mkdtemp()) / "plan.json"
plan.save(path)  # in a training script: hf_ckpt.enable(model, plan="plan.json")

baseline = measure_step(model, batch)
hf_ckpt.enable(model, plan=str(path))
measured = measure_step(model, batch)

print(f"blocks checkpointed: {hf_ckpt.checkpointed_layers(model)}")
print(f"recomputed blocks (measured): {measured.recomputed_blocks}")
print(f"retained: {measured.retained_bytes / 2**20:.2f} MiB of {baseline.retained_bytes / 2**20:.2f} MiB "
      f"({measured.retained_bytes / baseline.retained_bytes:.1%}), budget {plan.budget_bytes / 2**20:.2f} MiB")
print(f"within budget: {measured.retained_bytes <= plan.budget_bytes}")
print(f"predicted {plan.predicted_bytes / 2**20:.2f} MiB, measured {measured.retained_bytes / 2**20:.2f} MiB")
print(f"extra FLOPs: {measured.flops - baseline.flops} (predicted {plan.predicted_recompute_flops})")
