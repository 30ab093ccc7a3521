"""``layers``, ``num_layers`` with ``method``, per-block strategies and plans: measured, with exact errors."""

import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import hf_ckpt
from hf_ckpt.plans import CheckpointPlan
from helpers import MODEL_BUILDERS, batch_for, max_grad_diff, recomputed_in_step, tiny_llama, train_step


@pytest.mark.parametrize("name", ["llama", "gpt2", "t5"])
@pytest.mark.parametrize(
    "options, expected",
    [
        ({"layers": [3, 0]}, [0, 3]),
        ({"layers": [1]}, [1]),
        ({"num_layers": 2}, [0, 2]),
        ({"num_layers": 2, "method": "uniform"}, [0, 2]),
        ({"num_layers": 3, "method": "uniform"}, [0, 1, 2]),
        ({"num_layers": 2, "method": "block"}, [0, 1]),
        ({"num_layers": 4, "method": "block"}, [0, 1, 2, 3]),
    ],
)
def test_selection_is_measured_exactly(name, options, expected):
    model = MODEL_BUILDERS[name]()
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, **options)
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == expected
    assert hf_ckpt.checkpointed_layers(model) == expected
    assert max_grad_diff(reference, grads) <= 1e-5


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"layers": [0], "num_layers": 1}, ValueError,
         "layers and num_layers select blocks in different ways; give only one of every_n_layers, layers, num_layers (with method) and plan"),
        ({"every_n_layers": 2, "layers": [0]}, ValueError, "every_n_layers and layers select blocks in different ways"),
        ({"every_n_layers": 2, "num_layers": 2}, ValueError, "every_n_layers and num_layers select blocks in different ways"),
        ({"method": "block"}, ValueError, "method only applies together with num_layers; give num_layers too"),
        ({"num_layers": 2, "method": "random"}, ValueError, "method must be one of 'uniform', 'block'; got 'random'"),
        ({"layers": [0, 4]}, ValueError,
         "layers must be block indices in 0..3 (this model has 4 repeated blocks, counted encoder first); got [4] outside that range"),
        ({"layers": [-1]}, ValueError, "got [-1] outside that range"),
        ({"layers": [0, 0]}, ValueError, "layers must not repeat an index; got [0, 0]"),
        ({"layers": []}, ValueError, "layers must name at least one block index; to checkpoint nothing, call hf_ckpt.disable"),
        ({"layers": "0,1"}, TypeError, "layers must be a list of block indices (ints); got '0,1' of type str"),
        ({"layers": [0.0]}, TypeError, "layers must be a list of block indices (ints); got 0.0 of type float"),
        ({"num_layers": 5}, ValueError, "num_layers must be between 1 and 4, the number of repeated blocks of this model; got 5"),
        ({"num_layers": 0}, ValueError, "num_layers must be a positive int (how many blocks to checkpoint); got 0"),
        ({"strategy": "half"}, ValueError, "strategy must be one of 'full', 'selective'; got 'half'"),
        ({"policy": "matmuls"}, ValueError, 'policy only applies to strategy="selective"; set strategy="selective" or drop policy'),
        ({"strategy": "selective", "policy": "nope"}, ValueError, "policy must be a policy name (attention, matmuls, matmuls_and_attention)"),
        ({"strategy": "selective", "use_reentrant": True}, ValueError,
         'strategy="selective" needs use_reentrant=False (selective recompute is non-reentrant only)'),
        ({"strategy": "selective", "context_fn": lambda: None}, ValueError,
         'strategy="selective" sets context_fn itself; drop context_fn or use strategy="full"'),
    ],
)
def test_bad_selection_fails_at_the_call(options, error, message):
    model = tiny_llama()
    with pytest.raises(error, match=re.escape(message)):
        hf_ckpt.enable(model, **options)
    assert hf_ckpt.checkpointed_layers(model) == []


def _mm_flops(model, batch):
    with FlopCounterMode(display=False) as counter:
        train_step(model, batch)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_selective_recomputes_no_matmul(name):
    model = MODEL_BUILDERS[name]()
    batch = batch_for(model)
    reference = train_step(model, batch)
    none_flops = _mm_flops(model, batch)
    hf_ckpt.enable(model, strategy="full")
    full_flops = _mm_flops(model, batch)
    hf_ckpt.enable(model, strategy="selective")
    selective_flops = _mm_flops(model, batch)
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 1, 2, 3]  # every block reruns its cheap ops...
    assert selective_flops == none_flops < full_flops  # ...but no matmul or attention is computed twice
    assert max_grad_diff(reference, grads) <= 1e-5


