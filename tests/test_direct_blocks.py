"""Blocks a stack calls directly (its loop never calls a checkpoint function): hf_ckpt wraps them itself.

The guarantees are those of every other model: gradients equal, exactly the selected blocks measured recomputed,
``checkpointed_layers`` reports the truth, ``disable`` puts every block's ``forward`` back.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import transformers

import arch_build
import arch_check
import hf_ckpt
from hf_ckpt import HfCkptWarning
from hf_ckpt.runtime.stacks.direct import directly_called
from hf_ckpt.runtime.stacks.stack_code import hard_codes_checkpoint, never_checkpoints
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.counting import BlockRunCounter
from helpers import (
    DeclaredOnlyModel,
    DirectStackModel,
    DormantStackModel,
    FuncStackModel,
    InertStackModel,
    NestedLoopModel,
    batch_for,
    max_grad_diff,
    recomputed_in_step,
    tiny_legacy,
    train_step,
)


@pytest.mark.parametrize(
    "cls, never, hard_coded",
    [(InertStackModel, True, False), (FuncStackModel, False, False), (DirectStackModel, False, True),
     (DormantStackModel, False, False)],
)
def test_a_stack_qualifies_when_no_method_names_a_checkpoint_function_or_only_torchs(cls, never, hard_coded):
    assert never_checkpoints(cls) is never and hard_codes_checkpoint(cls) is hard_coded
    model = tiny_legacy(cls)
    assert len(directly_called(tuple(find_blocks(model)))) == (4 if never or hard_coded else 0)


@pytest.mark.parametrize("options, selected", [({"every_n_layers": 2}, [0, 2]), ({"layers": [1, 3]}, [1, 3]),
                                               ({}, [0, 1, 2, 3])])
def test_a_stack_that_hard_codes_torchs_checkpoint_keeps_its_flag_off_and_its_selected_blocks_wrapped(
        options, selected):
    """CLVP before transformers 5.16: its loop calls torch.utils.checkpoint.checkpoint itself, so with its flag on
    every block would be recomputed whatever the selection (and with torch's default arguments)."""
    model = tiny_legacy(DirectStackModel)
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, **options)
    assert model.gradient_checkpointing is False  # the loop's own checkpoint call never runs
    assert hf_ckpt.checkpointed_layers(model) == selected
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)  # the probe measures the selection: no warning
        recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == selected
    assert max_grad_diff(reference, grads) <= 1e-5
    report = hf_ckpt.verify(model, batch)  # its reference step runs with the wrapping switched off
    assert report.ok and report.recomputed == selected, str(report)
    hf_ckpt.disable(model)
    assert all("forward" not in layer.__dict__ for layer in model.layers)
    assert "_gradient_checkpointing_func" not in model.__dict__ and model.gradient_checkpointing is False
    assert recomputed_in_step(model, batch)[0] == []


def test_upstreams_disable_ends_the_wrapping_of_a_hard_coded_stack():
    """Upstream's gradient_checkpointing_disable rebinds every stack's function: the wrapped blocks run plainly."""
    model = tiny_legacy(DirectStackModel)
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)
    model.gradient_checkpointing_disable()
    with pytest.warns(HfCkptWarning) as caught:  # the record went stale: one warning names what changed
        assert hf_ckpt.checkpointed_layers(model) == []
        assert hf_ckpt.checkpointed_layers(model) == []
    assert [str(w.message) for w in caught] == [
        "hf_ckpt's setting on DirectStackModel (every_n_layers=2, use_reentrant=False) was changed outside hf_ckpt "
        "(DirectStackModel._gradient_checkpointing_func is another function, not the function hf_ckpt set: "
        "upstream's gradient_checkpointing_enable/disable, or an assignment): hf_ckpt drops its setting and hooks and "
        "leaves the model as it is now. Call hf_ckpt.enable(...) again to put the setting back, or "
        "hf_ckpt.disable(...) to turn checkpointing off."]
    assert recomputed_in_step(model, batch)[0] == []


