"""TRL 1.16's SFTTrainer (and DPOTrainer) with ``gradient_checkpointing_kwargs={"budget": ...}`` after
``hf_ckpt.patch_transformers()``: the plan is made from the first real batch's shapes, saved in ``output_dir``,
logged once, and it is what backward recomputes.

Runs in the clients environment (``python ci/clients.py``); skipped where TRL is not installed.
"""

from __future__ import annotations

import logging

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import hf_ckpt  # noqa: E402
from hf_ckpt.budget import record as _record  # noqa: E402
from hf_ckpt.runtime.state import get_state  # noqa: E402
from hf_ckpt.runtime.counting import BlockRunCounter  # noqa: E402
from helpers import max_grad_diff, train_step  # noqa: E402

from _tiny_text import COMMON, sentences, tiny_llama_with_tokenizer  # noqa: E402




@pytest.fixture
def budget_log(caplog):
    caplog.set_level(logging.INFO, logger="hf_ckpt")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "hf_ckpt" and r.levelno == logging.INFO]



def _planned(model) -> list[int]:
    return [i for i, s in enumerate(get_state(model).budget.plan.strategies) if s != "none"]


def test_sft_budget_plans_the_first_batch(patched, tmp_path, budget_log):
    model, tokenizer = tiny_llama_with_tokenizer()
    config = trl.SFTConfig(
        output_dir=str(tmp_path), gradient_checkpointing=True, gradient_checkpointing_kwargs={"budget": "50%"},
        max_length=16, **COMMON,
    )
    dataset = datasets.Dataset.from_dict({"text": sentences()})
    trainer = trl.SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    with BlockRunCounter(model) as runs:
        trainer.train()
    expected = _planned(model)
    assert expected and runs.recomputed_in_backward() == expected
    assert hf_ckpt.checkpointed_layers(model) == expected
    saved = hf_ckpt.CheckpointPlan.load(tmp_path / _record.PLAN_FILE)
    assert list(saved.strategies) == list(get_state(model).budget.plan.strategies)
    messages = budget_log()
    # SFTConfig's bf16=True over float32 weights: accelerate's autocast wraps the outer forward, so the inner
    # LlamaModel finds it and plans again, once
    assert len(messages) == 2, messages
    assert messages[0].startswith("budget 50% for LlamaForCausalLM at batch 2 x seq "), messages
    assert messages[1].startswith("re-planned (bfloat16 autocast is on in LlamaModel's forward) budget 50% for "
                                  "LlamaForCausalLM at batch 2 x seq "), messages
    assert "(float32 with bfloat16 autocast on cpu)" in messages[1]

    batch = next(iter(trainer.get_train_dataloader()))
    batch = {key: batch[key] for key in ("input_ids", "attention_mask", "labels") if key in batch}
    checkpointed = train_step(model, batch)
    hf_ckpt.disable(model)
    assert max_grad_diff(train_step(model, batch), checkpointed) <= 1e-5


def test_dpo_budget_plans_once_though_trl_re_enables(patched, tmp_path, budget_log):
    model, tokenizer = tiny_llama_with_tokenizer()
    config = trl.DPOConfig(
        output_dir=str(tmp_path), gradient_checkpointing=True, gradient_checkpointing_kwargs={"budget": 0.5},
        max_length=24, **dict(COMMON, max_steps=2),
    )
    reference, _ = tiny_llama_with_tokenizer()
    texts = sentences(8)
    dataset = datasets.Dataset.from_dict({"prompt": texts, "chosen": [" yes good"] * 8, "rejected": [" no bad"] * 8})
    trainer = trl.DPOTrainer(model=model, ref_model=reference, args=config, train_dataset=dataset,
                             processing_class=tokenizer)
    with BlockRunCounter(model) as runs:
        trainer.train()
    expected = _planned(model)
    assert expected and runs.recomputed_in_backward() == expected
    assert hf_ckpt.checkpointed_layers(model) == expected
    assert (tmp_path / _record.PLAN_FILE).is_file()
    messages = budget_log()
    # the first batch under bf16=True: planned, then again with the autocast found inside; TRL's re-enable (with
    # the options left out that the Trainer's enable gave as defaults) is the same request: its plan holds
    assert len(messages) == 2, messages
    assert "(float32 on cpu)" in messages[0]
    assert messages[1].startswith("re-planned (bfloat16 autocast is on in LlamaModel's forward) budget 50% for "
                                  "LlamaForCausalLM at batch 4 x seq 10 (float32 with bfloat16 autocast on cpu): "
                                  "plan "), messages
