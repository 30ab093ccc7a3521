"""A budget without ``sample_inputs``: planned from the first real batch's shapes, before that step runs.

The stock ``Trainer`` after ``hf_ckpt.patch_transformers()`` with ``gradient_checkpointing_kwargs={"budget": ...}``,
the mixin, and ``hf_ckpt.enable(model, budget=...)``. Measured: the blocks backward recomputed
(``BlockRunCounter``) against the plan, the gradients against no checkpointing, the plan JSON in ``output_dir``,
the one log line, re-planning on a larger batch, and that a bad value or a disable leaves the model as it was.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch

import hf_ckpt
from hf_ckpt.budget import forms as _budget, from_estimate as _from_estimate
from hf_ckpt.budget.record import PLAN_FILE
from hf_ckpt.runtime.util.units import DEFERRED_BUDGET_FORMS
from hf_ckpt.runtime.state import AttributeSnapshot, get_state
from hf_ckpt.runtime.counting import BlockRunCounter
from hf_ckpt.estimation import profile_of
from helpers import VOCAB, TokenRows, max_grad_diff, tiny_llama, train_step

SEQ = 16


def _batch(batch: int = 2, seq: int = SEQ, seed: int = 1) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone()}


def _planned_blocks(plan) -> list[int]:
    return [i for i, s in enumerate(plan.strategies) if s != "none"]


def _plan_of(model) -> hf_ckpt.CheckpointPlan:
    return get_state(model).budget.plan


def _hook_count(model) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


@pytest.fixture
def budget_log(caplog):
    caplog.set_level(logging.INFO, logger="hf_ckpt")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "hf_ckpt" and r.levelno == logging.INFO]


@pytest.fixture
def free_memory():
    """Inject the free memory ``budget="auto"`` reads: ``free_memory(free, total)``."""
    previous = _budget.set_free_memory_source(None)
    yield lambda free, total: _budget.set_free_memory_source(lambda device: (free, total))
    _budget.set_free_memory_source(previous)


def _training_args(tmp_path, kwargs: dict, max_steps: int = 1, **extra):
    """The stock Trainer's arguments for these tests: checkpointing with ``gradient_checkpointing_kwargs=kwargs``,
    batches of 2, no learning, logging or saving, on the CPU."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp_path), gradient_checkpointing=True, gradient_checkpointing_kwargs=kwargs,
        max_steps=max_steps, per_device_train_batch_size=2, learning_rate=0.0, report_to=[], use_cpu=True,
        save_strategy="no", logging_strategy="no", dataloader_num_workers=0, **extra,
    )


@pytest.mark.slow
def test_stock_trainer_plans_the_first_batch_logs_once_and_saves_the_plan(patched, tmp_path, budget_log):
    from transformers import Trainer

    model = tiny_llama()
    args = _training_args(tmp_path, {"budget": 0.5}, max_steps=2)
    trainer = Trainer(model=model, args=args, train_dataset=TokenRows(VOCAB, SEQ))
    with BlockRunCounter(model) as runs:
        trainer.train()

    plan = _plan_of(model)
    expected = _planned_blocks(plan)
    assert expected  # half the memory: the estimate checkpoints some blocks (selective ones are recomputed too)
    assert runs.recomputed_in_backward() == expected
    # two real steps and nothing more: each block ran forward twice, once more per step where recomputed
    assert dict(runs.counts) == {i: 2 * (2 if i in expected else 1) for i in range(4)}
    assert hf_ckpt.checkpointed_layers(model) == expected
    assert plan.predicted_bytes <= 0.5 * plan.baseline_bytes

    saved = tmp_path / PLAN_FILE
    assert hf_ckpt.CheckpointPlan.load(saved).strategies == plan.strategies
    messages = budget_log()
    assert len(messages) == 1, messages
    assert messages[0].startswith("budget 50% for LlamaForCausalLM at batch 2 x seq 16 (float32 on cpu): plan ")
    assert f"predicted activation memory {hf_ckpt.runtime.util.units.format_bytes(plan.predicted_bytes)}" in messages[0]
    assert messages[0].endswith(f"saved to {saved}")


