"""Cheap modules between the blocks recomputed in backward (a plan's ``outside_blocks``, hf_ckpt.strategies.outside.hook): the
modules chosen are measured, gradients equal the model's own, the final norm's and LM head's hidden-sized tensors
are no longer kept, the planner uses it only where it pays, disable takes it all back, and bad input is named."""

import pytest
import torch

import hf_ckpt
from hf_ckpt.planning.menus.outside import cheap_modules
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.measure import measure_step
from helpers import VOCAB, max_grad_diff, tiny_bert, tiny_gpt2, tiny_llama, train_step


def _batch(seq: int = 64):
    ids = torch.randint(1, VOCAB, (2, seq), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def _plan(model, strategy: str = "none", outside=None) -> hf_ckpt.CheckpointPlan:
    blocks = find_blocks(model)
    names = cheap_modules(model, _batch(), blocks) if outside is None else outside
    return hf_ckpt.CheckpointPlan((strategy,) * len(blocks), outside_blocks=names)


def test_the_modules_recomputed_are_the_cheap_ones_outside_the_blocks_and_dropout():
    llama = tiny_llama()
    names = cheap_modules(llama, _batch(), find_blocks(llama))
    assert {"model.embed_tokens", "model.norm"} <= set(names) <= {"model.embed_tokens", "model.norm", "model.rotary_emb"}
    gpt2 = tiny_gpt2()  # dropout after the embeddings: recomputed from the RNG state it drew from
    assert cheap_modules(gpt2, _batch(), find_blocks(gpt2)) == (
        "transformer.drop", "transformer.ln_f", "transformer.wpe", "transformer.wte")
    assert "lm_head" not in names  # a matmul: not cheap


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2, tiny_bert], ids=["llama", "gpt2-dropout", "bert-dropout"])
@pytest.mark.parametrize("strategy", ["none", "full"])
def test_gradients_equal_the_models_own(build, strategy):
    model, batch = build(), _batch()
    reference = train_step(model, batch)
    hf_ckpt.enable(model, plan=_plan(model, strategy))
    grads = train_step(model, batch)
    hf_ckpt.disable(model)
    assert max_grad_diff(reference, grads) <= 1e-6


def test_the_final_norm_and_head_keep_no_hidden_sized_tensor_of_their_own():
    model, batch = tiny_llama(layers=2), _batch()
    hidden_bytes = 2 * 64 * model.config.hidden_size * 4
    retained = {}
    for outside in ((), ("model.norm",)):
        hf_ckpt.enable(model, plan=_plan(model, "none", outside))
        retained[outside] = measure_step(model, batch).retained_bytes
        hf_ckpt.disable(model)
    # RMSNorm keeps its normalised input, the LM head keeps the norm's output: two hidden-sized tensors
    assert retained[()] - retained[("model.norm",)] >= 2 * hidden_bytes
    hf_ckpt.enable(model, plan=_plan(model, "none", ()))
    assert measure_step(model, batch).retained_bytes == retained[()]  # disable took it all back
    hf_ckpt.disable(model)


def test_a_chain_of_cheap_modules_keeps_only_its_first_input_and_dropout_is_replayed():
    """BERT's head runs dense -> gelu -> LayerNorm, its embeddings module lookups -> sum -> LayerNorm -> dropout
    (recomputed whole): the activation's and the embeddings' outputs are neither kept by the next module's
    checkpoint nor by the block that reads them."""
    from torch.multiprocessing.reductions import StorageWeakRef

    model, batch = tiny_bert(), _batch()
    watched = ("bert.embeddings.dropout", "cls.predictions.transform.transform_act_fn", "cls.predictions.transform.dense")
    refs = {}
    for name in watched:
        model.get_submodule(name).register_forward_hook(
            lambda m, a, out, name=name: refs.__setitem__(name, StorageWeakRef(out.untyped_storage())))
    plan = _plan(model)
    assert {"bert.embeddings", "cls.predictions.transform.transform_act_fn"} <= set(plan.outside_blocks)
    hf_ckpt.enable(model, plan=plan)
    model.train()
    loss = model(**batch).loss
    alive = {name: not ref.expired() for name, ref in refs.items()}
    loss.backward()
    hf_ckpt.disable(model)
    # the dense layer's output is the chain's first input (a matmul: kept); the rest is made again from it
    assert alive == {"bert.embeddings.dropout": False, "cls.predictions.transform.transform_act_fn": False,
                     "cls.predictions.transform.dense": True}


