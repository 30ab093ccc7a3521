"""``head_chunk_size``: a causal LM's output projection and loss in checkpointed chunks.

What users rely on: the loss and every gradient equal the unchunked step's (label shift, ``ignore_index``,
``num_items_in_batch``, tied embeddings, MoE router loss, LoRA on the head, the Trainer's gradient accumulation);
the full logits are never made in training; without labels, in eval or under ``no_grad`` the outputs are as before;
bad values and unsupported models are refused at the call, changing nothing; ``disable`` restores the model.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import pytest
import torch
from transformers import GPT2DoubleHeadsModel, PreTrainedModel, Trainer

import arch_zoo
import hf_ckpt
from hf_ckpt.runtime import head as _head
from helpers import VOCAB, tiny_gpt2, tiny_llama
from test_patch import _Tokens, _training_args

#: The causal LMs of the default suite's architecture sample, and the tied-embedding and Qwen2 decoders.
CAUSAL_LMS = ("llama", "gpt2", "qwen2", "mixtral", "mamba")
CHUNK = 5  # does not divide the 2 x 8 tokens: the last chunk is short
NO_LOGITS = ("head_chunk_size={size}: {model}'s training forward with labels returns no logits (the chunked head "
             "computes the loss over chunks of tokens without making the full logits). Code that reads the logits of "
             "a training step (a custom compute_loss, metrics on the logits) needs them: drop head_chunk_size for it")
NO_LABELS = ("head_chunk_size={size} does not take effect in a training forward without labels: {model} computes the "
             "full logits, for a loss computed outside the model (the Trainer's label_smoothing_factor or "
             "compute_loss_func take the labels out). Give the model its labels, or drop head_chunk_size")
#: transformers 4.45 has no ``PreTrainedModel.loss_function``: every causal LM computes its loss inline there.
HAS_LOSS_FUNCTION = isinstance(getattr(PreTrainedModel, "loss_function", None), property)
needs_loss_function = pytest.mark.skipif(not HAS_LOSS_FUNCTION, reason="no PreTrainedModel.loss_function")


def _arch(model_type: str) -> arch_zoo.Architecture:
    found = arch_zoo.architectures({model_type: arch_zoo.CAUSAL_LM})
    if not found:
        pytest.skip(f"{model_type} is not a causal LM of this transformers release")
    return found[0]


def _built(arch: arch_zoo.Architecture):
    model = arch_zoo.build(arch)
    if "self.loss_function" not in inspect.getsource(type(model).forward):
        pytest.skip(f"{type(model).__name__} of this release computes its loss inline (refused)")
    return model


def _inputs(arch: arch_zoo.Architecture, num_items: bool) -> dict:
    inputs = arch_zoo.batch(arch)
    inputs["labels"][0, :3] = -100  # ignored positions
    inputs["labels"][1, 5] = -100
    if num_items:  # as the Trainer passes it under gradient accumulation: more items than this batch holds
        inputs["num_items_in_batch"] = torch.tensor(int((inputs["labels"][:, 1:] != -100).sum()) + 7)
    if arch.model_type == "mixtral":
        inputs["output_router_logits"] = True  # the router's auxiliary loss joins the loss
    return inputs


def _step(model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    grads = arch_zoo.gradients(model, inputs)
    return model(**inputs, use_cache=False).loss.detach(), grads


def _assert_same(reference, chunked, rtol=1e-5, atol=1e-7):
    (loss, grads), (chunked_loss, chunked_grads) = reference, chunked
    assert torch.allclose(chunked_loss, loss, rtol=rtol, atol=atol), (float(chunked_loss), float(loss))
    assert sorted(chunked_grads) == sorted(grads)
    worst = {name: float((chunked_grads[name] - g).abs().max()) for name, g in grads.items()
             if not torch.allclose(chunked_grads[name], g, rtol=rtol, atol=atol)}
    assert worst == {}


class _HeadCalls:
    """The number of tokens each call of the model's output projection was given."""

    def __init__(self, model):
        self.tokens: list[int] = []
        self.handle = model.get_output_embeddings().register_forward_hook(
            lambda module, args, output: self.tokens.append(args[0].numel() // args[0].shape[-1]))


@needs_loss_function
@pytest.mark.parametrize("num_items", [True, False], ids=["num_items_in_batch", "mean"])
@pytest.mark.parametrize("model_type", CAUSAL_LMS)
def test_loss_and_gradients_equal_the_unchunked_step(model_type, num_items):
    arch = _arch(model_type)
    model, inputs = _built(arch), _inputs(arch, num_items)
    reference = _step(model, inputs)
    hf_ckpt.enable(model, head_chunk_size=CHUNK)
    calls = _HeadCalls(model)
    chunked = _step(model, inputs)
    _assert_same(reference, chunked)
    # 4 chunks (5+5+5+1 tokens) in the model's forward, then its own call of the head, empty; recomputed in backward
    assert calls.tokens[:5] == [5, 5, 5, 1, 0] and sorted(calls.tokens[5:9]) == [1, 5, 5, 5], calls.tokens


#: Compared in float64: their recurrence amplifies float32 rounding, which the chunked head's smaller matmuls round
#: differently with several threads (RWKV's embedding gradient: 1.7e-4 apart with two threads, equal with one).
_AMPLIFY_ROUNDING = {"rwkv"}


@needs_loss_function
@pytest.mark.parametrize("model_type", [t for t, task in arch_zoo.COMMON.items()
                                        if task == arch_zoo.CAUSAL_LM and t not in CAUSAL_LMS])
def test_every_common_causal_lm_is_exact_or_refused_at_the_call(model_type):
    """Every causal LM of the suite's common architectures: the chunked step's loss and gradients equal the
    unchunked step's, or ``enable`` refuses the setting, naming why, and changes nothing."""
    arch = _arch(model_type)
    model, inputs = arch_zoo.build(arch), _inputs(arch, True)
    if model_type in _AMPLIFY_ROUNDING:
        model = model.double()
    reference = _step(model, inputs)
    reason = _head.refusal(model)
    if reason is not None:
        with pytest.raises(ValueError) as raised:
            hf_ckpt.enable(model, head_chunk_size=CHUNK)
        assert str(raised.value) == f"head_chunk_size cannot apply to {type(model).__name__}: {reason}. " \
                                    "Drop head_chunk_size."
        assert "forward" not in model.__dict__ and hf_ckpt.checkpointed_layers(model) == []
        return
    hf_ckpt.enable(model, head_chunk_size=CHUNK)
    _assert_same(reference, _step(model, inputs))


@needs_loss_function
@pytest.mark.parametrize("model_type", ("llama", "gpt2"))
def test_float64_equal_to_rounding(model_type):
    """In float64 the blocks and the head add no rounding of their own; the loss function computes in float32
    (``ForCausalLMLoss`` upcasts with ``logits.float()``, which casts float64 down), so a float32 tolerance holds,
    and a tenth of the float32 test's."""
    arch = _arch(model_type)
    model, inputs = _built(arch).double(), _inputs(arch, True)
    reference = _step(model, inputs)
    hf_ckpt.enable(model, head_chunk_size=3)
    _assert_same(reference, _step(model, inputs), rtol=1e-6, atol=1e-8)


@needs_loss_function
def test_training_returns_no_logits_and_other_calls_return_them_as_before():
    model = tiny_llama()
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    before = {"train": model(input_ids=ids).logits, "eval": model.eval()(input_ids=ids, labels=ids)}
    model.train()
    hf_ckpt.enable(model, head_chunk_size=4)
    chunked = model(input_ids=ids, labels=ids)
    with pytest.raises(AttributeError) as raised:
        chunked.logits
    assert str(raised.value) == NO_LOGITS.format(size=4, model="LlamaForCausalLM")
    with pytest.raises(KeyError):
        chunked["logits"]
    assert chunked.get("logits") is None and "logits" not in chunked.keys() and chunked.loss.ndim == 0
    with pytest.warns(hf_ckpt.HfCkptWarning) as caught:  # no labels: full logits, and one warning that says so
        assert torch.equal(model(input_ids=ids).logits, before["train"])
        model(input_ids=ids)
    assert [str(w.message) for w in caught] == [NO_LABELS.format(size=4, model="LlamaForCausalLM")]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, labels=ids).logits, before["train"])
    evaluated = model.eval()(input_ids=ids, labels=ids)
    assert torch.equal(evaluated.logits, before["eval"].logits) and torch.equal(evaluated.loss, before["eval"].loss)
    generated = model.generate(ids[:1, :4], max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, 7)