@pytest.mark.slow
def test_stock_trainer_with_bf16_plans_for_the_autocast_its_blocks_run_under(patched, tmp_path, budget_log):
    """bf16=True over float32 weights: the plan in effect is the autocast estimate's. Where accelerate wraps the
    outer forward in autocast, the outer level plans without it and the inner model's forward plans again, once."""
    from transformers import Trainer

    from hf_ckpt.estimation import plan_from_estimate

    model = tiny_llama()
    args = _training_args(tmp_path, {"budget": 0.5}, max_steps=2, bf16=True)
    Trainer(model=model, args=args, train_dataset=TokenRows(VOCAB, SEQ)).train()

    messages = budget_log()
    where = "LlamaForCausalLM at batch 2 x seq 16 (float32 with bfloat16 autocast on cpu): plan "
    if len(messages) == 1:  # transformers 4.x: the Trainer enters autocast around the outer model's call
        assert messages[0].startswith(f"budget 50% for {where}"), messages
    else:  # 5.x: accelerate wraps the outer forward, inside the outer level's pre-hook
        assert len(messages) == 2, messages
        assert messages[0].startswith("budget 50% for LlamaForCausalLM at batch 2 x seq 16 (float32 on cpu): plan ")
        assert messages[1].startswith(f"re-planned (bfloat16 autocast is on in LlamaModel's forward) budget 50% for {where}")
    made = _from_estimate.estimate_for(model, (2, SEQ), ("none", "full", "selective"), torch.bfloat16)[0]
    assert made.autocast == "bfloat16"
    assert _plan_of(model).strategies == plan_from_estimate(made, 0.5).strategies
    plain = _from_estimate.estimate_for(model, (2, SEQ), ("none", "full", "selective"))[0]
    assert plan_from_estimate(plain, 0.5).strategies != _plan_of(model).strategies  # autocast changed the plan
    assert get_state(model).budget.autocast is torch.bfloat16


def test_enable_budget_gradients_equal_no_checkpointing_and_probe_measures_the_plan():
    reference = train_step(tiny_llama(), _batch())
    model = hf_ckpt.enable(tiny_llama(), budget="50%")
    assert hf_ckpt.checkpointed_layers(model) == []  # nothing is checkpointed before the first batch
    with BlockRunCounter(model) as runs:
        grads = train_step(model, _batch())
    expected = _planned_blocks(_plan_of(model))
    assert expected and runs.recomputed_in_backward() == expected
    assert get_state(model).measured == tuple(expected)  # the probe measured the first step
    assert max_grad_diff(reference, grads) <= 1e-5


@pytest.mark.slow
def test_peft_model_is_planned_with_its_adapters(budget_log):
    peft = pytest.importorskip("peft")  # in the test extra: installed wherever the suite runs in CI

    def lora():
        config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        return peft.get_peft_model(tiny_llama(), config)

    reference = train_step(lora(), _batch())
    model = hf_ckpt.enable(lora(), budget=0.5)
    with BlockRunCounter(model) as runs:
        grads = train_step(model, _batch())
    plan = _plan_of(model.get_base_model())
    assert _planned_blocks(plan) and runs.recomputed_in_backward() == _planned_blocks(plan)
    assert max_grad_diff(reference, grads) <= 1e-5
    full_finetuning = _from_estimate.estimate_for(tiny_llama(), (2, SEQ), ("none", "full", "selective"))[0]
    assert plan.baseline_bytes < profile_of(full_finetuning).baseline_bytes  # frozen base: less is kept
    assert "(float32 on cpu, LORA)" in budget_log()[0]


@pytest.mark.slow
def test_mixin_budget_in_the_kwargs_dict(budget_log):
    import warnings

    cls = type("BudgetLlama", (hf_ckpt.GradientCheckpointingMixin, type(tiny_llama())), {})
    model = tiny_llama(cls=cls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated name on transformers >= 5.23
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"budget": "50%", "use_reentrant": False})
    with BlockRunCounter(model) as runs:
        train_step(model, _batch())
    expected = _planned_blocks(_plan_of(model))
    assert expected and runs.recomputed_in_backward() == expected
    assert len(budget_log()) == 1


