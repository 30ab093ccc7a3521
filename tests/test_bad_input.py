"""Bad input fails at the enable call, naming the argument and the accepted values."""

import re

import pytest
from transformers import PreTrainedModel

import hf_ckpt
from hf_ckpt.runtime.config import CheckpointConfig
from helpers import tiny_llama

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
    named = "every_n_layers.*positive int.*got " + re.escape(shown)  # the argument, what it takes, what it got
    with pytest.raises(error, match=named):
        hf_ckpt.enable(model, every_n_layers=value)
    with pytest.raises(error, match=named):
        hf_ckpt.GradientCheckpointingMixin.gradient_checkpointing_enable(model, every_n_layers=value)
    with pytest.raises(error, match=named):
        hf_ckpt.GradientCheckpointingMixin.gradient_checkpointing_enable(
            model, gradient_checkpointing_kwargs={"every_n_layers": value}
        )
    assert hf_ckpt.checkpointed_layers(model) == []


def test_offload_must_be_bool():
    with pytest.raises(TypeError, match=r"offload.*True or False.*'yes'.*\bstr\b"):
        hf_ckpt.enable(tiny_llama(), offload="yes")


def test_unknown_checkpoint_kwarg_names_the_key_and_the_accepted_ones():
    with pytest.raises(TypeError) as raised:
        hf_ckpt.enable(tiny_llama(), use_reentrnat=False)
    message = str(raised.value)
    assert "'use_reentrnat'" in message and "checkpoint_kwargs" in message  # the key, and where it came from
    accepted = ("use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug")  # torch's keys
    own = ("every_n_layers", "layers", "num_layers", "method", "strategy", "policy", "plan", "offload", "checkpoint_fn")
    assert all(name in message for name in accepted + own)


def test_unknown_key_in_the_trainer_style_dict():
    model = tiny_llama()
    with pytest.raises(TypeError, match=r"'every_n'.*gradient_checkpointing_kwargs"):  # the key, and the dict it was in
        hf_ckpt.GradientCheckpointingMixin.gradient_checkpointing_enable(model, gradient_checkpointing_kwargs={"every_n": 2})


def test_use_reentrant_must_be_bool():
    with pytest.raises(TypeError, match=r"use_reentrant.*True or False.*'no'.*\bstr\b"):
        hf_ckpt.enable(tiny_llama(), use_reentrant="no")


@pytest.mark.any_release
def test_conflicting_values_given_both_ways():
    with pytest.raises(ValueError) as raised:
        CheckpointConfig.from_arguments({"every_n_layers": 3}, every_n_layers=2)
    for part in ("every_n_layers=2", "gradient_checkpointing_kwargs['every_n_layers']=3"):  # both values, both places
        assert part in str(raised.value)
    with pytest.raises(ValueError, match=re.escape("offload was given twice")):
        CheckpointConfig.from_arguments({"offload": True}, offload=False)
    # the same value twice is fine, and the caller's dict is left untouched
    user_dict = {"every_n_layers": 2, "use_reentrant": True}
    config = CheckpointConfig.from_arguments(user_dict, every_n_layers=2)
    assert (config.every_n_layers, dict(config.checkpoint_kwargs)) == (2, {"use_reentrant": True})
    assert user_dict == {"every_n_layers": 2, "use_reentrant": True}


@pytest.mark.any_release
def test_kwargs_dict_must_be_a_dict():
    with pytest.raises(TypeError, match=r"gradient_checkpointing_kwargs.*dict.*\blist\b"):
        CheckpointConfig.from_arguments([("use_reentrant", False)])


def test_model_that_does_not_support_checkpointing():
    model = tiny_llama()
    model.supports_gradient_checkpointing = False
    with pytest.raises(ValueError, match=r"LlamaForCausalLM.*supports_gradient_checkpointing = False"):
        hf_ckpt.enable(model)
    assert hf_ckpt.checkpointed_layers(model) == []


def test_not_a_transformers_model():
    import torch

    with pytest.raises(TypeError, match=r"\bmodel\b.*PreTrainedModel.*\bLinear\b"):  # argument, expected, got
        hf_ckpt.enable(torch.nn.Linear(2, 2))


def test_model_without_any_flag():
    from helpers import LegacyFuncModel, tiny_legacy

    class NoFlagModel(LegacyFuncModel):
        _set_gradient_checkpointing = PreTrainedModel._set_gradient_checkpointing

        def __init__(self, config):
            super().__init__(config)
            del self.gradient_checkpointing

    # one block: no list of repeated blocks either (with several, hf_ckpt gives the model the flag: test_direct_blocks)
    model = tiny_legacy(NoFlagModel, layers=1)
    with pytest.raises(ValueError, match=r"NoFlagModel.*`gradient_checkpointing` attribute, and it has no list of "
                                         r"repeated blocks"):  # the class, what it lacks
        hf_ckpt.enable(model)
    assert "_hf_ckpt_state" not in model.__dict__ and "gradient_checkpointing" not in model.__dict__


def test_the_arguments_are_parsed_once_into_one_request_that_names_only_what_was_given():
    """``EnableRequest``: the budget taken out of the dict and parsed, the mixin's None arguments absent (not given),
    ``strategy="full"`` kept as given, and a bad combination raised at construction, naming the argument."""
    from hf_ckpt.runtime.request import EnableRequest

    request = EnableRequest.parse({"budget": "50%", "use_reentrant": True}, "gradient_checkpointing_kwargs",
                                  every_n_layers=None, offload=None)
    assert (request.options, request.budget, request.keep_outputs) == ({}, 0.5, False)
    assert request.kwargs_dict == {"use_reentrant": True} and request.config.use_reentrant
    assert EnableRequest.parse(None, "checkpoint_kwargs", strategy="full").options == {"strategy": "full"}
    assert EnableRequest(budget=" Auto ").budget == "auto"
    with pytest.raises(ValueError, match="^budget makes the plan itself: give it without layers$"):
        EnableRequest(options={"layers": [0]}, budget=0.5)