@needs_loss_function
def test_labels_given_by_position_warn_once_and_run_unchunked():
    """The chunked head reads ``labels`` by keyword; labels given by position are not silently left unchunked."""
    model = tiny_llama()
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    position = list(inspect.signature(model.forward).parameters).index("labels")
    arguments = [ids] + [None] * (position - 1) + [ids]
    reference = model(*arguments)
    hf_ckpt.enable(model, head_chunk_size=4)
    with pytest.warns(hf_ckpt.HfCkptWarning) as caught:
        output = model(*arguments)
        model(*arguments)
    assert [str(w.message) for w in caught] == [
        "head_chunk_size=4 does not take effect: LlamaForCausalLM was given its labels by position, and the chunked "
        "head reads them by keyword (labels=...); this step computes the full logits"]
    assert torch.equal(output.logits, reference.logits) and torch.equal(output.loss, reference.loss)


def _wrap_forward(model, tag, seen):
    """A wrapper of the instance's ``forward``, as accelerate's mixed precision and TRL put one on."""
    inner = model.forward

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        seen.append(tag)
        return inner(*args, **kwargs)

    model.forward = wrapper
    return wrapper


@needs_loss_function
def test_wrappers_of_forward_are_composed_never_replaced():
    """hf_ckpt assigns and deletes no ``forward``: a wrapper put on before ``enable`` and one put on after it both
    run with the chunked head, and both are where they were after ``disable`` and after enabling again."""
    model, seen = tiny_llama(), []
    ids = torch.randint(0, VOCAB, (2, 8))
    first = _wrap_forward(model, "before", seen)
    hf_ckpt.enable(model, head_chunk_size=4)
    assert model.__dict__["forward"] is first
    second = _wrap_forward(model, "after", seen)
    assert model(input_ids=ids, labels=ids).get("logits") is None and seen == ["after", "before"]
    hf_ckpt.disable(model)
    assert model.__dict__["forward"] is second
    hf_ckpt.enable(model, head_chunk_size=4)
    hf_ckpt.enable(model, every_n_layers=2)
    assert model.__dict__["forward"] is second
    assert model(input_ids=ids, labels=ids).logits.shape == (2, 8, VOCAB)
    assert seen == ["after", "before"] * 2