@pytest.mark.slow
def test_byte_budget_larger_batch_replans_smaller_keeps(tmp_path, budget_log):
    model = tiny_llama()
    small = profile_of(_from_estimate.estimate_for(model, (2, 8), ("none", "full", "selective"))[0]).baseline_bytes
    # everything fits at batch 2 x seq 8; at seq 32 the same bytes need checkpointing
    hf_ckpt.enable(model, budget=small)
    get_state(model).budget.save_in(tmp_path)
    train_step(model, _batch(seq=8))
    assert _plan_of(model).strategies == ("none",) * 4 and hf_ckpt.checkpointed_layers(model) == []

    with BlockRunCounter(model) as runs:
        train_step(model, _batch(seq=32))
    replanned = _plan_of(model)
    assert _planned_blocks(replanned) and runs.recomputed_in_backward() == _planned_blocks(replanned)
    assert replanned.predicted_bytes <= small
    assert hf_ckpt.CheckpointPlan.load(tmp_path / PLAN_FILE).strategies == replanned.strategies

    train_step(model, _batch(seq=8))  # smaller again: the plan for the larger batch stays
    assert _plan_of(model) is replanned
    messages = budget_log()
    assert len(messages) == 2, messages
    assert messages[1].startswith("re-planned (batch 2 x seq 8 was planned before) budget ")
    assert "at batch 2 x seq 32" in messages[1]


@pytest.mark.slow
def test_weights_moved_after_the_first_plan_are_planned_again_and_auto_read_again(free_memory, budget_log):
    """``model.to(...)`` between steps: the plan in effect was made for the old dtype (or device), so the next
    forward plans again for the new one, and ``"auto"`` reads the free memory again."""
    from hf_ckpt.estimation import plan_from_estimate

    model = tiny_llama()
    strategies = ("none", "full", "selective")
    total = 8 * 2**30
    for dtype, share in ((torch.float32, 2), (torch.bfloat16, 3)):
        made = _from_estimate.estimate_for(model.to(dtype), (2, SEQ), strategies)[0]
        free_memory(_budget.headroom(total) + made.held_above_bytes[""] - made.parameters_bytes
                    + made.activation_bytes["none"] // share, total)
        if dtype is torch.float32:
            hf_ckpt.enable(model, budget="auto")
        train_step(model, _batch())
        train_step(model, _batch())  # nothing moved since: the plan holds
        request = get_state(model).budget
        assert request.auto_bytes == made.activation_bytes["none"] // share
        assert _plan_of(model).strategies == plan_from_estimate(made, request.auto_bytes).strategies
        assert hf_ckpt.checkpointed_layers(model) == _planned_blocks(_plan_of(model))
    messages = budget_log()
    assert len(messages) == 2, messages
    assert messages[0].startswith("budget auto (")
    assert messages[1].startswith("re-planned (the weights are float32 on cpu, now bfloat16 on cpu) budget auto (")
    assert "LlamaForCausalLM at batch 2 x seq 16 (bfloat16 on cpu)" in messages[1]


def test_auto_is_free_memory_less_headroom_gradients_states_and_transients(free_memory):
    """The room left beside the activations: the states and what the backward's peak holds beside them (the
    gradients made by then, the transients), the step's timeline."""
    model = tiny_llama()
    made = _from_estimate.estimate_for(model, (2, SEQ), ("none", "full", "selective"))[0]
    total = 8 * 2**30
    still = made.held_above_bytes[""] - made.parameters_bytes
    assert still < made.gradients_bytes + made.optimizer_bytes + max(made.transient_bytes.values())
    activations = made.activation_bytes["none"] // 2
    free_memory(_budget.headroom(total) + still + activations, total)
    hf_ckpt.enable(model, budget="auto")
    train_step(model, _batch())
    request = get_state(model).budget
    assert request.auto_bytes == activations
    assert _plan_of(model).predicted_bytes <= activations < made.activation_bytes["none"]
    assert hf_ckpt.checkpointed_layers(model) == _planned_blocks(_plan_of(model))


@pytest.mark.parametrize(("optim", "name"), [("sgd", "SGD"), ("adamw_torch", "AdamW")])
def test_auto_in_the_trainer_leaves_room_for_its_own_optimizer(patched, tmp_path, free_memory, optim, name):
    """The Trainer tells the budget its optimizer (BudgetPlanCallback): "auto" leaves room for what that
    optimizer's first step allocates (SGD without momentum: nothing), not for AdamW's states."""
    from transformers import Trainer

    from hf_ckpt.meters.optimizer_states import pending_state_bytes, unwrap

    model = tiny_llama()
    made = _from_estimate.estimate_for(model, (2, SEQ), ("none", "full", "selective"))[0]
    total, activations = 8 * 2**30, made.activation_bytes["none"] // 2
    states = {"SGD": 0, "AdamW": made.optimizer_bytes}[name]
    free_memory(_budget.headroom(total) + made.held_above_bytes[""] - made.parameters_bytes - made.optimizer_bytes
                + states + activations, total)
    args = _training_args(tmp_path, {"budget": "auto"}, optim=optim)
    trainer = Trainer(model=model, args=args, train_dataset=TokenRows(VOCAB, SEQ))
    trainer.create_optimizer()
    assert pending_state_bytes(trainer.optimizer) == states  # AdamW's as the estimator counts them
    trainer.train()
    request = get_state(model).budget
    assert type(unwrap(request.optimizer())).__name__ == name  # inside accelerate's AcceleratedOptimizer
    assert request.auto_bytes == activations


def test_auto_with_an_unknown_optimizer_warns_once_and_assumes_adamw(free_memory):
    class Lion(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.0})

    model = tiny_llama()
    made = _from_estimate.estimate_for(model, (2, SEQ), ("none", "full", "selective"))[0]
    total, activations = 8 * 2**30, made.activation_bytes["none"] // 2
    free_memory(_budget.headroom(total) + made.held_above_bytes[""] - made.parameters_bytes + activations, total)
    hf_ckpt.enable(model, budget="auto")
    optimizer = Lion(model.parameters())
    get_state(model).budget.use_optimizer(optimizer)
    with pytest.warns(hf_ckpt.HfCkptWarning) as warned:
        train_step(model, _batch())
    assert [str(w.message) for w in warned if issubclass(w.category, hf_ckpt.HfCkptWarning)] == [
        "budget='auto': hf_ckpt does not know what Lion's first step allocates; it leaves room for AdamW's states "
        "(two buffers the size of each trainable parameter). Register the optimizer with "
        "hf_ckpt.register_optimizer_states, or give the budget in bytes."
    ]
    assert get_state(model).budget.auto_bytes == activations


