"""What was recomputed is measured in the first training step, never guessed from source text or flags."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

import hf_ckpt
from hf_ckpt import HfCkptWarning
from hf_ckpt.runtime.blocks import Block
from hf_ckpt.runtime.counting import BlockRunCounter
from helpers import (
    ArgumentStackModel,
    DormantStackModel,
    FuncStackModel,
    LambdaStackModel,
    PartialStackModel,
    batch_for,
    max_grad_diff,
    recomputed_in_step,
    tiny_legacy,
    tiny_llama,
    train_step,
)


# --- BlockRunCounter on a hand-counted toy ------------------------------------------------------------------------


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(3))

    def forward(self, x, checkpointed=()):
        for index, block in enumerate(self.blocks):
            if index in checkpointed:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x.sum()


def test_block_run_counter_counts_forward_and_backward_runs_by_hand():
    toy = _Toy()
    blocks = [Block(index=i, name=f"blocks.{i}", module=b, owner=b) for i, b in enumerate(toy.blocks)]
    with BlockRunCounter(toy, blocks) as runs:
        toy(torch.randn(2, 4, requires_grad=True), checkpointed=(0, 2)).backward()
        assert dict(runs.counts) == {0: 2, 1: 1, 2: 2}
        assert dict(runs.backward_counts) == {0: 1, 2: 1}
        assert runs.recomputed() == [0, 2] and runs.recomputed_in_backward() == [0, 2]
        runs.reset()
        # two forwards, one backward (gradient accumulation): counts alone would call every block recomputed
        x = torch.randn(2, 4, requires_grad=True)
        (toy(x, checkpointed=(1,)) + toy(x, checkpointed=(1,))).backward()
        assert dict(runs.counts) == {0: 2, 1: 4, 2: 2}
        assert runs.recomputed_in_backward() == [1]
    toy(torch.randn(2, 4))  # hooks are gone after the window
    assert dict(runs.counts) == {0: 2, 1: 4, 2: 2}


# --- the adversarial models: one per way a model's code can ignore the selection ------------------------------------


def _enable_quietly(model, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HfCkptWarning)
        hf_ckpt.enable(model, **options)


@pytest.mark.parametrize(
    "cls, options, measured, reason",
    [
        (PartialStackModel, {"every_n_layers": 2}, [0, 1, 2, 3], "recomputed although not selected"),
        (PartialStackModel, {"layers": [3]}, [0, 1, 2, 3], "recomputed although not selected"),
        (LambdaStackModel, {"every_n_layers": 2}, [0, 1, 2, 3], "recomputed although not selected"),
        (DormantStackModel, {"every_n_layers": 2}, [], "selected but were not recomputed"),
    ],
)
def test_a_selection_the_model_ignores_is_measured_warned_and_reported(cls, options, measured, reason):
    model = tiny_legacy(cls)
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, **options)
    expected = hf_ckpt.checkpointed_layers(model)  # before any step: what the flags say
    with pytest.warns(HfCkptWarning) as record:
        recomputed, grads = recomputed_in_step(model, batch)
    messages = [str(w.message) for w in record if "Measured in the first training step" in str(w.message)]
    assert len(messages) == 1
    assert f"blocks {measured if measured else 'none'} were recomputed" in messages[0]
    assert f"selects blocks {expected}" in messages[0] and reason in messages[0]
    assert recomputed == measured
    assert hf_ckpt.checkpointed_layers(model) == measured
    assert max_grad_diff(reference, grads) <= 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)  # warned once; the probe is gone
        recomputed_in_step(model, batch)


@pytest.mark.parametrize("options, selected", [({"every_n_layers": 2}, [0, 2]), ({"layers": [3]}, [3])])
def test_a_block_handed_to_the_checkpoint_function_as_an_argument_follows_the_selection(options, selected):
    """IDEFICS (4.x) checkpoints ``vblock(decoder_layer, ...)``: the block is the function's first argument."""
    model = tiny_legacy(ArgumentStackModel)
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)  # the probe measures the selection: no warning
        recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == selected == hf_ckpt.checkpointed_layers(model)
    assert max_grad_diff(reference, grads) <= 1e-5


def test_a_forward_replaced_after_class_creation_is_measured():
    model = tiny_legacy(FuncStackModel)
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)

    def plain_forward(input_ids, labels=None):  # a monkey-patched forward that never checkpoints
        hidden = model.embed(input_ids)
        for layer in model.layers:
            hidden = layer(hidden)
        logits = model.head(hidden)
        loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        return _Output(loss)

    model.forward = plain_forward
    with pytest.warns(HfCkptWarning, match=re.escape("Blocks [0, 2] are selected but were not recomputed")):
        recomputed_in_step(model, batch)
    assert hf_ckpt.checkpointed_layers(model) == []


class _Output(dict):
    def __init__(self, loss):
        super().__init__(loss=loss)
        self.loss = loss


@pytest.mark.parametrize("cls", [FuncStackModel])
def test_a_model_that_honours_the_selection_does_not_warn_and_loses_the_probe(cls):
    model = tiny_legacy(cls)
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)
    state = model.__dict__["_hf_ckpt_state"]
    hooks_before = len(state.hooks)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)
        assert recomputed_in_step(model, batch)[0] == [0, 2]
    assert state.measured == (0, 2)
    assert len(state.hooks) < hooks_before  # the probe's hooks were removed after the step
    assert not any(
        hook for layer in model.layers for m in layer.modules() for hook in m._forward_pre_hooks.values()
    )


def test_no_measurement_in_eval_or_no_grad_forwards():
    model = tiny_llama()
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)
    state = model.__dict__["_hf_ckpt_state"]
    model.eval()
    model(**batch)
    model.train()
    with torch.no_grad():
        model(**batch)
    assert state.measured is None
    train_step(model, batch)
    assert state.measured == (0, 2)