@needs_loss_function
def test_enabling_again_without_it_unwraps():
    model = tiny_llama()
    hf_ckpt.enable(model, head_chunk_size=4)
    hf_ckpt.enable(model, every_n_layers=2)
    ids = torch.randint(0, VOCAB, (2, 8))
    assert "forward" not in model.__dict__
    assert model(input_ids=ids, labels=ids).logits is not None


@pytest.mark.parametrize(("value", "error", "shown"), [
    (0, ValueError, "0"), (-4, ValueError, "-4"), ("512", TypeError, "'512' of type str"),
    (True, TypeError, "True of type bool"), (2.0, TypeError, "2.0 of type float"),
])
def test_bad_values_are_refused_at_the_call_changing_nothing(value, error, shown):
    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=2)
    with pytest.raises(error) as raised:
        hf_ckpt.enable(model, head_chunk_size=value)
    assert str(raised.value) == (
        "head_chunk_size must be a positive int (tokens per chunk of the output projection and loss) or None "
        f"(no chunking); got {shown}")
    assert hf_ckpt.checkpointed_layers(model) == [0, 2] and "forward" not in model.__dict__


@needs_loss_function
def test_a_model_that_changes_its_logits_is_refused_at_the_call_changing_nothing():
    arch = _arch("gemma2")
    model = arch_zoo.build(arch)
    hf_ckpt.enable(model, every_n_layers=2)
    with pytest.raises(ValueError) as raised:
        hf_ckpt.enable(model, head_chunk_size=4)
    assert str(raised.value) == (
        "head_chunk_size cannot apply to Gemma2ForCausalLM: its forward does not hand the output of self.lm_head to "
        "its loss unchanged (logit soft-capping or scaling), so the chunked head would compute a different loss. "
        "Drop head_chunk_size.")
    assert hf_ckpt.checkpointed_layers(model) == [0, 2] and "forward" not in model.__dict__


@needs_loss_function
def test_a_model_computing_its_loss_its_own_way_is_refused():
    model = tiny_gpt2(cls=GPT2DoubleHeadsModel)  # lm_head, but CrossEntropyLoss called in its forward
    with pytest.raises(ValueError) as raised:
        hf_ckpt.enable(model, head_chunk_size=4)
    assert str(raised.value) == (
        "head_chunk_size cannot apply to GPT2DoubleHeadsModel: its forward does not compute its loss with "
        "self.loss_function (it computes it its own way). Drop head_chunk_size.")


def test_a_model_without_its_own_output_projection_is_refused():
    model = arch_zoo.build(arch_zoo.architectures({"bert": arch_zoo.MASKED_LM})[0])  # cls.predictions.decoder
    with pytest.raises(ValueError) as raised:
        hf_ckpt.enable(model, head_chunk_size=4)
    assert str(raised.value) == (
        "head_chunk_size cannot apply to BertForMaskedLM: it has no output projection of its own "
        "(get_output_embeddings() is not one of its submodules). Drop head_chunk_size.")


@pytest.mark.skipif(HAS_LOSS_FUNCTION, reason="this release has PreTrainedModel.loss_function")
def test_a_release_without_loss_function_refuses_at_the_call():
    with pytest.raises(ValueError) as raised:
        hf_ckpt.enable(tiny_llama(), head_chunk_size=4)
    assert str(raised.value) == (
        "head_chunk_size cannot apply to LlamaForCausalLM: it computes its loss its own way (this transformers "
        "release has no PreTrainedModel.loss_function). Drop head_chunk_size.")


