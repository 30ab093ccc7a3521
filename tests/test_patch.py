"""``patch_transformers``: opt-in, idempotent, reversible; the stock Trainer honours the kwargs dict."""

import warnings

import pytest
import torch
from transformers import PreTrainedModel, Trainer, TrainingArguments

import hf_ckpt
from hf_ckpt.runtime.counting import BlockRunCounter
from helpers import VOCAB, batch_for, max_grad_diff, recomputed_in_step, tiny_gpt2, tiny_llama, train_step

_NAMES = [
    n
    for n in ("gradient_checkpointing_enable", "gradient_checkpointing_disable",
              "activation_checkpointing_enable", "activation_checkpointing_disable")
    if n in PreTrainedModel.__dict__
]


def test_patch_is_idempotent_and_reversible():
    originals = {n: PreTrainedModel.__dict__[n] for n in _NAMES}
    hf_ckpt.patch_transformers()
    patched = {n: PreTrainedModel.__dict__[n] for n in _NAMES}
    hf_ckpt.patch_transformers()
    assert {n: PreTrainedModel.__dict__[n] for n in _NAMES} == patched
    assert all(patched[n] is not originals[n] for n in _NAMES)
    assert hf_ckpt.is_patched()
    hf_ckpt.unpatch_transformers()
    hf_ckpt.unpatch_transformers()
    assert all(PreTrainedModel.__dict__[n] is originals[n] for n in _NAMES)
    assert not hf_ckpt.is_patched()


def _stock_enable(model, **kwargs_dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs_dict)


@pytest.mark.parametrize("builder", [tiny_llama, tiny_gpt2])
def test_stock_models_accept_every_n_layers_in_the_dict(builder):
    hf_ckpt.patch_transformers()
    model = builder()
    batch = batch_for(model)
    reference = train_step(model, batch)
    _stock_enable(model, every_n_layers=2, use_reentrant=False)
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert max_grad_diff(reference, grads) <= 1e-5


def test_patched_enable_validates_at_the_call():
    hf_ckpt.patch_transformers()
    with pytest.raises(ValueError, match="every_n_layers must be a positive int"):
        _stock_enable(tiny_llama(), every_n_layers=0)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=8):
        generator = torch.Generator().manual_seed(0)
        self.rows = torch.randint(1, VOCAB, (n, 8), generator=generator)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _training_args(tmp_path, **kwargs):
    options = dict(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3,
        report_to=[], save_strategy="no", logging_steps=1, use_cpu=True, dataloader_num_workers=0,
    )
    options.update(kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return TrainingArguments(**options)


# `activation_checkpointing` exists from 5.23, where `gradient_checkpointing` stays as a deprecated alias
_TRAINER_KEYS = [k for k in ("gradient_checkpointing", "activation_checkpointing") if k in TrainingArguments.__dataclass_fields__]


@pytest.mark.parametrize("key", _TRAINER_KEYS)
def test_stock_trainer_with_the_kwargs_dict(tmp_path, key):
    hf_ckpt.patch_transformers()
    model = tiny_llama()
    args = _training_args(tmp_path, **{key: True, f"{key}_kwargs": {"every_n_layers": 2, "use_reentrant": False}})
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens())
    with BlockRunCounter(model) as runs:
        result = trainer.train()
    assert result.global_step == 2
    # each of the 2 steps runs every block once forward, and blocks 0 and 2 once more in backward
    assert dict(runs.counts) == {0: 4, 1: 2, 2: 4, 3: 2}
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


_DS_BLOCK = {"activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": True,
                                          "contiguous_memory_optimization": False, "number_checkpoints": "auto"}}


def _train_begin(model, ds_config):
    """What the patched Trainer's DeepSpeedConfigCallback does at on_train_begin, on args holding ``ds_config``
    as TrainingArguments(deepspeed=...) does (the real Trainer under DeepSpeed: tests/clients/test_deepspeed.py)."""
    from types import SimpleNamespace

    from transformers import trainer

    from hf_ckpt.integrations.trainer import DeepSpeedConfigCallback

    assert DeepSpeedConfigCallback in trainer.DEFAULT_CALLBACKS  # the patch added it
    args = SimpleNamespace(hf_deepspeed_config=SimpleNamespace(config=ds_config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DeepSpeedConfigCallback().on_train_begin(args, None, None, model=model)
    return [str(w.message) for w in caught if '"activation_checkpointing" block' in str(w.message)]


def test_deepspeed_block_with_checkpointing_off_is_warned_once_at_train_begin():
    from transformers import trainer

    from hf_ckpt.integrations.trainer import DeepSpeedConfigCallback

    hf_ckpt.patch_transformers()
    try:
        model = tiny_llama()
        warned = _train_begin(model, _DS_BLOCK)
        assert len(warned) == 1
        assert "sets partition_activations, cpu_checkpointing, but activation checkpointing is off" in warned[0]
        assert "gradient_checkpointing=True" in warned[0] and "cpu_checkpointing: offload=True" in warned[0]
        assert _train_begin(model, _DS_BLOCK) == []  # once per model
        assert _train_begin(tiny_llama(), {"activation_checkpointing": {"partition_activations": False}}) == []
        assert _train_begin(tiny_llama(), {"zero_optimization": {"stage": 3}}) == []
        on = tiny_llama()
        _stock_enable(on, every_n_layers=2)  # checkpointing on: warned where it is enabled, not here
        assert _train_begin(on, _DS_BLOCK) == []
        budgeted = tiny_llama()
        hf_ckpt.enable(budgeted, budget=0.5)  # a budget waiting for its first batch is checkpointing on
        assert _train_begin(budgeted, _DS_BLOCK) == []
    finally:
        hf_ckpt.unpatch_transformers()
    assert DeepSpeedConfigCallback not in trainer.DEFAULT_CALLBACKS
