"""``use_cache=True`` is turned off in training steps: one warning per model when the caller asked for it, none for
the config's default."""

import logging
import warnings

import pytest
import torch

import hf_ckpt
from hf_ckpt import HfCkptWarning
from helpers import batch_for, tiny_llama, tiny_t5


def _use_cache_warnings(record):
    return [w for w in record if issubclass(w.category, HfCkptWarning) and "use_cache" in str(w.message)]


@pytest.mark.parametrize("builder", [tiny_llama, tiny_t5])
@pytest.mark.parametrize("explicit", [True, False])
def test_one_warning_per_model_and_no_cache_built(builder, explicit, caplog):
    model = builder()
    model.config.use_cache = True
    hf_ckpt.enable(model, every_n_layers=2)
    model.train()
    batch = batch_for(model)
    if explicit:
        batch["use_cache"] = True
    with warnings.catch_warnings(record=True) as record, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        for _ in range(3):
            output = model(**batch)
            output.loss.backward()
            assert output.past_key_values is None
    messages = [str(w.message) for w in _use_cache_warnings(record)]
    assert len(messages) == (1 if explicit else 0)
    if explicit:
        assert messages[0].startswith("use_cache=True cannot take effect in a training step")
        assert f"use_cache=False to {type(model).__name__}" in messages[0]
    # upstream's own per-layer "use_cache=True is incompatible" logging never fires: the cache is off before it
    assert not [r for r in caplog.records if "use_cache" in r.getMessage()]

    second = builder()
    hf_ckpt.enable(second)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        second.train()(**batch_for(second), use_cache=True)
    assert len(_use_cache_warnings(record)) == 1  # once per model, not once per process


def test_eval_and_no_grad_keep_the_cache():
    model = tiny_llama()
    model.config.use_cache = True
    hf_ckpt.enable(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.no_grad():  # hf_ckpt leaves no-grad passes alone (whether the stack keeps the cache is upstream's call)
            model.train()(**batch_for(model))
        assert model.eval()(**batch_for(model)).past_key_values is not None
    assert not _use_cache_warnings(record)


def test_disable_removes_the_use_cache_hooks():
    model = tiny_llama()
    model.config.use_cache = True
    hf_ckpt.enable(model)
    hf_ckpt.disable(model)
    with torch.enable_grad():
        assert model.train()(**batch_for(model)).past_key_values is not None
