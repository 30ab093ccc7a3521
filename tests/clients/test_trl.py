"""TRL 1.16's trainers on a tiny Llama and a tiny in-memory dataset, with ``hf_ckpt.patch_transformers()``.

Runs in the clients environment (``python ci/clients.py``); skipped where TRL is not installed.

Measured: which blocks the backward recomputes (``BlockRunCounter``), which checkpoint function TRL's selective
option leaves bound, and that a step under that checkpointing has the gradients of one without it.
"""

from __future__ import annotations

import functools

import pytest
import torch

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import hf_ckpt  # noqa: E402
from hf_ckpt.runtime.counting import BlockRunCounter  # noqa: E402
from helpers import max_grad_diff, train_step  # noqa: E402

from _tiny_text import COMMON, sentences, tiny_llama_with_tokenizer  # noqa: E402





def _train_counting(trainer, model) -> BlockRunCounter:
    with BlockRunCounter(model) as runs:
        trainer.train()
    return runs


def _context_fn(block) -> object | None:
    function = block._gradient_checkpointing_func
    return function.keywords.get("context_fn") if isinstance(function, functools.partial) else None


def _is_trl_selective(context_fn) -> bool:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return isinstance(context_fn, functools.partial) and context_fn.func is create_selective_checkpoint_contexts


def _sft(tmp_path, kwargs, enabled=None):
    model, tokenizer = tiny_llama_with_tokenizer()
    if enabled is not None:  # hf_ckpt enabled before the trainer is built; TRL's own checkpointing left off
        hf_ckpt.enable(model, **enabled)
    config = trl.SFTConfig(
        output_dir=str(tmp_path), gradient_checkpointing=enabled is None, gradient_checkpointing_kwargs=kwargs,
        max_length=16, **COMMON,
    )
    dataset = datasets.Dataset.from_dict({"text": sentences()})
    trainer = trl.SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    return trainer, model


def _grads_match_unchecked(model, batch) -> float:
    """Gradients of one step as the trainer left the model, against the same model with checkpointing off."""
    checkpointed = train_step(model, batch)
    hf_ckpt.disable(model)
    return max_grad_diff(train_step(model, batch), checkpointed)


def _batch(trainer) -> dict[str, torch.Tensor]:
    batch = next(iter(trainer.get_train_dataloader()))
    return {key: batch[key] for key in ("input_ids", "attention_mask", "labels") if key in batch}


@pytest.mark.parametrize(
    "kwargs, expected",
    [({"selective": True}, [0, 1, 2, 3]), ({"every_n_layers": 2, "selective": True}, [0, 2])],
    ids=["selective", "every_n_layers=2+selective"],
)
def test_sft_selective_option_recomputes_trl_way_on_the_selected_blocks(patched, tmp_path, kwargs, expected):
    trainer, model = _sft(tmp_path, dict(kwargs))
    runs = _train_counting(trainer, model)
    assert runs.recomputed() == expected
    assert hf_ckpt.checkpointed_layers(model) == expected
    for index, layer in enumerate(model.model.layers):
        assert layer.gradient_checkpointing is (index in expected)
        if index in expected:  # TRL's policy (save attention, recompute the rest) on every selected block
            assert _is_trl_selective(_context_fn(layer))
    assert _grads_match_unchecked(model, _batch(trainer)) == 0.0


def test_sft_every_n_layers_without_selective(patched, tmp_path):
    trainer, model = _sft(tmp_path, {"every_n_layers": 2})
    assert _train_counting(trainer, model).recomputed() == [0, 2]
    assert _context_fn(model.model.layers[0]) is None
    assert _grads_match_unchecked(model, _batch(trainer)) == 0.0


def test_sft_selective_with_reentrant_is_refused_by_trl(patched, tmp_path):
    with pytest.raises(ValueError, match="use_reentrant"):
        _sft(tmp_path, {"every_n_layers": 2, "selective": True, "use_reentrant": True})


def _preference_dataset():
    texts = sentences(8)
    return datasets.Dataset.from_dict(
        {"prompt": texts, "chosen": [" yes good"] * 8, "rejected": [" no bad"] * 8}
    )


def test_dpo_every_n_layers(patched, tmp_path):
    model, tokenizer = tiny_llama_with_tokenizer()
    config = trl.DPOConfig(
        output_dir=str(tmp_path), gradient_checkpointing=True, gradient_checkpointing_kwargs={"every_n_layers": 2},
        max_length=24, **COMMON,
    )
    reference, _ = tiny_llama_with_tokenizer()  # given: TRL would load the reference from model.config._name_or_path
    trainer = trl.DPOTrainer(
        model=model, ref_model=reference, args=config, train_dataset=_preference_dataset(), processing_class=tokenizer
    )
    runs = _train_counting(trainer, model)
    # DPO runs the policy forward once per step (chosen and rejected concatenated), the reference model separately.
    assert runs.recomputed() == [0, 2]
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


