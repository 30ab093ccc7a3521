"""``mlp_chunk_size``: every block's MLP and norms over the tokens in checkpointed chunks.

What users rely on: the loss and every gradient equal the unchunked step's (Llama, Qwen2, Mistral, GPT-2; every
block strategy; LoRA on the MLP); the MLP and the blocks' norms really run in chunks of at most N tokens (the final
norm whole); ``state_dict`` keys and module
names are unchanged; ``eval``/``no_grad``/``generate`` between steps give the outputs of the model without it;
``disable`` takes it off exactly; bad values and MLPs that are not position-wise are refused at the call, changing
nothing.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import hf_ckpt
from hf_ckpt.runtime import mlp_chunks
from helpers import VOCAB, max_grad_diff, tiny_llama, tiny_t5, train_step

CHUNK = 5  # does not divide the 2 x 8 tokens: the last chunk is short
_SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)


def _build(model_type: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    if model_type == "llama":
        return tiny_llama(layers=3)
    if model_type == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_SMALL))
    if model_type == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**_SMALL))
    if model_type == "gpt2":  # no dropout: a chunk draws its own dropout mask
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))
    raise AssertionError(model_type)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids.clone()}


class _ChunkSizes:
    """The tokens each MLP call saw, in training steps (its first child's input)."""

    def __init__(self, model: nn.Module) -> None:
        self.tokens: list[int] = []
        for mlp in mlp_chunks.mlps(model):
            first = next(iter(mlp.children()))
            first.register_forward_pre_hook(lambda module, args: self.tokens.append(args[0][..., 0].numel()))


@pytest.mark.parametrize("options", [{}, {"strategy": "selective"}, {"every_n_layers": 2}], ids=["full", "selective", "every_n"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral", "gpt2"])
def test_gradients_equal_the_unchunked_step_and_the_mlp_runs_in_chunks(model_type, options):
    model, batch = _build(model_type), _batch()
    hf_ckpt.enable(model, **options)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, mlp_chunk_size=CHUNK, **options)
    sizes = _ChunkSizes(model)
    chunked = train_step(model, batch)
    assert max_grad_diff(reference, chunked) < 1e-6
    assert sizes.tokens and max(sizes.tokens) == CHUNK and 1 in sizes.tokens  # 16 tokens = 5 + 5 + 5 + 1
    assert 16 not in sizes.tokens


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_the_blocks_norms_run_in_chunks_too_and_the_final_norm_whole(model_type, monkeypatch):
    """Each block's norms (RMSNorm, LayerNorm) see at most CHUNK tokens with grad on; the final norm, outside the
    blocks, sees the whole batch; gradients as unchunked."""
    model, batch = _build(model_type), _batch()
    block_norms = mlp_chunks.norms(model)
    assert len(block_norms) == 2 * 3
    final = model.model.norm if model_type == "llama" else model.transformer.ln_f
    seen: dict[int, list[int]] = {}
    kind = type(final)
    original = kind.forward

    def counted(self, hidden, *args, **kwargs):
        seen.setdefault(id(self), []).append(hidden[..., 0].numel())
        return original(self, hidden, *args, **kwargs)

    monkeypatch.setattr(kind, "forward", counted)
    reference = train_step(model, batch)
    seen.clear()
    hf_ckpt.enable(model, mlp_chunk_size=CHUNK)
    chunked = train_step(model, batch)
    assert max_grad_diff(reference, chunked) < 1e-6
    for norm in block_norms:
        assert max(seen[id(norm)]) == CHUNK and 1 in seen[id(norm)], seen[id(norm)]
    assert set(seen[id(final)]) == {16}


def test_names_and_state_dict_keys_are_unchanged_and_disable_takes_it_off():
    model = tiny_llama(layers=3)
    names, keys = [n for n, _ in model.named_modules()], list(model.state_dict())
    hooks = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]
    hf_ckpt.enable(model, mlp_chunk_size=CHUNK)
    assert [n for n, _ in model.named_modules()] == names and list(model.state_dict()) == keys
    assert all("forward" not in m.__dict__ for m in mlp_chunks.mlps(model))
    hf_ckpt.disable(model)
    assert [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()] == hooks
    sizes = _ChunkSizes(model)
    train_step(model, _batch())
    assert set(sizes.tokens) == {16}


def test_enabling_again_without_it_takes_it_off():
    model = tiny_llama(layers=3)
    hf_ckpt.enable(model, mlp_chunk_size=CHUNK)
    hf_ckpt.enable(model, every_n_layers=2)
    sizes = _ChunkSizes(model)
    train_step(model, _batch())
    assert set(sizes.tokens) == {16}


def test_eval_no_grad_and_generate_between_steps_are_as_without_it():
    model, batch = tiny_llama(layers=3), _batch()
    plain = tiny_llama(layers=3)
    hf_ckpt.enable(model, mlp_chunk_size=CHUNK)
    train_step(model, batch)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model.eval()(**batch).logits, plain.eval()(**batch).logits)
    generated = model.generate(batch["input_ids"][:1], max_new_tokens=4, do_sample=False)
    assert torch.equal(generated, plain.generate(batch["input_ids"][:1], max_new_tokens=4, do_sample=False))
    sizes = _ChunkSizes(model)
    train_step(model, batch)  # training again after them: chunked again
    assert max(sizes.tokens) == CHUNK