def test_disable_removes_every_hook_and_the_wrapped_forwards():
    model = tiny_llama(layers=2)
    norm = model.model.norm
    hooks_before = (len(model._forward_pre_hooks), len(model._forward_hooks), len(norm._forward_hooks))
    hf_ckpt.enable(model, plan=_plan(model, "full", ("model.norm",)))
    assert "forward" in vars(norm)
    hf_ckpt.disable(model)
    assert "forward" not in vars(norm)
    assert (len(model._forward_pre_hooks), len(model._forward_hooks), len(norm._forward_hooks)) == hooks_before


def test_a_name_that_is_not_a_module_between_the_blocks_is_refused_and_nothing_changes():
    model = tiny_llama(layers=2)
    with pytest.raises(ValueError, match=r"^plan outside_blocks names 'model\.nope', which is not a module of "
                                         r"LlamaForCausalLM; make the plan on the same architecture$"):
        hf_ckpt.enable(model, plan=_plan(model, "full", ("model.nope",)))
    assert hf_ckpt.checkpointed_layers(model) == [] and "forward" not in vars(model.model.norm)
    for name in ("model.layers.0.input_layernorm", "model"):  # inside a block; holding the blocks
        with pytest.raises(ValueError) as error:
            hf_ckpt.enable(model, plan=_plan(model, "full", (name,)))
        assert str(error.value) == (f"plan outside_blocks names {name!r}, which is a block, inside one or holds one; "
                                    "it must be a module between the blocks")
    bert = tiny_bert(layers=2)
    with pytest.raises(ValueError) as error:
        hf_ckpt.enable(bert, plan=_plan(bert, "full", ("bert.embeddings", "bert.embeddings.LayerNorm")))
    assert str(error.value) == (
        "plan outside_blocks names 'bert.embeddings.LayerNorm' and 'bert.embeddings', which holds it; name only "
        "'bert.embeddings' (recomputing it recomputes 'bert.embeddings.LayerNorm' too)")
    assert hf_ckpt.checkpointed_layers(bert) == [] and "forward" not in vars(bert.bert.embeddings)
    with pytest.raises(ValueError, match=r"^outside_blocks must hold module names \(non-empty strings, e\.g\. "
                                         r"'model\.norm'\); got ''$"):
        hf_ckpt.CheckpointPlan(("full",), outside_blocks=("",))


def test_an_input_changed_in_place_after_the_call_makes_backward_raise():
    model, batch = tiny_llama(layers=2), _batch()
    hf_ckpt.enable(model, plan=_plan(model, "none", ("model.norm",)))
    def change_input(module, args, output):
        with torch.no_grad():
            args[0].mul_(2)

    handle = model.model.norm.register_forward_hook(change_input)
    try:
        loss = model(**batch).loss
        with pytest.raises(RuntimeError, match=r"hf_ckpt: an input of model\.norm was modified in place after its "
                                               r"forward; its output cannot be recomputed in backward"):
            loss.backward()
    finally:
        handle.remove()
        hf_ckpt.disable(model)


def test_no_grad_forwards_run_as_without_it():
    model, batch = tiny_llama(layers=2), _batch()
    with torch.no_grad():
        expected = model(**batch).logits
    hf_ckpt.enable(model, plan=_plan(model, "full"))
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, expected)
    model.eval()
    assert torch.equal(model(**batch).logits.detach(), expected)
    hf_ckpt.disable(model)


def test_the_planner_recomputes_between_the_blocks_where_that_is_the_cheapest_saving_and_saves_it():
    model, batch = tiny_llama(layers=2), _batch()
    hf_ckpt.enable(model, plan=_plan(model, "none", ()))  # enabled, some releases keep a mask more (measured alike)
    none = measure_step(model, batch).retained_bytes
    hf_ckpt.disable(model)
    hidden_bytes = 2 * 64 * model.config.hidden_size * 4
    plan = hf_ckpt.plan(model, batch, none - hidden_bytes, strategies=("none", "full", "outside"))
    assert plan.strategies == ("none", "none") and "model.norm" in plan.outside_blocks
    assert hf_ckpt.CheckpointPlan.from_dict(plan.to_dict()).outside_blocks == plan.outside_blocks
    assert "recomputed between the blocks: " in str(plan)
    hf_ckpt.enable(model, plan=plan)
    assert measure_step(model, batch).retained_bytes <= none - hidden_bytes
    hf_ckpt.disable(model)
    assert hf_ckpt.plan(model, batch, 1.0, strategies=("none", "full", "outside")).outside_blocks == ()