def test_auto_without_room_fails_at_the_first_batch_and_changes_nothing(free_memory):
    model = tiny_llama()
    free_memory(512 * 2**20, 8 * 2**30)  # less than the headroom: 10% of 8 GiB
    hf_ckpt.enable(model, budget="auto")
    with pytest.raises(ValueError, match=r"budget='auto': no memory is left for activations on cpu: 512\.00 MiB free, less a headroom of 819\.20 MiB"):
        train_step(model, _batch())
    assert hf_ckpt.checkpointed_layers(model) == [] and get_state(model).budget.plan is None


def test_no_plan_fits_names_the_budget_and_the_smallest_reachable():
    model = hf_ckpt.enable(tiny_llama(), budget="1KiB")
    with pytest.raises(ValueError) as raised:
        train_step(model, _batch())
    message = str(raised.value)
    assert message.startswith("budget=1024 bytes for LlamaForCausalLM at batch 2 x seq 16 (float32 on cpu): no plan fits")
    assert "for LlamaForCausalLM at batch 2 x seq 16" in message
    assert re.search(r"the smallest activation memory reachable with none, selective, full is [0-9.]+ MiB", message)
    assert hf_ckpt.checkpointed_layers(model) == []


@pytest.mark.parametrize("budget, error, expected", [
    (2.0, ValueError, "a budget as a fraction must be in (0, 1]; got 2.0"),
    ("lots", ValueError, "got 'lots'"),
    (0, ValueError, "budget in bytes must be positive; got 0"),
    (True, TypeError, "got True"),
    ([0.5], TypeError, "got [0.5] of type list"),
])
def test_bad_budget_fails_at_the_call_and_changes_nothing(budget, error, expected):
    model = hf_ckpt.enable(tiny_llama(), every_n_layers=2)
    before, hooks = AttributeSnapshot.take(model).entries, _hook_count(model)
    with pytest.raises(error) as raised:
        hf_ckpt.enable(model, budget=budget)
    assert str(raised.value).startswith(f"budget must be {DEFERRED_BUDGET_FORMS}; ")
    assert expected in str(raised.value)
    assert AttributeSnapshot.take(model).entries == before and _hook_count(model) == hooks
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


def test_budget_with_a_selection_or_policy_fails_at_the_call():
    model = tiny_llama()
    with pytest.raises(ValueError, match="budget makes the plan itself: give it without layers"):
        hf_ckpt.enable(model, budget=0.5, layers=[0])
    with pytest.raises(ValueError, match="budget makes the plan itself: give it without strategy"):
        hf_ckpt.enable(model, budget=0.5, strategy="selective", policy="matmuls")
    cls = type("BudgetLlama", (hf_ckpt.GradientCheckpointingMixin, type(model)), {})
    mixed = tiny_llama(cls=cls)
    with pytest.raises(ValueError, match="budget makes the plan itself: give it without every_n_layers"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            mixed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"budget": 0.5, "every_n_layers": 2})
    assert get_state(model) is None and get_state(mixed) is None