@pytest.mark.parametrize(("value", "shown"), [
    (0, "0 of type int"), (-4, "-4 of type int"), ("512", "'512' of type str"), (True, "True of type bool"),
    (2.0, "2.0 of type float"),
])
def test_bad_values_are_refused_at_the_call_changing_nothing(value, shown):
    model = tiny_llama(layers=3)
    hf_ckpt.enable(model, every_n_layers=2)
    with pytest.raises(ValueError) as raised:
        hf_ckpt.enable(model, mlp_chunk_size=value)
    assert str(raised.value) == (
        "mlp_chunk_size must be a positive int (tokens per chunk of each block's MLP) or None (no chunking); "
        f"got {shown}")
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]
    assert all(not m._forward_hooks for m in mlp_chunks.mlps(model) + mlp_chunks.norms(model))


def _mixtral() -> transformers.PreTrainedModel:
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(**_SMALL, num_local_experts=4))


def _rwkv() -> transformers.PreTrainedModel:
    return transformers.RwkvForCausalLM(transformers.RwkvConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64))


@pytest.mark.parametrize(("build", "message"), [
    (_mixtral, "mlp_chunk_size cannot apply to MixtralForCausalLM: the MLP of block 0 (model.layers.0.mlp: "
               "MixtralSparseMoeBlock) is not position-wise: it routes tokens to experts (MixtralSparseMoeBlock): a "
               "router's auxiliary loss and capacity depend on the whole sequence. Drop mlp_chunk_size."),
    (_rwkv, "mlp_chunk_size cannot apply to RwkvForCausalLM: the MLP of block 0 (rwkv.blocks.0.feed_forward: "
            "RwkvFeedForward) is not position-wise: it mixes positions along the sequence (time_shift: ZeroPad2d), "
            "so a chunk's output depends on the tokens of other chunks. Drop mlp_chunk_size."),
    (tiny_t5, "mlp_chunk_size cannot apply to T5ForConditionalGeneration: block 0 (encoder.block.0: T5Block) has "
              "no MLP child named mlp, feed_forward or ffn. Drop mlp_chunk_size."),
], ids=["moe", "shift", "no-mlp"])
def test_a_model_without_a_position_wise_mlp_is_refused_at_the_call_changing_nothing(build, message):
    model = build()
    if build is _mixtral and hasattr(model.model.layers[0], "block_sparse_moe"):  # its name before transformers 5
        message = ("mlp_chunk_size cannot apply to MixtralForCausalLM: block 0 (model.layers.0: MixtralDecoderLayer) "
                   "has no MLP child named mlp, feed_forward or ffn. Drop mlp_chunk_size.")
    hf_ckpt.enable(model, every_n_layers=2)
    before = hf_ckpt.checkpointed_layers(model)
    with pytest.raises(ValueError) as raised:
        hf_ckpt.enable(model, mlp_chunk_size=4)
    assert str(raised.value) == message
    assert hf_ckpt.checkpointed_layers(model) == before


def test_lora_on_the_mlp():
    peft = pytest.importorskip("peft")

    def build():
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"],
                                 lora_dropout=0.0, init_lora_weights=False)
        return peft.get_peft_model(tiny_llama(layers=3), config)

    batch = _batch()
    reference = build()
    hf_ckpt.enable(reference)
    expected = train_step(reference, batch)
    model = build()
    names = [n for n, _ in model.named_modules()]
    hf_ckpt.enable(model, mlp_chunk_size=CHUNK)
    assert [n for n, _ in model.named_modules()] == names
    chunked = train_step(model, batch)
    assert any("down_proj.lora_A" in name for name in chunked)
    assert max_grad_diff(expected, chunked) < 1e-6


def test_the_trainer_kwargs_dict_through_the_patch():
    model, batch = tiny_llama(layers=3), _batch()
    reference = train_step(model, batch)
    hf_ckpt.patch_transformers()
    try:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"mlp_chunk_size": 3})
    finally:
        hf_ckpt.unpatch_transformers()
    sizes = _ChunkSizes(model)
    assert max_grad_diff(reference, train_step(model, batch)) < 1e-6
    assert max(sizes.tokens) == 3


def test_the_mixin_names_it_in_the_dict_too():
    from hf_ckpt.runtime.config import HF_CKPT_KEYS

    assert "mlp_chunk_size" in HF_CKPT_KEYS


def test_the_bench_setting():
    from hf_ckpt.measure import parse_setting

    setting = parse_setting("mlp:3")
    model, batch = tiny_llama(layers=3), _batch()
    setting.apply(model)
    sizes = _ChunkSizes(model)
    train_step(model, batch)
    assert setting.name == "mlp:3" and max(sizes.tokens) == 3
    setting.remove(model)
    sizes.tokens.clear()
    train_step(model, batch)
    assert set(sizes.tokens) == {16}
    for bad in ("mlp", "mlp:0", "mlp:x"):
        with pytest.raises(ValueError) as raised:
            parse_setting(bad)
        assert str(raised.value) == (
            f"mlp needs a positive int, the tokens per chunk (mlp:4096); got mlp:{bad.partition(':')[2]}")
