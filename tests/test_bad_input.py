"""Bad input fails at the enable call, naming the argument and the accepted values."""

import re

import pytest
from transformers import PreTrainedModel

import hf_ckpt
from hf_ckpt.config import CheckpointConfig
from helpers import tiny_llama

EVERY_N = "every_n_layers must be a positive int (1 checkpoints every block, 2 every other block, ...); got "


@pytest.mark.parametrize(
    "value, error, shown",
    [
        (0, ValueError, "0"),
        (-2, ValueError, "-2"),
        (True, TypeError, "True of type bool"),
        (2.0, TypeError, "2.0 of type float"),
        ("2", TypeError, "'2' of type str"),
    ],
)
def test_every_n_layers(value, error, shown):
    model = tiny_llama()
    with pytest.raises(error, match=re.escape(EVERY_N + shown)):
        hf_ckpt.enable(model, every_n_layers=value)
    with pytest.raises(error, match=re.escape(EVERY_N + shown)):
        hf_ckpt.GradientCheckpointingMixin.gradient_checkpointing_enable(model, every_n_layers=value)
    with pytest.raises(error, match=re.escape(EVERY_N + shown)):
        hf_ckpt.GradientCheckpointingMixin.gradient_checkpointing_enable(
            model, gradient_checkpointing_kwargs={"every_n_layers": value}
        )
    assert hf_ckpt.checkpointed_layers(model) == []


def test_offload_must_be_bool():
    with pytest.raises(TypeError, match=re.escape("offload must be True or False; got 'yes' of type str")):
        hf_ckpt.enable(tiny_llama(), offload="yes")


def test_unknown_checkpoint_kwarg_names_the_key_and_the_accepted_ones():
    with pytest.raises(TypeError) as raised:
        hf_ckpt.enable(tiny_llama(), use_reentrnat=False)
    message = str(raised.value)
    assert message.startswith("Unknown checkpoint keyword argument 'use_reentrnat' in checkpoint_kwargs. ")
    for accepted in ("use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug"):
        assert accepted in message
    assert message.endswith(
        "hf_ckpt itself accepts: every_n_layers, layers, num_layers, method, strategy, policy, plan, offload, checkpoint_fn."
    )


def test_unknown_key_in_the_trainer_style_dict():
    model = tiny_llama()
    with pytest.raises(TypeError, match=re.escape("Unknown checkpoint keyword argument 'every_n' in gradient_checkpointing_kwargs.")):
        hf_ckpt.GradientCheckpointingMixin.gradient_checkpointing_enable(model, gradient_checkpointing_kwargs={"every_n": 2})


def test_use_reentrant_must_be_bool():
    with pytest.raises(TypeError, match=re.escape("use_reentrant must be True or False; got 'no' of type str")):
        hf_ckpt.enable(tiny_llama(), use_reentrant="no")


def test_conflicting_values_given_both_ways():
    message = (
        "every_n_layers was given twice with different values: every_n_layers=2 and "
        "gradient_checkpointing_kwargs['every_n_layers']=3. Give it once."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        CheckpointConfig.from_arguments({"every_n_layers": 3}, every_n_layers=2)
    with pytest.raises(ValueError, match=re.escape("offload was given twice")):
        CheckpointConfig.from_arguments({"offload": True}, offload=False)
    # the same value twice is fine, and the caller's dict is left untouched
    user_dict = {"every_n_layers": 2, "use_reentrant": True}
    config = CheckpointConfig.from_arguments(user_dict, every_n_layers=2)
    assert (config.every_n_layers, dict(config.checkpoint_kwargs)) == (2, {"use_reentrant": True})
    assert user_dict == {"every_n_layers": 2, "use_reentrant": True}


def test_kwargs_dict_must_be_a_dict():
    with pytest.raises(TypeError, match=re.escape("gradient_checkpointing_kwargs must be a dict or None; got list")):
        CheckpointConfig.from_arguments([("use_reentrant", False)])


def test_model_that_does_not_support_checkpointing():
    model = tiny_llama()
    model.supports_gradient_checkpointing = False
    message = (
        "LlamaForCausalLM does not support activation checkpointing: the class sets "
        "supports_gradient_checkpointing = False."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        hf_ckpt.enable(model)


def test_not_a_transformers_model():
    import torch

    with pytest.raises(TypeError, match=r"^model must be a transformers PreTrainedModel.*; got Linear$"):
        hf_ckpt.enable(torch.nn.Linear(2, 2))


def test_model_without_any_flag():
    from helpers import LegacyFuncModel, tiny_legacy

    class NoFlagModel(LegacyFuncModel):
        _set_gradient_checkpointing = PreTrainedModel._set_gradient_checkpointing

        def __init__(self, config):
            super().__init__(config)
            del self.gradient_checkpointing

    model = tiny_legacy(NoFlagModel)
    message = "NoFlagModel is not compatible with activation checkpointing: none of its modules has a `gradient_checkpointing` attribute."
    with pytest.raises(ValueError, match=re.escape(message)):
        hf_ckpt.enable(model)
    assert "_hf_ckpt_state" not in model.__dict__