def test_selective_with_a_custom_op_list_and_callable():
    from torch.utils.checkpoint import CheckpointPolicy

    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, strategy="selective", policy=[torch.ops.aten.mm], every_n_layers=2)
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert max_grad_diff(reference, grads) <= 1e-5

    def recompute_everything(ctx, op, *args, **kwargs):
        return CheckpointPolicy.PREFER_RECOMPUTE

    hf_ckpt.enable(model, strategy="selective", policy=recompute_everything)
    assert _mm_flops(model, batch) > _mm_flops(hf_ckpt.disable(model), batch)


# T5 up to transformers 4.52 adds its position bias in place into a saved matmul output: no selective there
@pytest.mark.parametrize("name, third", [("llama", "selective"), ("gpt2", "selective"), ("t5", "full")])
def test_plan_applies_a_strategy_per_block(name, third, tmp_path):
    model = MODEL_BUILDERS[name]()
    batch = batch_for(model)
    reference = train_step(model, batch)
    plan = CheckpointPlan(strategies=("full", "none", third, "none"))
    hf_ckpt.enable(model, plan=plan)
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert max_grad_diff(reference, grads) <= 1e-5

    path = tmp_path / "plan.json"
    plan.save(path)
    assert CheckpointPlan.load(path) == plan
    hf_ckpt.disable(model)
    hf_ckpt.enable(model, plan=str(path))
    assert recomputed_in_step(model, batch)[0] == [0, 2]


def test_plan_errors():
    with pytest.raises(ValueError, match=re.escape("each plan strategy must be one of 'none', 'selective', 'full'; got 'half'")):
        CheckpointPlan(strategies=("half",))
    with pytest.raises(ValueError, match=re.escape(
        "plan has a strategy for 2 blocks, but this model has 4 repeated blocks; make the plan on the same architecture"
    )):
        hf_ckpt.enable(tiny_llama(), plan=CheckpointPlan(strategies=("full", "none")))
    with pytest.raises(ValueError, match=re.escape("plan file 'missing.json' does not exist")):
        hf_ckpt.enable(tiny_llama(), plan="missing.json")
    with pytest.raises(ValueError, match="plan and strategy select blocks in different ways"):
        hf_ckpt.enable(tiny_llama(), plan=CheckpointPlan(strategies=("full",) * 4), strategy="selective")
    with pytest.raises(ValueError, match=re.escape("sample_inputs is the batch a budget is profiled on: give budget too")):
        hf_ckpt.enable(tiny_llama(), sample_inputs={"input_ids": None})


def test_trainer_style_dict_carries_the_new_options():
    model = tiny_llama()
    cls = type("CkptLlama", (hf_ckpt.GradientCheckpointingMixin, type(model)), {})
    model = tiny_llama(cls=cls)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"layers": [1, 2], "strategy": "selective"})
    assert recomputed_in_step(model, batch_for(model))[0] == [1, 2]


def test_plan_prints_readably():
    text = str(CheckpointPlan(strategies=("full", "none"), predicted_bytes=2**20, baseline_bytes=2**21, budget_bytes=2**20))
    assert text.splitlines()[:4] == [
        "CheckpointPlan for 2 blocks: 1 full, 1 none",
        "  budget:    1.00 MiB",
        "  predicted: 1.00 MiB (50.0% of no checkpointing)",
        "  block  strategy",
    ]


def test_selective_refuses_a_block_that_writes_into_a_saved_output():
    """Silent gradient corruption becomes a clear error: the block adds in place into a saved matmul output."""
    from hf_ckpt.selective import SelectiveRecomputeError
    from helpers import LegacyBlock, LegacyFuncModel, tiny_legacy

    class InPlaceBlock(LegacyBlock):
        def forward(self, hidden_states):
            scores = self.up(self.norm(hidden_states))
            scores += 1.0  # like T5's `scores += position_bias` (transformers <= 4.52)
            return hidden_states + self.down(torch.tanh(scores))

    model = tiny_legacy(LegacyFuncModel)
    model.layers = torch.nn.ModuleList(InPlaceBlock(model.config.hidden_size) for _ in range(4))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_ckpt.enable(model, strategy="selective", layers=[1])
    message = (
        "strategy='selective' cannot run on this block: aten.add_.Tensor modifies in place the output of "
        "aten.addmm.default, which the selective policy saves, so the recompute would apply it twice and the "
        "gradients would be wrong. Use strategy='full' for this model, or a policy that does not save aten.addmm.default."
    )
    with pytest.raises(SelectiveRecomputeError, match=re.escape(message)):
        train_step(model, batch_for(model))
    hf_ckpt.enable(model, strategy="full", layers=[1])
    assert recomputed_in_step(model, batch_for(model))[0] == [1]
