"""hf_ckpt's checkpointing in your own ``PreTrainedModel``, with ``GradientCheckpointingMixin``.

A minimal model of one's own, written the way transformers models are: a config class, a stack of blocks whose
loop calls ``self._gradient_checkpointing_func`` when ``self.gradient_checkpointing`` is on, and
``supports_gradient_checkpointing = True``. Putting ``GradientCheckpointingMixin`` first among the bases gives
the model's ``gradient_checkpointing_enable`` (``activation_checkpointing_enable`` on transformers >= 5.23)
``every_n_layers``, ``offload`` and checked checkpoint kwargs, on every supported release.

Runs on a CPU in seconds:

    python examples/custom_model.py
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

import hf_ckpt
from hf_ckpt.runtime.counting import BlockRunCounter


class TinyLMConfig(PretrainedConfig):
    model_type = "tiny-lm-example"

    def __init__(self, vocab_size: int = 128, hidden_size: int = 64, num_layers: int = 6, dropout: float = 0.1, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        super().__init__(**kwargs)


class TinyBlock(nn.Module):
    """Pre-norm MLP block with a residual connection and dropout."""

    def __init__(self, config: TinyLMConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size)
        self.up = nn.Linear(config.hidden_size, 4 * config.hidden_size)
        self.down = nn.Linear(4 * config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.dropout(self.down(nn.functional.gelu(self.up(self.norm(hidden_states)))))


class TinyLM(hf_ckpt.GradientCheckpointingMixin, PreTrainedModel):
    config_class = TinyLMConfig
    supports_gradient_checkpointing = True

    def __init__(self, config: TinyLMConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TinyBlock(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.gradient_checkpointing = False  # the flag hf_ckpt (and transformers) switch on
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> CausalLMOutput:
        hidden_states = self.embed(input_ids)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                # hf_ckpt binds a function here that recomputes only the selected blocks (every_n_layers)
                hidden_states = self._gradient_checkpointing_func(layer.__call__, hidden_states)
            else:
                hidden_states = layer(hidden_states)
        logits = self.head(self.norm(hidden_states))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutput(loss=loss, logits=logits)


def main() -> None:
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig())
    ids = torch.randint(0, model.config.vocab_size, (8, 32), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}

    # The mixin's method takes every_n_layers as an argument or in the kwargs dict, like the Trainer passes it.
    # transformers >= 5.23 names it activation_checkpointing_enable (the old name warns, then does the same).
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"every_n_layers": 2})
    print("checkpointed blocks (flags):  ", hf_ckpt.checkpointed_layers(model))

    report = hf_ckpt.verify(model, batch)  # gradients exact, dropout replayed, the right blocks recomputed
    print(report)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step in range(3):
        with BlockRunCounter(model) as runs:
            loss = model(**batch).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}, recomputed blocks (measured) {runs.recomputed()}")


if __name__ == "__main__":
    main()