def test_disable_restores_exactly_before_and_after_the_plan():
    model = tiny_llama()
    before, hooks = AttributeSnapshot.take(model).entries, _hook_count(model)
    hf_ckpt.enable(model, budget=0.5)
    assert get_state(model).budget is not None and _hook_count(model) > hooks
    hf_ckpt.disable(model)
    assert AttributeSnapshot.take(model).entries == before and _hook_count(model) == hooks
    assert get_state(model) is None

    hf_ckpt.enable(model, budget=0.25)
    train_step(model, _batch())
    assert hf_ckpt.checkpointed_layers(model)
    hf_ckpt.disable(model)
    assert AttributeSnapshot.take(model).entries == before and _hook_count(model) == hooks
    with BlockRunCounter(model) as runs:
        train_step(model, _batch())
    assert runs.recomputed_in_backward() == []


def test_a_planned_budget_changed_by_upstreams_disable_gives_way_to_it_in_the_next_step(budget_log):
    """Upstream's disable after a budget's plan (not patched: the record goes stale). The next step's first pre-hook
    drops the record, hooks and all, inside that forward; the hooks it removed do nothing for that forward (torch
    still calls them, a ``with_kwargs`` one without its kwargs): the step is upstream's, no block rerun."""
    from hf_ckpt.runtime.util.warn import HfCkptWarning

    model = tiny_llama()
    reference = train_step(model, _batch())
    hooks = _hook_count(model)
    hf_ckpt.enable(model, budget=0.5, keep_outputs=False)
    train_step(model, _batch())
    assert hf_ckpt.checkpointed_layers(model) == _planned_blocks(_plan_of(model)) != []
    model.gradient_checkpointing_disable()
    with pytest.warns(HfCkptWarning, match="was changed outside hf_ckpt"), BlockRunCounter(model) as runs:
        grads = train_step(model, _batch())
    assert runs.recomputed_in_backward() == [] and max_grad_diff(reference, grads) < 1e-6
    assert get_state(model) is None and _hook_count(model) == hooks and len(budget_log()) == 1


def test_enabling_again_with_the_same_budget_reapplies_its_plan_at_once(budget_log):
    model = hf_ckpt.enable(tiny_llama(), budget=0.5)
    train_step(model, _batch())
    plan = _plan_of(model)
    hf_ckpt.disable(model)
    hf_ckpt.enable(model, budget=0.5)  # TRL's DPO trainer does this within every step
    assert hf_ckpt.checkpointed_layers(model) == _planned_blocks(plan) and _plan_of(model) is plan
    assert len(budget_log()) == 1


def test_patch_adds_the_callback_and_unpatch_takes_it_out():
    from transformers import trainer

    from hf_ckpt.integrations.trainer import BudgetPlanCallback

    hf_ckpt.patch_transformers()
    try:
        assert trainer.DEFAULT_CALLBACKS.count(BudgetPlanCallback) == 1
        hf_ckpt.patch_transformers()
        assert trainer.DEFAULT_CALLBACKS.count(BudgetPlanCallback) == 1
    finally:
        hf_ckpt.unpatch_transformers()
    assert BudgetPlanCallback not in trainer.DEFAULT_CALLBACKS


def test_enabling_again_with_other_options_keeps_the_optimizer_and_autocast_found():
    """Enabled again with other options within training (here ``preserve_rng_state=False``): the new request is
    planned for the optimizer the Trainer told and the autocast found in the run so far."""
    model = tiny_llama()
    hf_ckpt.enable(model, budget="auto")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    get_state(model).budget.use_optimizer(optimizer)
    get_state(model).budget.autocast = torch.bfloat16
    hf_ckpt.enable(model, budget="auto", preserve_rng_state=False)
    request = get_state(model).budget
    assert request.optimizer() is optimizer and request.autocast is torch.bfloat16
    assert request.request.kwargs_dict == {"preserve_rng_state": False}  # the call's EnableRequest