@needs_loss_function
def test_lora_on_the_head():
    peft = pytest.importorskip("peft")
    arch = _arch("llama")

    def build():
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head", "q_proj"], lora_dropout=0.0,
                                 init_lora_weights=False)
        return peft.get_peft_model(_built(arch), config)

    inputs = _inputs(arch, True)
    reference = _step(build(), inputs)
    model = build()
    hf_ckpt.enable(model, head_chunk_size=CHUNK)
    chunked = _step(model, inputs)
    assert any("lm_head.lora_A" in name for name in chunked[1])
    _assert_same(reference, chunked)


class _Masked(_Tokens):
    """Rows with a different number of ignored labels each: gradient accumulation must weigh them by
    ``num_items_in_batch``, not per micro-batch."""

    def __getitem__(self, i):
        row = super().__getitem__(i)
        labels = row["labels"].clone()
        labels[: i % 5] = -100
        return {**row, "labels": labels}


def _trained(tmp_path, kwargs: dict | None) -> tuple[dict[str, torch.Tensor], list[int]]:
    model = tiny_llama()
    calls = _HeadCalls(model)
    options = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": kwargs} if kwargs else {}
    args = _training_args(tmp_path, gradient_accumulation_steps=2, optim="sgd", **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(model=model, args=args, train_dataset=_Masked()).train()
    return {name: p.detach().clone() for name, p in model.named_parameters()}, calls.tokens


@needs_loss_function
def test_the_trainer_through_the_patch(tmp_path):
    hf_ckpt.patch_transformers()
    try:
        reference, _ = _trained(tmp_path, None)
        chunked, tokens = _trained(tmp_path, {"head_chunk_size": 3, "use_reentrant": False})
    finally:
        hf_ckpt.unpatch_transformers()
    assert max(tokens) == 3 and 0 in tokens  # the head ran in chunks of 3 tokens (16 = 3 * 5 + 1)
    assert reference.keys() == chunked.keys()
    assert [n for n in reference if not torch.allclose(reference[n], chunked[n], rtol=1e-5, atol=1e-7)] == []


@needs_loss_function
def test_the_bench_setting():
    from hf_ckpt.measure import parse_setting

    setting = parse_setting("head:4")
    model = tiny_llama()
    ids = torch.randint(0, VOCAB, (2, 8))
    setting.apply(model)
    assert setting.name == "head:4" and model(input_ids=ids, labels=ids).get("logits") is None
    setting.remove(model)
    assert model(input_ids=ids, labels=ids).logits is not None
    for bad in ("head", "head:0", "head:x"):
        with pytest.raises(ValueError) as raised:
            parse_setting(bad)
        assert str(raised.value) == (
            f"head needs a positive int, the tokens per chunk (head:512); got head:{bad.partition(':')[2]}")


@needs_loss_function
def test_a_forward_replaced_by_trls_fused_head_is_refused_by_name(tmp_path):
    """TRL's trainers put their fused LM head on the model's ``forward`` (``trl/trainer/utils.py``'s
    ``_fused_forward``, under accelerate's wrappers): refused at the call, or at the first training forward where it
    came after ``enable``; recognised from the code object, which ``functools.wraps`` leaves alone. (The clients
    environment runs TRL's own trainers: tests/clients/test_trl.py.)"""
    source = tmp_path / "trl" / "trainer" / "utils.py"
    source.parent.mkdir(parents=True)
    source.write_text("def _fused_forward(self, *args, labels=None, **kwargs):\n    return labels[:, 1:]\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    refused = ("head_chunk_size cannot apply to LlamaForCausalLM: TRL's trainers (SFTTrainer, DPOTrainer, GRPOTrainer) "
               "replace its forward with their fused LM head, which computes the per-token log-probabilities in "
               "chunks without the full logits, as head_chunk_size would: TRL's fused head already saves that "
               "memory. Drop head_chunk_size.")
    ids = torch.randint(0, VOCAB, (2, 8))
    model = tiny_llama()
    hf_ckpt.enable(model, head_chunk_size=4)
    fused = functools.wraps(type(model).forward)(namespace["_fused_forward"])
    model.forward = functools.partial(functools.wraps(fused)(lambda *a, **k: fused(*a, **k)), model)  # wrapped again
    with pytest.raises(ValueError) as raised:
        model(input_ids=ids, labels=ids)
    assert str(raised.value) == refused
    with pytest.raises(ValueError) as raised:
        hf_ckpt.enable(model, head_chunk_size=4)
    assert str(raised.value) == refused