def test_under_peft_an_adapted_head_keeps_no_norm_output_and_gradients_are_unchanged():
    peft = pytest.importorskip("peft")  # in the test extra: CI installs it
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False)
    model, batch = peft.get_peft_model(tiny_llama(layers=2), config), _batch()
    reference = train_step(model, batch)
    retained = {}
    for outside in ((), ("model.norm",)):
        hf_ckpt.enable(model, plan=_plan(model.get_base_model(), "none", outside))
        grads = train_step(model, batch)
        retained[outside] = measure_step(model, batch).retained_bytes
        hf_ckpt.disable(model)
        assert max_grad_diff(reference, grads) <= 1e-6
    # PEFT calls the inner forward directly; the adapter on the head would keep the norm's output
    assert retained[()] - retained[("model.norm",)] >= 2 * 64 * 32 * 4


def test_a_deep_copy_of_the_model_recomputes_on_its_own_and_gives_the_same_gradients():
    import copy

    model, batch = tiny_llama(layers=2), _batch()
    reference = train_step(model, batch)
    hf_ckpt.enable(model, plan=_plan(model, "full"))
    twin = copy.deepcopy(model)
    assert max_grad_diff(reference, train_step(twin, batch)) <= 1e-6
    assert max_grad_diff(reference, train_step(model, batch)) <= 1e-6


def test_an_embeddings_module_recomputed_whole_or_module_by_module_keeps_only_its_inputs():
    """BERT's embeddings add three lookups (the second sum in place), then norm and drop the sum. Recomputed whole
    (as cheap_modules chooses it), only the module's inputs are kept; recomputed module by module, the sum is not
    a module's output, but a sum of recomputed outputs: made again from them, not kept, at the same FLOPs."""
    from torch.multiprocessing.reductions import StorageWeakRef

    model, batch = tiny_bert(), _batch()
    assert "bert.embeddings" in cheap_modules(model, batch, find_blocks(model))
    sums = []
    model.bert.embeddings.LayerNorm.register_forward_hook(
        lambda m, args, out: sums.append(StorageWeakRef(args[0].untyped_storage())))
    modules = tuple(f"bert.embeddings.{name}" for name in
                    ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm", "dropout"))
    reference = train_step(model, batch)
    kept, flops = {}, {}
    for outside in ((), modules, ("bert.embeddings",)):
        hf_ckpt.enable(model, plan=_plan(model, "none", outside))
        model.train()
        loss = model(**batch).loss
        kept[outside] = not sums[-1].expired()
        loss.backward()
        flops[outside] = measure_step(model, batch).flops
        assert max_grad_diff(reference, train_step(model, batch)) <= 1e-6
        hf_ckpt.disable(model)
    assert kept == {(): True, modules: False, ("bert.embeddings",): False}
    assert flops[modules] == flops[("bert.embeddings",)]


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "position-embeddings-frozen"])
def test_the_sum_of_gpt2s_token_and_position_embeddings_is_made_again_where_both_are_recomputed(frozen):
    """GPT-2 adds its token and position embeddings outside any module and drops the sum: the dropout's checkpoint
    keeps the sum unless it is made again from the two lookups. A frozen operand leaves no trace of what it was
    (no autograd node): the sum is then kept, and the gradients are right either way."""
    from torch.multiprocessing.reductions import StorageWeakRef

    model, batch = tiny_gpt2(), _batch()
    model.transformer.wpe.weight.requires_grad_(not frozen)
    sums = []
    model.transformer.drop.register_forward_hook(
        lambda m, args, out: sums.append(StorageWeakRef(args[0].untyped_storage())))
    reference = train_step(model, batch)
    hf_ckpt.enable(model, plan=_plan(model, "none", ("transformer.drop", "transformer.wpe", "transformer.wte")))
    model.train()
    loss = model(**batch).loss
    kept = not sums[-1].expired()
    loss.backward()
    grads = train_step(model, batch)
    hf_ckpt.disable(model)
    assert kept == frozen
    assert max_grad_diff(reference, grads) <= 1e-6


def test_a_recomputed_dropout_keeps_one_rng_state():
    """The RNG state a recomputed dropout drew from makes its output again and replays its checkpoint's recompute:
    one state per call (torch's checkpoint would keep a copy of its own)."""
    from hf_ckpt.meters.memory import StorageTracker

    model, batch = tiny_gpt2(), _batch()  # blocks plain: no other RNG state is kept
    state_bytes = torch.get_rng_state().untyped_storage().nbytes()
    hf_ckpt.enable(model, plan=_plan(model, "none", ("transformer.drop",)))
    model.train()
    with StorageTracker() as tracker:
        loss = model(**batch).loss
    alive = [nbytes for ref, _, nbytes in tracker._tracked.values() if ref() is not None and nbytes == state_bytes]
    loss.backward()
    hf_ckpt.disable(model)
    assert alive == [state_bytes]