def test_enabling_again_with_the_defaults_left_out_is_the_same_request():
    """The Trainer enables with ``every_n_layers=1, offload=False``; TRL's DPO enables again, each step, with
    neither: the same configuration, so the plan made at the first batch holds and nothing is planned again."""
    model = tiny_llama()
    hf_ckpt.enable(model, budget=0.5, every_n_layers=1, offload=False)
    train_step(model, _batch())
    request = get_state(model).budget
    assert request.plan is not None
    hf_ckpt.enable(model, budget=0.5)
    assert get_state(model).budget is request
    assert hf_ckpt.checkpointed_layers(model) == _planned_blocks(request.plan)
    hf_ckpt.enable(model, budget=0.5, every_n_layers=1, offload=False, preserve_rng_state=False)
    assert get_state(model).budget is not request


def _logits_bytes(batch: int = 2, seq: int = SEQ) -> int:
    return batch * seq * VOCAB * 4  # float32 logits: what a loop that keeps the outputs holds besides the loss


def _trained_with(tmp_path, kwargs: dict):
    """A tiny Llama trained one step by the stock Trainer with ``gradient_checkpointing_kwargs=kwargs``."""
    from transformers import Trainer

    model = tiny_llama()
    Trainer(model=model, args=_training_args(tmp_path, kwargs), train_dataset=TokenRows(VOCAB, SEQ)).train()
    return model


@pytest.mark.slow
def test_keep_outputs_plans_for_a_loop_that_keeps_the_outputs(patched, tmp_path):
    """The Trainer's kwargs dict and hf_ckpt.enable take keep_outputs with a budget: the plan is made from an
    estimate that counts the kept outputs (its baseline exceeds the plan of the same step without them by at least
    the logits' bytes: on older releases the output object also holds the key/value cache)."""
    trainer_step = tiny_llama()
    hf_ckpt.enable(trainer_step, budget=0.5)
    train_step(trainer_step, _batch())
    kept = tiny_llama()
    hf_ckpt.enable(kept, budget=0.5, keep_outputs=True)
    train_step(kept, _batch())
    assert get_state(kept).budget.keep_outputs is True and get_state(trainer_step).budget.keep_outputs is False
    assert _plan_of(kept).baseline_bytes - _plan_of(trainer_step).baseline_bytes >= _logits_bytes()

    # the Trainer's first batch is its own (the collator's keys and dtypes differ by release): its plan without
    # keep_outputs is the reference, not the hand-made step's
    plain = _trained_with(tmp_path / "plain", {"budget": 0.5})
    model = _trained_with(tmp_path / "kept", {"budget": 0.5, "keep_outputs": True})
    assert get_state(model).budget.keep_outputs is True and get_state(plain).budget.keep_outputs is False
    assert _plan_of(model).baseline_bytes - _plan_of(plain).baseline_bytes >= _logits_bytes()


@pytest.mark.slow
def test_keep_outputs_in_plan_from_shapes():
    config = tiny_llama().config
    kept = hf_ckpt.plan(config, batch_size=2, seq_len=SEQ, budget=0.5, dtype="float32", device="cpu",
                        keep_outputs=True)
    plain = hf_ckpt.plan(config, batch_size=2, seq_len=SEQ, budget=0.5, dtype="float32", device="cpu")
    assert kept.baseline_bytes - plain.baseline_bytes >= _logits_bytes()  # the logits, and older releases' cache


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: hf_ckpt.enable(m, keep_outputs=True), "keep_outputs chooses the loop a budget without sample_inputs"),
        (lambda m: hf_ckpt.enable(m, budget=0.5, sample_inputs=_batch(), keep_outputs=True),
         "keep_outputs chooses the loop a budget without sample_inputs"),
        (lambda m: hf_ckpt.enable(m, budget=0.5, keep_outputs="yes"), "keep_outputs must be True or False; got 'yes'"),
        (lambda m: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"keep_outputs": True}),
         "keep_outputs chooses the loop a budget without sample_inputs is planned for"),
        (lambda m: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"budget": 0.5, "keep_outputs": 1}),
         "keep_outputs must be True or False; got 1"),
        (lambda m: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"budget": 0.5, "keep_outputs": True},
                                                   keep_outputs=False), "keep_outputs was given twice"),
        (lambda m: hf_ckpt.plan(m, _batch(), 0.5, keep_outputs=True), "keep_outputs applies to a plan from shapes"),
    ],
)
def test_keep_outputs_errors_name_it_at_the_call_and_change_nothing(patched, call, message):
    import warnings

    model = tiny_llama()
    with pytest.raises(ValueError, match=re.escape(message)), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers >= 5.23: the old method name is deprecated
        call(model)
    assert get_state(model) is None and hf_ckpt.checkpointed_layers(model) == []
