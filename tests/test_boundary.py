"""A partitioned block's output is made again in backward from what the block keeps, not kept twice."""

import warnings

import pytest
import torch
from helpers import max_grad_diff, tiny_bert, tiny_llama, train_step
from torch.multiprocessing.reductions import StorageWeakRef
from torch_capabilities import requires

import hf_ckpt
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.strategies.partition.graph import partition_unavailable

pytestmark = pytest.mark.skipif(partition_unavailable() is not None, reason=str(partition_unavailable()))

VOCAB = 64


def _batch(seq: int = 32):
    ids = torch.randint(1, VOCAB, (2, seq), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def _alive_outputs_after_forward(model, strategies, batch) -> list[bool]:
    """Whether each block's output storage is still alive when forward has returned the loss."""
    refs: list = []
    handles = [
        block.module.register_forward_hook(
            lambda m, a, out: refs.append(StorageWeakRef((out[0] if isinstance(out, tuple) else out).untyped_storage()))
        )
        for block in find_blocks(model)
    ]
    hf_ckpt.enable(model, plan=hf_ckpt.CheckpointPlan(strategies))
    try:
        model.train()
        loss = model(**batch).loss
        alive = [not ref.expired() for ref in refs]
        loss.backward()
    finally:
        hf_ckpt.disable(model)
        for handle in handles:
            handle.remove()
    return alive


def test_a_post_norm_blocks_output_is_not_kept_by_what_consumes_it():
    """BERT's blocks end in a layer norm whose backward keeps its input: the next block (and the head) need not keep
    the norm's output too."""
    model = tiny_bert()
    assert _alive_outputs_after_forward(model, ("partition:1",) * 4, _batch()) == [False] * 4


def test_consumers_under_any_strategy_are_served():
    """A plain block, a fully checkpointed one (its saved inputs) and the head save the previous block's output
    through the same hook."""
    model = tiny_bert()
    strategies = ("partition:1", "none", "partition:1", "full")
    # block 0's output is consumed by a plain block, block 2's by a full checkpoint: both made again; blocks 1 and 3
    # are not partitioned: their outputs are kept
    assert _alive_outputs_after_forward(model, strategies, _batch()) == [False, True, False, True]


def test_a_pre_norm_blocks_output_is_kept():
    """A Llama block ends in a residual add of a matmul's output, which its graph does not keep: nothing to make
    the output from cheaply, so the next block keeps it."""
    model = tiny_llama()
    assert _alive_outputs_after_forward(model, ("partition:1",) * 4, _batch()) == [True] * 4


@pytest.mark.parametrize("strategies", [
    ("partition:1",) * 4, ("partition:1", "none", "partition:0.5", "full"),
    ("partition:1:norms",) * 4, ("partition:0.3:norms", "none", "partition:0.5", "partition:0:norms"),
], ids=["all-partitioned", "mixed", "norms", "norms-mixed"])
def test_gradients_equal_the_models_own_with_dropout(strategies):
    model, batch = tiny_bert(), _batch()
    assert model.config.hidden_dropout_prob > 0 and model.config.attention_probs_dropout_prob > 0
    reference = train_step(model, batch)
    hf_ckpt.enable(model, plan=hf_ckpt.CheckpointPlan(strategies))
    grads = train_step(model, batch)
    hf_ckpt.disable(model)
    assert max_grad_diff(reference, grads) <= 1e-6


@requires("autograd.saved_tensors_hooks_stack")
def test_under_another_saved_tensor_hook_outputs_are_kept_and_it_says_so_once():
    model, batch = tiny_bert(), _batch()
    reference = train_step(model, batch)
    refs: list = []
    for block in find_blocks(model):
        block.module.register_forward_hook(lambda m, a, out: refs.append(StorageWeakRef(out[0].untyped_storage())))
    hf_ckpt.enable(model, plan=hf_ckpt.CheckpointPlan(("partition:1",) * 4))
    with warnings.catch_warnings(record=True) as caught, torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        warnings.simplefilter("always")
        loss = model(**batch).loss
        alive = [not ref.expired() for ref in refs]
        loss.backward()
        grads = train_step(model, batch)
    hf_ckpt.disable(model)
    assert alive == [True] * 4
    assert max_grad_diff(reference, grads) <= 1e-6
    said = [str(w.message) for w in caught if "another saved-tensor hook" in str(w.message)]
    assert said == [
        "hf_ckpt: another saved-tensor hook (torch.autograd.graph.save_on_cpu or your own) is active around the "
        "model's forward, so the plan's outside_blocks and partitioned blocks' outputs are kept as that hook decides, "
        "not recomputed in backward."
    ]
