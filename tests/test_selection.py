"""``layers``, ``num_layers`` with ``method``, per-block strategies and plans: measured, with exact errors."""


import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import hf_ckpt
from hf_ckpt.runtime.plans import CheckpointPlan
from helpers import MODEL_BUILDERS, batch_for, max_grad_diff, recomputed_in_step, tiny_llama, train_step
from torch_capabilities import skip_unless


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
    "options, error, named",
    [
        # what a user needs from the message: the arguments involved, the offending value, the accepted values
        ({"layers": [0], "num_layers": 1}, ValueError, ("layers", "num_layers", "every_n_layers", "plan")),
        ({"every_n_layers": 2, "layers": [0]}, ValueError, ("every_n_layers", "layers")),
        ({"every_n_layers": 2, "num_layers": 2}, ValueError, ("every_n_layers", "num_layers")),
        ({"method": "block"}, ValueError, ("method", "num_layers")),
        ({"num_layers": 2, "method": "random"}, ValueError, ("method", "'random'", "'uniform'", "'block'")),
        ({"layers": [0, 4]}, ValueError, ("layers", "0..3", "[4]")),
        ({"layers": [-1]}, ValueError, ("layers", "0..3", "[-1]")),
        ({"layers": [0, 0]}, ValueError, ("layers", "[0, 0]")),
        ({"layers": []}, ValueError, ("layers", "hf_ckpt.disable")),
        ({"layers": "0,1"}, TypeError, ("layers", "'0,1'", "str")),
        ({"layers": [0.0]}, TypeError, ("layers", "0.0", "float")),
        ({"num_layers": 5}, ValueError, ("num_layers", "between 1 and 4", "got 5")),
        ({"num_layers": 0}, ValueError, ("num_layers", "got 0")),
        ({"strategy": "half"}, ValueError, ("strategy", "'half'", "'full'", "'selective'")),
        ({"policy": "matmuls"}, ValueError, ("policy", 'strategy="selective"')),
        ({"strategy": "selective", "policy": "nope"}, ValueError, ("policy", "'nope'", "attention", "matmuls_and_attention")),
        ({"strategy": "selective", "use_reentrant": True}, ValueError, ('strategy="selective"', "use_reentrant=False")),
        ({"strategy": "selective", "context_fn": lambda: None}, ValueError, ('strategy="selective"', "context_fn")),
    ],
)
def test_bad_selection_fails_at_the_call_and_changes_nothing(options, error, named):
    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=2)
    with pytest.raises(error) as raised:
        hf_ckpt.enable(model, **options)
    message = str(raised.value)
    missing = [part for part in named if part not in message]
    assert not missing, f"{missing} not in: {message}"
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]  # the previous setting stands


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
    with pytest.raises(ValueError) as raised:
        CheckpointPlan(strategies=("half",))
    assert all(part in str(raised.value) for part in ("'half'", "'none'", "'selective'", "'full'"))
    with pytest.raises(ValueError, match=r"plan.* 2 blocks.* 4 repeated blocks"):  # the plan's count and the model's
        hf_ckpt.enable(tiny_llama(), plan=CheckpointPlan(strategies=("full", "none")))
    with pytest.raises(ValueError, match=r"plan.*'missing\.json'"):
        hf_ckpt.enable(tiny_llama(), plan="missing.json")
    with pytest.raises(ValueError, match=r"\bplan\b.*\bstrategy\b"):
        hf_ckpt.enable(tiny_llama(), plan=CheckpointPlan(strategies=("full",) * 4), strategy="selective")
    with pytest.raises(ValueError, match=r"sample_inputs.*budget"):
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
    assert CheckpointPlan(("partition:0.5", "full", "partition:0.5"), outside_blocks=("model.norm",)).summary() == (
        "1 full, 2 partition:0.5, outside 1 module"
    )


def test_selective_refuses_a_block_that_writes_into_a_saved_output():
    """Silent gradient corruption becomes a clear error: the block adds in place into a saved matmul output."""
    from hf_ckpt.strategies.selective.policy import SelectiveRecomputeError
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
    with pytest.raises(SelectiveRecomputeError) as raised:
        train_step(model, batch_for(model))
    for part in ("aten.add_.Tensor", "aten.addmm.default", "strategy='full'"):  # the culprit, its victim, the way out
        assert part in str(raised.value)
    # the same process goes on with full checkpointing: needs a checkpoint that left the selective contexts
    skip_unless("checkpoint.exits_contexts_on_error")
    hf_ckpt.enable(model, strategy="full", layers=[1])
    assert recomputed_in_step(model, batch_for(model))[0] == [1]