def test_a_failed_enable_keeps_the_measurement():
    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=2)
    train_step(model, batch_for(model))
    with pytest.raises(ValueError):
        hf_ckpt.enable(model, layers=[7])
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


# --- multimodal: every tower's input embeddings get input grads ----------------------------------------------------


def _tiny_llava():
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=16, patch_size=8, projection_dim=32)
    text = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=63, vision_feature_layer=-1)
    return LlavaForConditionalGeneration(config)


def _llava_batch(model):
    generator = torch.Generator().manual_seed(2)
    # Releases that merge image features into the text themselves take one image token per image; later ones
    # expect the processor to have expanded it to one token per patch feature.
    merges_itself = hasattr(model, "_merge_input_ids_with_image_features")
    patches = 1 if merges_itself else (16 // 8) ** 2
    ids = torch.randint(1, 60, (1, 10), generator=generator)
    ids[0, 1:1 + patches] = 63
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": torch.randn(1, 3, 16, 16, generator=generator),
        "labels": ids.clone(),
    }


def test_lora_on_both_towers_of_a_multimodal_model_gets_gradients_with_reentrant_checkpointing():
    peft = pytest.importorskip("peft")
    model = _tiny_llava()
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(model, config)
    batch = _llava_batch(model)
    lora = {name: p for name, p in model.named_parameters() if "lora_" in name}
    vision = [name for name in lora if "vision_tower" in name]
    assert vision, "the LoRA config must reach the vision tower for this test to mean anything"
    hf_ckpt.enable(model, use_reentrant=True)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(**batch).loss.backward()
    missing = [name for name, p in lora.items() if p.grad is None]
    assert missing == []
    recomputed = hf_ckpt.checkpointed_layers(model)
    blocks = hf_ckpt.runtime.blocks.find_blocks(model.get_base_model())
    assert recomputed == [b.index for b in blocks]


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_reentrant_and_non_reentrant_steps_are_both_measured(use_reentrant):
    """Reentrant checkpointing runs a block's forward under no_grad and its recompute in a nested backward."""
    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=2, use_reentrant=use_reentrant)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)
        train_step(model, batch_for(model))
    assert model.__dict__["_hf_ckpt_state"].measured == (0, 2)


def test_a_setting_taken_back_between_forward_and_backward_reports_nothing():
    """TRL's DPO disables and re-enables checkpointing between the policy forward and its backward."""
    model = tiny_llama()
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)
    model.train()
    loss = model(**batch).loss
    hf_ckpt.disable(model)
    hf_ckpt.enable(model, every_n_layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)
        loss.backward()  # the first probe was cancelled; the second did not see this forward
    state = model.__dict__["_hf_ckpt_state"]
    assert state.measured is None
    train_step(model, batch)
    assert state.measured == (0, 2)


def _module_hooks(model: nn.Module) -> list:
    return [hook for m in model.modules() for hooks in (m._forward_pre_hooks, m._forward_hooks)
            for hook in hooks.values()]


def test_once_measured_nothing_of_the_probe_runs_or_stays_in_the_record():
    from hf_ckpt.runtime.probe import RecomputeProbe

    def probe_hook(hook) -> bool:
        hook = getattr(hook, "__wrapped__", hook)  # as registered by the record's Hooks
        bound = getattr(hook, "func", hook)
        return isinstance(getattr(bound, "__self__", None), RecomputeProbe)

    model = tiny_llama()
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)
    state = model.__dict__["_hf_ckpt_state"]
    armed = _module_hooks(model)
    assert any(probe_hook(hook) for hook in armed) and state.undo  # armed: hooks on the blocks, a cancel to run
    train_step(model, batch)
    lasting = _module_hooks(model)
    assert state.measured == (0, 2)
    assert not any(probe_hook(hook) for hook in lasting) and len(lasting) < len(armed)
    assert state.undo == []  # the finished probe's cancel left the record too
    train_step(model, batch)
    assert _module_hooks(model) == lasting and state.undo == []
    hf_ckpt.disable(model)
    assert _module_hooks(model) == []


def test_a_setting_replaced_before_its_first_step_is_named_not_measured():
    """Upstream's disable and enable between the setting and its first step (TRL's GRPO does so around generation)
    replace it: that step's probe says what changed, never that the replaced setting's selection failed."""
    import hf_ckpt
    from hf_ckpt.patch import original

    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=2)
    original("gradient_checkpointing_disable")(model)
    original("gradient_checkpointing_enable")(model, gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = batch_for(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(**batch).loss.backward()
    messages = [str(w.message) for w in caught if issubclass(w.category, hf_ckpt.HfCkptWarning)]
    assert len(messages) == 1 and "was changed outside hf_ckpt" in messages[0], messages


def test_a_setting_replaced_before_its_first_step_is_named_as_changed_not_measured_as_failing():
    """Upstream's disable, then a first step that never passes the model's own forward (the inner stack is called):
    the probe, at the end of that step, names the change; it does not report the unrecomputed blocks as a failure."""
    model = tiny_llama()
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)
    model.gradient_checkpointing_disable()  # upstream's, not patched: the record goes stale
    model.train()
    with pytest.warns(HfCkptWarning) as caught:
        model.model(input_ids=batch["input_ids"]).last_hidden_state.sum().backward()
    assert [str(w.message) for w in caught if "Measured" in str(w.message)] == []
    assert len(caught) == 1 and "was changed outside hf_ckpt" in str(caught[0].message), [str(w.message) for w in caught]
    assert hf_ckpt.checkpointed_layers(model) == []
