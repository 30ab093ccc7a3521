"""``hf_ckpt.verify`` and ``hf-ckpt verify``: the report is right in both directions.

Every check is shown to pass on a correct setup and to fail on the fault it exists to catch: checkpointing silently
off (a monkeypatched layer ``forward``), dropout not replayed (``preserve_rng_state=False``), a checkpointed block's
input modified in place, a recompute that breaks ``torch.utils.checkpoint``'s metadata check. And verifying leaves
the model exactly as it was.
"""

from __future__ import annotations

import inspect
import re
import types

import pytest
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

import hf_ckpt
from hf_ckpt import HfCkptWarning
from hf_ckpt.runtime.util.compat import gradient_checkpointing_layer_class
from hf_ckpt.cli import main
from hf_ckpt.verification import InplaceInput, parameter_groups
from helpers import VOCAB, batch_for, recomputed_in_step, tiny_gpt2, tiny_llama

# --- a small stack-flag model whose loop can modify a block's keyword input in place -------------------------------


class ToyConfig(PretrainedConfig):
    model_type = "hf-ckpt-verify-toy"

    def __init__(self, vocab_size: int = VOCAB, hidden_size: int = 16, num_layers: int = 4, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        super().__init__(**kwargs)


class ToyBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)
        self.truncate = False  # set between forward and backward by ToyModel(change_after_forward=True)

    def forward(self, hidden_states: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.norm(hidden_states) + bias
        if self.truncate:
            hidden_states, x = hidden_states[:, :-1], x[:, :-1]
        return hidden_states + self.down(torch.tanh(self.up(x)))


class ToyModel(PreTrainedModel):
    """Stack-flag model passing a per-layer ``bias`` to every block as a keyword argument.

    ``inplace=True``: the loop advances ``bias`` in place after each block, so a recompute sees the value of a
    later layer (non-reentrant checkpointing does not check the version of keyword inputs: silent corruption).
    ``change_after_forward=True``: each block computes differently once its forward is done, so its recompute
    saves tensors of other shapes (``CheckpointError``).
    """

    config_class = ToyConfig
    supports_gradient_checkpointing = True

    def __init__(self, config: ToyConfig, inplace: bool = False, change_after_forward: bool = False):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(ToyBlock(config.hidden_size) for _ in range(config.num_layers))
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.gradient_checkpointing = False
        self.inplace = inplace
        self.change_after_forward = change_after_forward
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        pass

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> CausalLMOutput:
        hidden_states = self.embed(input_ids)
        bias = torch.zeros(self.config.hidden_size)
        for layer in self.layers:
            layer.truncate = False
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(layer.__call__, hidden_states, bias=bias)
            else:
                hidden_states = layer(hidden_states, bias=bias)
            if self.inplace:
                bias.add_(0.5)
            else:
                bias = bias + 0.5
            layer.truncate = self.change_after_forward
        logits = self.head(hidden_states)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return CausalLMOutput(loss=loss, logits=logits)


def tiny_toy(**kwargs) -> ToyModel:
    torch.manual_seed(0)
    return ToyModel(ToyConfig(), **kwargs)


def _enable_upstream(model: nn.Module) -> None:
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})


def _checkpoints_inside_forward() -> bool:
    """Transformers >= 5.23 checkpoints inside the layer class's ``forward``; earlier releases in ``__call__``."""
    layer_cls = gradient_checkpointing_layer_class()
    return layer_cls is not None and "__call__" not in vars(layer_cls)


# --- a correct setup passes --------------------------------------------------------------------------------------


def test_correct_setup_passes_with_groups_and_measured_blocks():
    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=2)
    report = hf_ckpt.verify(model, batch_for(model))
    assert report.ok, str(report)
    assert report.expected_recomputed == [0, 2]
    assert report.recomputed == [0, 2]
    assert [g.group for g in report.gradients] == ["embeddings", "block 0", "block 1", "block 2", "block 3", "other", "head"]
    assert all(g.ok and g.parameters > 0 and not g.missing for g in report.gradients)
    assert _facts(str(report).splitlines()[0], "LlamaForCausalLM", "every_n_layers=2", "use_reentrant=False", "OK")


def test_parameter_groups_cover_every_parameter_once():
    model = tiny_llama(layers=2)
    groups = parameter_groups(model)
    assert list(groups) == [name for name, _ in model.named_parameters()]
    assert groups["model.embed_tokens.weight"] == "embeddings"
    assert groups["model.layers.1.self_attn.q_proj.weight"] == "block 1"
    assert groups["model.norm.weight"] == "other"
    assert groups["lm_head.weight"] == "head"


def test_dropout_is_replayed_with_default_settings():
    model = tiny_gpt2()  # dropout 0.1 everywhere
    hf_ckpt.enable(model)
    report = hf_ckpt.verify(model, batch_for(model))
    assert report.ok, str(report)
    assert report.random_blocks == [0, 1, 2, 3]
    assert report.rng_mismatch == []


