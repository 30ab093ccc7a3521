"""``"partition:<F>:norms"`` (hf_ckpt.strategies.partition.norms): the partitioner may recompute layer norms and softmaxes, their
own kernels, as inductor does after decomposing them. A norm's output is then made again from its input in
backward instead of being kept beside it (gradients equal the model's own: tests/test_boundary.py, with dropout),
and the planner measures both sets of partitions where a block has such ops."""

import pytest
import torch

import hf_ckpt
import hf_ckpt.runtime.util.warn
from hf_ckpt.measure import measure_step
from hf_ckpt.strategies.partition import graph as _partition
from hf_ckpt.strategies.partition.graph import partition_unavailable, partitioned_checkpoint
from hf_ckpt.planning.menus.partition import partition_options
from helpers import VOCAB, tiny_bert, tiny_gpt2, tiny_llama

pytestmark = pytest.mark.skipif(partition_unavailable() is not None, reason=str(partition_unavailable()))

BATCH, SEQ = 2, 16


def _batch():
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def _measured(model, strategy: str):
    hf_ckpt.enable(model, plan=hf_ckpt.CheckpointPlan((strategy,) * 4))
    try:
        return measure_step(model, _batch())
    finally:
        hf_ckpt.disable(model)


@pytest.mark.parametrize("build, norm_outputs", [(tiny_bert, 1), (tiny_gpt2, 2)], ids=["bert", "gpt2"])
def test_each_block_keeps_its_norms_outputs_and_statistics_no_more_at_the_same_flops(build, norm_outputs):
    """At F=1 the plain partition keeps each layer norm's output beside its input (the next linear layer needs the
    output, the norm's backward the input, mean and rstd); with ``:norms`` only the input is kept. BERT's second
    norm is its block's output, which the next block's boundary makes again either way: one output per block there,
    both of GPT-2's pre-norms. Each block has two norms, each with a mean and an rstd per token."""
    model = build()
    plain, norms = _measured(model, "partition:1"), _measured(model, "partition:1:norms")
    hidden = model.config.hidden_size
    per_block = norm_outputs * BATCH * SEQ * hidden * 4 + 2 * 2 * BATCH * SEQ * 4
    assert plain.retained_bytes - norms.retained_bytes == 4 * per_block
    assert norms.flops == plain.flops


@pytest.mark.slow
def test_a_block_without_norm_ops_is_partitioned_the_same_way():
    """Llama's RMSNorm is written in Python (pointwise ops the partitioner already recomputes), and its attention
    is one sdpa call: ``:norms`` changes nothing."""
    model = tiny_llama()
    plain, norms = _measured(model, "partition:0.5"), _measured(model, "partition:0.5:norms")
    assert (norms.retained_bytes, norms.flops) == (plain.retained_bytes, plain.flops)


@pytest.mark.slow
def test_the_menu_measures_norms_partitions_only_where_a_block_has_norm_ops():
    bert = partition_options(tiny_bert(layers=2), _batch())
    llama = partition_options(tiny_llama(layers=2), _batch())
    assert any(option[0].endswith(":norms") for option in bert[0])
    assert any(not option[0].endswith(":norms") for option in bert[0])
    assert llama[0] and not any(option[0].endswith(":norms") for option in llama[0])


def test_a_torch_whose_partitioner_cannot_be_extended_checkpoints_in_full_and_says_why(monkeypatch):
    monkeypatch.setattr(_partition, "norms_unavailable", lambda: "no op list (test)")
    monkeypatch.setattr(hf_ckpt.runtime.util.warn, "_per_process", set())  # the warning is once per process
    block = tiny_bert(layers=1).bert.encoder.layer[0]
    x = torch.randn(2, 8, block.attention.self.query.in_features, requires_grad=True)
    with pytest.warns(hf_ckpt.HfCkptWarning) as caught:
        out = partitioned_checkpoint(block.__call__, x, budget=0.5, recompute_norms=True)
    assert [str(w.message) for w in caught] == [
        "partition: BertLayer is checkpointed in full instead of partitioned: no op list (test)."
    ]
    out[0].sum().backward()
    assert x.grad is not None
