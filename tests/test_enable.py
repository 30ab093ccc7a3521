"""Gradient parity and the exact set of recomputed blocks, measured, for the four reference architectures."""

import functools
import warnings

import pytest
import torch.utils.checkpoint

import hf_ckpt
from hf_ckpt import HfCkptWarning
from hf_ckpt.runtime.functions import checkpoint_selected_blocks
from helpers import MODEL_BUILDERS, batch_for, max_grad_diff, recomputed_in_step, tiny_legacy, train_step

# name -> number of blocks in global order (T5: 2 encoder + 2 decoder)
BLOCKS = {"llama": 4, "gpt2": 4, "bert": 4, "t5": 4}


def _mixin_model(name):
    builder = MODEL_BUILDERS[name]
    base_cls = type(builder())
    cls = type(f"Ckpt{base_cls.__name__}", (hf_ckpt.GradientCheckpointingMixin, base_cls), {})
    return builder(cls=cls)


def _enable_with_mixin(model, every_n_layers):
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable(every_n_layers=every_n_layers)


@pytest.mark.parametrize("name", sorted(MODEL_BUILDERS))
@pytest.mark.parametrize("every_n_layers", [1, 2, 3])
@pytest.mark.parametrize("entry", ["enable", "mixin"])
def test_parity_and_recomputed_blocks(name, every_n_layers, entry):
    model = _mixin_model(name) if entry == "mixin" else MODEL_BUILDERS[name]()
    batch = batch_for(model)
    reference = train_step(model, batch)
    if entry == "mixin":
        _enable_with_mixin(model, every_n_layers)
    else:
        hf_ckpt.enable(model, every_n_layers=every_n_layers)

    expected = list(range(0, BLOCKS[name], every_n_layers))
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == expected
    assert hf_ckpt.checkpointed_layers(model) == expected
    assert max_grad_diff(reference, grads) <= 1e-5


def test_t5_counts_encoder_then_decoder():
    model = MODEL_BUILDERS["t5"](layers=3)
    hf_ckpt.enable(model, every_n_layers=2)
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    # encoder blocks are 0..2, decoder blocks 3..5: every other one across the boundary
    assert recomputed == [0, 2, 4]


def test_without_enable_nothing_is_recomputed():
    model = MODEL_BUILDERS["llama"]()
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == []
    assert hf_ckpt.checkpointed_layers(model) == []


@pytest.mark.parametrize("name", sorted(MODEL_BUILDERS))
def test_a_checkpoint_partial_is_bound_per_flagged_module(name):
    model = MODEL_BUILDERS[name]()
    hf_ckpt.enable(model, every_n_layers=2, preserve_rng_state=True)
    flagged = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    assert flagged
    in_blocks = {id(m) for b in hf_ckpt.runtime.blocks.find_blocks(model) for m in b.module.modules()}
    for module in flagged:
        bound = module._gradient_checkpointing_func
        assert isinstance(bound, functools.partial)
        if id(module) not in in_blocks:  # a stack: the selecting wrapper in front of the same partial
            assert bound.func is checkpoint_selected_blocks
            bound = bound.args[0]
        assert bound.func is torch.utils.checkpoint.checkpoint
        assert bound.keywords == {"use_reentrant": False, "preserve_rng_state": True}


def test_use_reentrant_is_always_passed_explicitly(monkeypatch):
    seen = []
    original = torch.utils.checkpoint.checkpoint

    def spy(function, *args, **kwargs):
        seen.append(kwargs.get("use_reentrant", "missing"))
        return original(function, *args, **kwargs)

    monkeypatch.setattr("hf_ckpt.runtime.functions.checkpoint", spy)
    model = MODEL_BUILDERS["llama"]()
    hf_ckpt.enable(model)
    train_step(model, batch_for(model))
    assert seen == [False] * 4


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_reentrant_parity(use_reentrant):
    model = MODEL_BUILDERS["gpt2"]()
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, every_n_layers=2, use_reentrant=use_reentrant)
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert max_grad_diff(reference, grads) <= 1e-5


def test_enable_again_replaces_the_setting():
    model = MODEL_BUILDERS["llama"]()
    hf_ckpt.enable(model, every_n_layers=2)
    hf_ckpt.enable(model, every_n_layers=3)
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == [0, 3]


def test_enable_returns_the_model_and_accepts_eval_mode():
    model = MODEL_BUILDERS["llama"]().eval()
    assert hf_ckpt.enable(model) is model
    assert hf_ckpt.checkpointed_layers(model) == [0, 1, 2, 3]


# block flags; stacks that call one function; a model that tests only ``self.training`` (as older releases' code
# does: on transformers >= 5 the first two also test grad mode themselves)
@pytest.mark.parametrize("name", ["llama", "t5", "legacy"])
def test_a_no_grad_forward_in_training_mode_checkpoints_nothing(name):
    """Under ``torch.no_grad`` the model runs as without checkpointing, even in training mode (evaluation loops
    inside a training run): no checkpoint call, and the setting is back for the next training step."""
    calls: list = []

    def counting_checkpoint(function, *args, **kwargs):
        calls.append(function)
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)

    model = tiny_legacy() if name == "legacy" else MODEL_BUILDERS[name]()
    batch = batch_for(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HfCkptWarning)  # the legacy model's deprecated-signature warning
        hf_ckpt.enable(model, checkpoint_fn=counting_checkpoint)
    model.train()
    with torch.no_grad():
        model(**batch)
    assert calls == []
    assert recomputed_in_step(model, batch)[0] == hf_ckpt.checkpointed_layers(model) != []
    assert calls  # the counter does see checkpointed forwards