def test_model_without_checkpointing_is_reported_as_off():
    model = tiny_llama()
    report = hf_ckpt.verify(model, batch_for(model))
    assert report.ok
    assert report.expected_recomputed == report.recomputed == []
    assert _facts(_line(report, "no block"), "checkpointing is off")


def test_loss_fn_for_inputs_without_labels():
    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=3)
    inputs = {"input_ids": batch_for(model)["input_ids"]}
    report = hf_ckpt.verify(model, inputs, loss_fn=lambda output: output.logits.float().pow(2).mean())
    assert report.ok, str(report)
    assert report.recomputed == [0, 3]


def test_lora_adapters_are_compared_per_block():
    pytest.importorskip("peft")  # in the test extra; CI installs it
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    hf_ckpt.enable(model, every_n_layers=2, use_reentrant=True)
    report = hf_ckpt.verify(model, batch_for(model))
    assert report.ok, str(report)
    assert report.recomputed == [0, 2]
    # only the LoRA weights train: 2 modules x (A, B) per block
    assert [(g.group, g.parameters) for g in report.gradients] == [(f"block {i}", 4) for i in range(4)]


def test_hf_ckpt_checkpoint_wrappers_are_verified():
    import hf_ckpt.distributed

    model = tiny_gpt2()
    hf_ckpt.distributed.apply(model, every_n_layers=2)
    report = hf_ckpt.verify(model, batch_for(model))
    assert report.ok, str(report)
    assert report.expected_recomputed == report.recomputed == [0, 2]
    assert report.always_checkpointed == []  # verify switched the wrappers off for the reference step
    assert report.random_blocks == [0, 2]


def test_foreign_checkpoint_wrappers_are_expected_and_noted():
    """``torch.distributed``'s ``CheckpointWrapper`` (accelerate's FSDP checkpointing) cannot be switched off."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    model = tiny_llama()
    model.config.use_cache = False  # no hf_ckpt hook turns the cache off here; a recompute would append to it again
    block_class = type(model.model.layers[0])
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda module: checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda module: isinstance(module, block_class),
    )
    report = hf_ckpt.verify(model, batch_for(model))
    assert report.ok, str(report)
    assert report.expected_recomputed == report.recomputed == [0, 1, 2, 3]
    assert report.always_checkpointed == [0, 1, 2, 3]
    assert _facts(_line(report, "note:"), "[0, 1, 2, 3]", "wrappers")


# --- each fault is caught ----------------------------------------------------------------------------------------


def test_monkeypatched_layer_forward_is_reported():
    """On transformers >= 5.23 the layer class's ``forward`` checkpoints: replacing it turns checkpointing off."""
    model = tiny_llama()
    hf_ckpt.enable(model)
    layer = model.model.layers[1]
    layer.forward = types.MethodType(inspect.unwrap(type(layer).forward), layer)
    if _checkpoints_inside_forward():  # the first step's probe measures it too
        with pytest.warns(HfCkptWarning, match=re.escape("Blocks [1] are selected but were not recomputed")):
            report = hf_ckpt.verify(model, batch_for(model))
    else:
        report = hf_ckpt.verify(model, batch_for(model))
    assert report.expected_recomputed == [0, 1, 2, 3]
    assert report.gradients_ok  # running a block directly is correct, just not checkpointed
    if _checkpoints_inside_forward():
        assert report.missing_recompute == [1]
        assert not report.ok
        assert (
            "not recomputed although checkpointed (checkpointing silently off): model.layers.1" in str(report)
        )
    else:  # checkpointing wraps __call__ (or the stack's loop): the patched forward is still recomputed
        assert report.missing_recompute == []
        assert report.ok, str(report)


@pytest.mark.parametrize("entry", ["enable", "distributed.apply"])
def test_rng_not_preserved_is_caught(entry):
    import hf_ckpt.distributed

    model = tiny_gpt2()
    apply = hf_ckpt.enable if entry == "enable" else hf_ckpt.distributed.apply
    apply(model, every_n_layers=2, preserve_rng_state=False)
    report = hf_ckpt.verify(model, batch_for(model))
    assert not report.ok
    assert report.rng_mismatch == [0, 2]
    failing = [g.group for g in report.gradients if not g.ok]
    assert "block 0" in failing and "block 2" in failing
    assert _facts(_line(report, "RNG replay"), "[FAIL]", "[0, 2]")


def test_inplace_modified_keyword_input_is_caught():
    model = tiny_toy(inplace=True)
    hf_ckpt.enable(model, every_n_layers=2)
    report = hf_ckpt.verify(model, batch_for(model))
    assert not report.ok
    assert not report.gradients_ok  # the silent corruption the check exists for
    # `bias` is advanced once after each of the 4 blocks: block i saw version i, its recompute sees version 4
    assert sorted(report.inplace_inputs, key=lambda item: item.block) == [
        InplaceInput(block=0, argument="bias", version_at_forward=0, version_at_recompute=4),
        InplaceInput(block=2, argument="bias", version_at_forward=2, version_at_recompute=4),
    ]
    assert _facts(_line(report, "block 2 (layers.2)", "bias"), "in place", "2 -> 4")