@pytest.mark.parametrize("options, selected", [({"every_n_layers": 2}, [0, 2]), ({"layers": [1, 3]}, [1, 3]),
                                               ({}, [0, 1, 2, 3])])
def test_directly_called_blocks_are_checkpointed_measured_and_equal(options, selected):
    model = tiny_legacy(InertStackModel)
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, **options)
    assert hf_ckpt.checkpointed_layers(model) == selected
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)  # the probe measures the selection: no warning
        recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == selected
    assert hf_ckpt.checkpointed_layers(model) == selected
    assert max_grad_diff(reference, grads) <= 1e-5


def test_blocks_a_nested_module_checkpoints_are_never_wrapped():
    """The flag holder's own code never checkpoints, but the nested encoder that runs the blocks does (SEW-D and
    Fuyu on transformers 4.45): wrapping them too would checkpoint each block twice (a CheckpointError there)."""
    model = tiny_legacy(NestedLoopModel)
    blocks = find_blocks(model)
    assert [block.owner for block in blocks] == [model] * 4 and never_checkpoints(NestedLoopModel)
    assert directly_called(tuple(blocks)) == []
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, every_n_layers=2)
    assert all("forward" not in layer.__dict__ for layer in model.encoder.layers)
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert max_grad_diff(reference, grads) <= 1e-5


@pytest.mark.parametrize("options, selected", [({"every_n_layers": 2}, [0, 2]), ({}, [0, 1, 2, 3])])
def test_a_model_that_only_declares_support_gets_a_flag_and_its_blocks_checkpointed(options, selected):
    model = tiny_legacy(DeclaredOnlyModel)
    assert not any(hasattr(module, "gradient_checkpointing") for module in model.modules())
    blocks = find_blocks(model)
    assert [block.name for block in blocks] == [f"layers.{i}" for i in range(4)]
    assert all(block.owner is model for block in blocks)
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, **options)
    assert model.gradient_checkpointing is True and hf_ckpt.checkpointed_layers(model) == selected
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)
        recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == selected
    assert max_grad_diff(reference, grads) <= 1e-5
    hf_ckpt.disable(model)  # the flag hf_ckpt gave it goes with the wrapping
    assert "gradient_checkpointing" not in model.__dict__
    assert all("forward" not in layer.__dict__ for layer in model.layers)
    assert recomputed_in_step(model, batch)[0] == []


def test_a_model_with_no_flag_and_no_repeated_blocks_is_refused_by_name():
    model = tiny_legacy(DeclaredOnlyModel, layers=1)
    assert find_blocks(model) == []
    with pytest.raises(ValueError, match=r"^DeclaredOnlyModel is not compatible with activation checkpointing: none "
                       r"of its modules has a `gradient_checkpointing` attribute, and it has no list of repeated "
                       r"blocks\.$"):
        hf_ckpt.enable(model)
    assert "gradient_checkpointing" not in model.__dict__


def test_disable_and_reenable_put_each_forward_back_once():
    model = tiny_legacy(InertStackModel)
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)
    hf_ckpt.enable(model, layers=[3])  # the earlier wrapping is taken back first: never a wrapper around a wrapper
    assert all(layer.forward.inner.__func__ is type(layer).forward for layer in model.layers)
    recomputed, _ = recomputed_in_step(model, batch)
    assert recomputed == [3]
    hf_ckpt.disable(model)
    assert all("forward" not in layer.__dict__ for layer in model.layers)
    assert hf_ckpt.checkpointed_layers(model) == []
    recomputed, _ = recomputed_in_step(model, batch)
    assert recomputed == []


def test_a_wrapper_put_on_a_block_after_enable_stays_after_disable():
    """Another library's wrapper of a wrapped block's ``forward`` (accelerate's device hooks wrap every module's) is
    never removed: disable leaves it in place, hf_ckpt's wrapper inside it only passes calls through."""
    model = tiny_legacy(InertStackModel)
    batch = batch_for(model)
    hf_ckpt.enable(model, every_n_layers=2)
    calls = []
    for layer in model.layers:
        inner = layer.forward
        layer.forward = functools.partial(lambda inner, *a, **k: calls.append(1) or inner(*a, **k), inner)
    theirs = [layer.__dict__["forward"] for layer in model.layers]
    assert recomputed_in_step(model, batch)[0] == [0, 2]
    hf_ckpt.disable(model)
    assert [layer.__dict__["forward"] for layer in model.layers] == theirs
    calls.clear()
    assert recomputed_in_step(model, batch)[0] == [] and len(calls) == len(model.layers)
    hf_ckpt.enable(model, layers=[1])
    assert recomputed_in_step(model, batch)[0] == [1]


