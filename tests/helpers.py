"""Tiny models and one-step helpers shared by the core tests. No downloads: every model is built from a config."""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.modeling_outputs import CausalLMOutput

from hf_ckpt.runtime.counting import BlockRunCounter

VOCAB = 64
SEQ = 8
BATCH = 2


def tiny_llama(layers: int = 4, cls: type = LlamaForCausalLM) -> PreTrainedModel:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return cls(config)


def tiny_gpt2(layers: int = 4, cls: type = GPT2LMHeadModel) -> PreTrainedModel:
    """GPT-2 with dropout 0.1 everywhere: the recompute must replay the RNG."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=64,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    )
    return cls(config)


def tiny_bert(layers: int = 4, cls: type = BertForMaskedLM) -> PreTrainedModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )
    return cls(config)


def tiny_t5(layers: int = 2, cls: type = T5ForConditionalGeneration) -> PreTrainedModel:
    """T5 with ``layers`` encoder blocks and ``layers`` decoder blocks, dropout 0.1."""
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=layers, num_decoder_layers=layers,
        num_heads=4, dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0,
    )
    return cls(config)


MODEL_BUILDERS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "bert": tiny_bert, "t5": tiny_t5}


class TokenRows(torch.utils.data.Dataset):
    """``rows`` rows of ``seq`` random token ids (seeded by their index) below ``vocab``, their labels the ids: a
    ``Trainer`` dataset for the tiny models."""

    def __init__(self, vocab: int = 64, seq: int = 16, rows: int = 8) -> None:
        self.vocab, self.seq, self.rows = vocab, seq, rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def batch_for(model: nn.Module) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=generator)
    return {"input_ids": input_ids, "labels": input_ids.clone()}


def train_step(model: nn.Module, batch: dict[str, torch.Tensor], seed: int = 123) -> dict[str, torch.Tensor]:
    """One forward/backward in training mode from a fixed RNG state; returns the gradients by parameter name."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(**batch).loss
    loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def max_grad_diff(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> float:
    assert reference.keys() == other.keys(), sorted(set(reference) ^ set(other))
    return max((reference[name] - other[name]).abs().max().item() for name in reference)


def recomputed_in_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[list[int], dict[str, torch.Tensor]]:
    """Run one step, counting block runs; returns (recomputed block indices, gradients)."""
    with BlockRunCounter(model) as runs:
        grads = train_step(model, batch)
    assert all(runs.counts[b.index] >= 1 for b in runs.blocks), dict(runs.counts)
    return runs.recomputed(), grads


# --- remote-code style models with the legacy `_set_gradient_checkpointing(module, value)` signature -------------


class LegacyConfig(PretrainedConfig):
    model_type = "hf-ckpt-legacy-test"

    def __init__(self, vocab_size: int = VOCAB, hidden_size: int = 16, num_layers: int = 4, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        super().__init__(**kwargs)


class LegacyBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.dropout(self.down(torch.tanh(self.up(self.norm(hidden_states)))))


class _LegacyBase(PreTrainedModel):
    config_class = LegacyConfig
    supports_gradient_checkpointing = True

    def __init__(self, config: LegacyConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LegacyBlock(config.hidden_size) for _ in range(config.num_layers))
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.gradient_checkpointing = False
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        pass

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def _set_gradient_checkpointing(self, module, value=False):
        if isinstance(module, _LegacyBase):
            module.gradient_checkpointing = value

    def _run_layer(self, layer: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _body(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._run_layer(layer, hidden_states)
            else:
                hidden_states = layer(hidden_states)
        return hidden_states

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> CausalLMOutput:
        logits = self.head(self._body(self.embed(input_ids)))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        return CausalLMOutput(loss=loss, logits=logits)


class LegacyFuncModel(_LegacyBase):
    """Legacy signature; the loop calls ``self._gradient_checkpointing_func(layer.__call__, ...)``."""

    def _run_layer(self, layer, hidden_states):
        return self._gradient_checkpointing_func(layer.__call__, hidden_states)


class LegacyDirectModel(_LegacyBase):
    """Legacy signature; the loop calls ``torch.utils.checkpoint`` itself, so hf_ckpt cannot steer it."""

    def _run_layer(self, layer, hidden_states):
        return torch.utils.checkpoint.checkpoint(layer, hidden_states, use_reentrant=False)


def tiny_legacy(cls: type = LegacyFuncModel, layers: int = 4) -> PreTrainedModel:
    torch.manual_seed(0)
    return cls(LegacyConfig(num_layers=layers))


# --- adversarial stack-flag models: what their code does with the checkpoint function is only known by measuring ---


class _ToyStack(_LegacyBase):
    """New-style ``_set_gradient_checkpointing`` (inherited from ``PreTrainedModel``); subclasses choose the loop."""

    _set_gradient_checkpointing = PreTrainedModel._set_gradient_checkpointing


class PartialStackModel(_ToyStack):
    """Hands its checkpoint function ``partial(self._apply, i)``: the block cannot be told from the function."""

    def _apply(self, index: int, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layers[index](hidden_states)

    def _run_layer(self, layer, hidden_states):
        import functools

        index = list(self.layers).index(layer)
        return self._gradient_checkpointing_func(functools.partial(self._apply, index), hidden_states)


class LambdaStackModel(_ToyStack):
    """Hands its checkpoint function a lambda closing over the stack and an index."""

    def _run_layer(self, layer, hidden_states):
        index = list(self.layers).index(layer)
        return self._gradient_checkpointing_func(lambda h: self.layers[index](h), hidden_states)


class ArgumentStackModel(_ToyStack):
    """Hands its checkpoint function a nested function and the block as its first argument (IDEFICS's ``vblock``)."""

    def _run_layer(self, layer, hidden_states):
        def run(block, states):
            return block(states)

        return self._gradient_checkpointing_func(run, layer, hidden_states)


class DirectStackModel(_ToyStack):
    """Calls ``torch.utils.checkpoint`` itself: every block is recomputed whatever the selection."""

    def _run_layer(self, layer, hidden_states):
        return torch.utils.checkpoint.checkpoint(layer, hidden_states, use_reentrant=False)


class InertStackModel(_ToyStack):
    """Has the flag but never checkpoints (as a few upstream releases had by mistake): no method of it names a
    checkpoint function, so hf_ckpt wraps its blocks (``hf_ckpt.runtime.stacks.direct``)."""

    def _run_layer(self, layer, hidden_states):
        return layer(hidden_states)


class DeclaredOnlyModel(_LegacyBase):
    """Declares ``supports_gradient_checkpointing`` and has no flag anywhere, its loop calls its blocks directly
    (Gemma 3n's audio encoder, PP-LCNetV4): hf_ckpt gives it the flag and wraps the blocks."""

    _set_gradient_checkpointing = PreTrainedModel._set_gradient_checkpointing

    def __init__(self, config: LegacyConfig):
        super().__init__(config)
        del self.gradient_checkpointing

    def _body(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return hidden_states


class _CheckpointingLoop(nn.Module):
    """A nested encoder whose own loop checkpoints its blocks (SEW-D's DeBERTa-style encoder, Fuyu's Persimmon)."""

    def __init__(self, hidden: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(LegacyBlock(hidden) for _ in range(layers))
        self.gradient_checkpointing = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(layer.__call__, hidden_states)
            else:
                hidden_states = layer(hidden_states)
        return hidden_states


class NestedLoopModel(_ToyStack):
    """The flag on the top model too, the loop in a nested module: the top's code never names a checkpoint
    function, its nested encoder's does, so its blocks are checkpointed by that loop, never wrapped."""

    def __init__(self, config: LegacyConfig):
        super().__init__(config)
        del self.layers
        self.encoder = _CheckpointingLoop(config.hidden_size, config.num_layers)

    def _body(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.encoder(hidden_states)


class DormantStackModel(_ToyStack):
    """Names its checkpoint function in a branch that never runs: hf_ckpt cannot tell it apart from a working
    loop, leaves it alone, and the first-step probe measures that nothing was recomputed."""

    never = False

    def _run_layer(self, layer, hidden_states):
        if self.never:
            return self._gradient_checkpointing_func(layer.__call__, hidden_states)
        return layer(hidden_states)


class FuncStackModel(_ToyStack):
    """The well-behaved loop: ``self._gradient_checkpointing_func(layer.__call__, ...)``."""

    def _run_layer(self, layer, hidden_states):
        return self._gradient_checkpointing_func(layer.__call__, hidden_states)