def test_grpo_every_n_layers(patched, tmp_path):
    model, tokenizer = tiny_llama_with_tokenizer()
    config = trl.GRPOConfig(
        output_dir=str(tmp_path), gradient_checkpointing=True, gradient_checkpointing_kwargs={"every_n_layers": 2},
        num_generations=2, max_completion_length=4, generation_batch_size=2, beta=0.0, **COMMON,
    )
    dataset = datasets.Dataset.from_dict({"prompt": sentences(8)})

    def reward(completions, **_):
        return [float(len(c)) for c in completions]

    trainer = trl.GRPOTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, reward_funcs=reward
    )
    runs = _train_counting(trainer, model)
    counts = [runs.counts[i] for i in range(4)]
    # Generation and the no-grad log-prob passes run every block alike; only the backward reruns blocks 0 and 2.
    assert counts[1] == counts[3] and counts[0] == counts[2]
    assert counts[0] > counts[1], counts
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


#: What TRL's trainers get with ``head_chunk_size`` (hf_ckpt.runtime.head: TRL's fused LM head replaces the forward).
HEAD_REFUSED = (
    "head_chunk_size cannot apply to LlamaForCausalLM: TRL's trainers (SFTTrainer, DPOTrainer, GRPOTrainer) replace "
    "its forward with their fused LM head, which computes the per-token log-probabilities in chunks without the full "
    "logits, as head_chunk_size would: TRL's fused head already saves that memory. Drop head_chunk_size.")


def _dpo(tmp_path, kwargs, enabled=None):
    model, tokenizer = tiny_llama_with_tokenizer()
    if enabled is not None:
        hf_ckpt.enable(model, **enabled)
    config = trl.DPOConfig(output_dir=str(tmp_path), gradient_checkpointing=enabled is None,
                           gradient_checkpointing_kwargs=kwargs, max_length=24, **COMMON)
    reference, _ = tiny_llama_with_tokenizer()
    trainer = trl.DPOTrainer(model=model, ref_model=reference, args=config, train_dataset=_preference_dataset(),
                             processing_class=tokenizer)
    return trainer, model


def _grpo(tmp_path, kwargs, enabled=None):
    model, tokenizer = tiny_llama_with_tokenizer()
    if enabled is not None:
        hf_ckpt.enable(model, **enabled)
    config = trl.GRPOConfig(output_dir=str(tmp_path), gradient_checkpointing=enabled is None,
                            gradient_checkpointing_kwargs=kwargs, num_generations=2, max_completion_length=4,
                            generation_batch_size=2, beta=0.0, **COMMON)
    dataset = datasets.Dataset.from_dict({"prompt": sentences(8)})
    trainer = trl.GRPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                              reward_funcs=lambda completions, **_: [float(len(c)) for c in completions])
    return trainer, model


@pytest.mark.parametrize("build", [_sft, _dpo, _grpo], ids=["sft", "dpo", "grpo"])
def test_head_chunk_size_is_refused_by_name_under_trls_fused_head(patched, tmp_path, build):
    """TRL 1.16 puts its own fused LM head on the model's forward: the chunked head is refused with one line that
    names it, TRL and what to do, when the trainer is built or at the latest when training starts; nothing else
    (TypeError deep in TRL, a silent full head)."""
    with pytest.raises(ValueError) as raised:
        trainer, model = build(tmp_path, {"head_chunk_size": 16})
        trainer.train()
    assert str(raised.value) == HEAD_REFUSED


@pytest.mark.parametrize("build", [_sft, _dpo], ids=["sft", "dpo"])
def test_head_chunk_size_enabled_before_the_trainer_is_refused_at_the_first_step(tmp_path, build):
    """Enabled first, the trainer built after (without the patch, TRL's own gradient checkpointing off): the first
    training forward refuses it, with the same line."""
    trainer, model = build(tmp_path, None, enabled={"head_chunk_size": 16})
    with pytest.raises(ValueError) as raised:
        trainer.train()
    assert str(raised.value) == HEAD_REFUSED


def test_sft_with_a_block_setting_enabled_before_the_trainer(tmp_path):
    trainer, model = _sft(tmp_path, None, enabled={"every_n_layers": 2})
    assert _train_counting(trainer, model).recomputed() == [0, 2]
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


def test_grpo_turning_checkpointing_off_and_on_around_generation_is_named(tmp_path):
    """Without the patch, GRPO turns checkpointing off and on again around generation with upstream's methods (TRL's
    ``disable_gradient_checkpointing``), which replaces hf_ckpt's setting: one warning names what changed, and
    ``checkpointed_layers`` reports what runs (upstream's, every block), never the setting that is gone. With the
    patch (test_grpo_every_n_layers) the setting survives."""
    trainer, model = _grpo(tmp_path, None, enabled={"every_n_layers": 2})
    with pytest.warns(hf_ckpt.HfCkptWarning, match=r"^hf_ckpt's setting on LlamaForCausalLM \(every_n_layers=2, "
                      r"use_reentrant=False\) was changed outside hf_ckpt \(LlamaModel\._gradient_checkpointing_func"):
        trainer.train()
    assert hf_ckpt.checkpointed_layers(model) == [0, 1, 2, 3]