def test_a_forward_without_grad_or_in_eval_runs_the_block_plainly():
    model = tiny_legacy(InertStackModel)
    batch = batch_for(model)
    hf_ckpt.enable(model)
    model.eval()  # in eval mode with grad: nothing to recompute
    with BlockRunCounter(model) as runs:
        model(**batch).loss.backward()
    assert runs.recomputed_in_backward() == []
    model.train()
    with torch.no_grad(), BlockRunCounter(model) as runs:
        plain = model(**batch).logits
    assert dict(runs.counts) == {0: 1, 1: 1, 2: 1, 3: 1}  # once each: no checkpoint ran under no_grad
    assert plain.grad_fn is None
    recomputed, _ = recomputed_in_step(model, batch)
    assert recomputed == [0, 1, 2, 3]


# --- upstream models whose loop calls its blocks directly, built tiny ----------------------------------------------

DIRECT_TYPES = ("clvp", "mllama", "pp_ocrv5_server_rec", "pp_ocrv6_small_rec")


#: The release these types are asserted on (the sweep's newest); on older ones their loops differ or the generic
#: builder cannot build them tiny (CLVP on 4.45 has 659M parameters with its tiny config): the sweep measures them.
ASSERTED_FROM = (5, 24)


def _entry(model_type: str) -> arch_build.ModelType:
    entries = arch_build.model_types((model_type,))
    if not entries:
        pytest.skip(f"{model_type} is not in this transformers release")
    return entries[0]


def _older_release() -> bool:
    return tuple(int(part) for part in transformers.__version__.split(".")[:2]) < ASSERTED_FROM


@pytest.mark.parametrize("model_type", DIRECT_TYPES)
def test_upstream_models_whose_loop_calls_blocks_directly(model_type):
    if _older_release():  # their loops differ there (CLVP's checkpoints on 5.0); the sweep measures them
        pytest.skip("asserted on the newest release; older releases' sweeps measure these types")
    entry = _entry(model_type)
    reference = arch_check.Reference(lambda: arch_build.build(entry), arch_build.inputs, arch_build.gradients,
                                     arch_build.live_blocks)
    model = reference.fresh()
    assert directly_called(tuple(find_blocks(model))), "the release's loop checkpoints its blocks itself"
    arch_check.check(reference, "enable", 2)


def test_reentrant_checkpointing_of_a_block_called_with_keywords():
    class KeywordStack(InertStackModel):
        def _run_layer(self, layer, hidden_states):
            return layer(hidden_states=hidden_states)

    model = tiny_legacy(KeywordStack)
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, every_n_layers=2, use_reentrant=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HfCkptWarning)
        recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert max_grad_diff(reference, grads) <= 1e-5


def test_mllama_vision_blocks_recomputed_every_one():
    # (use_reentrant=True fails on tiny Mllama with or without this wrapping: "backward through the graph a second
    # time", from its layer-flag text blocks.)
    if _older_release():
        pytest.skip("asserted on the newest release (the sweep's builder and inputs for Mllama)")
    model = arch_build.build(_entry("mllama"))
    batch = arch_build.inputs(model)
    reference = arch_build.gradients(model, batch)
    hf_ckpt.enable(model)
    with BlockRunCounter(model) as runs:
        grads = arch_build.gradients(model, batch)
    assert runs.recomputed_in_backward() == hf_ckpt.checkpointed_layers(model) == list(range(len(find_blocks(model))))
    assert max((grads[n] - reference[n]).abs().max().item() for n in reference) <= 1e-4