def test_same_model_without_inplace_passes():
    model = tiny_toy(inplace=False)
    hf_ckpt.enable(model, every_n_layers=2)
    report = hf_ckpt.verify(model, batch_for(model))
    assert report.ok, str(report)
    assert report.inplace_inputs == []


def test_error_of_the_checkpointed_step_is_reported():
    model = tiny_toy(change_after_forward=True)
    hf_ckpt.enable(model)
    report = hf_ckpt.verify(model, batch_for(model))
    assert not report.ok
    assert report.error.startswith("CheckpointError: torch.utils.checkpoint: Recomputed values for the following")
    assert _facts(_line(report, "raised"), "[FAIL]", "CheckpointError")


# --- the model is left exactly as it was --------------------------------------------------------------------------

_ABSENT = object()


def _flags(model):
    return [
        (module, module.__dict__.get("gradient_checkpointing", _ABSENT), module.__dict__.get("_gradient_checkpointing_func", _ABSENT))
        for module in model.modules()
    ]


@pytest.mark.parametrize("enabled_by", ["hf_ckpt", "upstream"])
def test_verify_restores_the_model_exactly(enabled_by):
    model = tiny_gpt2()
    if enabled_by == "hf_ckpt":
        hf_ckpt.enable(model, every_n_layers=2)
    else:
        _enable_upstream(model)
    expected = hf_ckpt.checkpointed_layers(model)
    model.eval()
    grads = {name: torch.full_like(p, 0.5) for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        p.grad = grads[name]
    state = model.__dict__.get("_hf_ckpt_state")
    flags = _flags(model)
    rng = torch.get_rng_state()

    report = hf_ckpt.verify(model, batch_for(model))

    assert report.ok, str(report)
    assert model.__dict__.get("_hf_ckpt_state") is state
    assert all(a[0] is b[0] and a[1] is b[1] and a[2] is b[2] for a, b in zip(flags, _flags(model)))
    assert not any(module.training for module in model.modules())
    assert all(p.grad is grads[name] for name, p in model.named_parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == expected == ([0, 2] if enabled_by == "hf_ckpt" else [0, 1, 2, 3])


# --- bad input ---------------------------------------------------------------------------------------------------


def test_bad_input_is_named():
    model = tiny_llama(layers=1)
    batch = batch_for(model)
    with pytest.raises(TypeError) as error:
        hf_ckpt.verify(model, [batch["input_ids"]])
    assert _names(error, "sample_inputs", "dict", "got list")  # the argument, what it takes, what it got
    with pytest.raises(ValueError) as error:
        hf_ckpt.verify(model, batch, rtol=-1.0)
    assert _names(error, "rtol", ">= 0", "-1.0")
    with pytest.raises(ValueError) as error:
        hf_ckpt.verify(model, batch, atol=float("nan"))
    assert _names(error, "atol", ">= 0", "nan")
    with pytest.raises(ValueError) as error:
        hf_ckpt.verify(model, {"input_ids": batch["input_ids"]})
    assert _names(error, "loss", "labels", "sample_inputs", "loss_fn")  # the two ways out
    with pytest.raises(TypeError) as error:
        hf_ckpt.verify(nn.Linear(2, 2), {})
    assert _names(error, "model", "PreTrainedModel", "Linear")


def _line(report: object, *keys: str) -> str:
    """The one line of a printed report that contains every one of ``keys``."""
    [line] = [line for line in str(report).splitlines() if all(key in line for key in keys)]
    return line


def _facts(line: str, *parts: str) -> bool:
    """A report line states the facts (blocks, verdict, versions): asserted piece by piece, not as a sentence."""
    missing = [part for part in parts if part not in line]
    assert not missing, f"{missing} not in: {line}"
    return True


def _names(error: pytest.ExceptionInfo, *parts: str) -> bool:
    missing = [part for part in parts if part not in str(error.value)]
    assert not missing, f"{missing} not in: {error.value}"
    return True


# --- hf-ckpt verify ----------------------------------------------------------------------------------------------

_SMALL = ["--layers", "2", "--hidden", "32", "--seq", "16", "--batch", "2"]


def test_cli_exits_zero_when_ok(capsys):
    assert main(["verify", *_SMALL, "--every-n-layers", "2"]) == 0
    out = capsys.readouterr().out
    assert _facts(_line(out, "hf_ckpt.verify:"), "LlamaForCausalLM", "every_n_layers=2", "OK")
    assert _facts(_line(out, "recomputed blocks"), "[ok]", "[0]")


def test_cli_exits_nonzero_when_not_ok(capsys):
    assert main(["verify", "--model", "gpt2", *_SMALL, "--no-preserve-rng-state"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out.splitlines()[1]
    assert _facts(_line(out, "RNG replay"), "[FAIL]", "[0, 1]")


def test_cli_rejects_bad_arguments(capsys):
    assert main(["verify", "--every-n-layers", "0"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()  # one line: the option, what it takes, what it got
    assert line.startswith("hf-ckpt verify: error: argument --every-n-layers: ")
    assert "positive int" in line and "'0'" in line
