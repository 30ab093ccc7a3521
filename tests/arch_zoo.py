"""Tiny models of every common text architecture the installed transformers provides, built from configs.

The sweep in ``test_architectures.py`` asks this module four things:

* :func:`architectures` — which architectures the installed release has, found by capability: the model type is
  registered for its task in ``transformers.models.auto``, the model class exists and declares
  ``supports_gradient_checkpointing``. Nothing here reads a version string.
* :func:`build` — a tiny, fp32, randomly initialised instance (hidden 32, 4 heads, vocab 128, 4 blocks or
  2 encoder + 2 decoder blocks, dropout off), the same weights for the same seed.
* :func:`batch` — a small batch (2 sequences of 8 tokens) with labels, so that ``model(**batch).loss`` exists.
* :func:`gradients` — one training step's gradients, with the RNG seeded so that any dropout a config keeps
  draws the same masks in every run.

The tiny config is derived generically: every size-like attribute the architecture's config has is shrunk, every
dropout it has is set to 0, special token ids are moved inside the small vocabulary. ``OVERRIDES`` holds the
few per-architecture settings the generic recipe cannot guess; each carries the reason.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from arch_tiny import uninitialized_memory_is_nan

CAUSAL_LM = "causal-lm"
MASKED_LM = "masked-lm"
SEQ2SEQ = "seq2seq"

BATCH_SIZE = 2
SEQUENCE_LENGTH = 8
VOCAB_SIZE = 128
BLOCKS = 4  # decoder-only and encoder-only; encoder-decoder models get BLOCKS // 2 of each
MAX_PARAMETERS = 1_000_000

#: The auto-mapping holding each task's model classes, by model type.
TASK_MAPPINGS = {
    CAUSAL_LM: "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    MASKED_LM: "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    SEQ2SEQ: "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
}

#: The common architectures the sweep covers wherever the installed release provides them: model type -> task.
COMMON: dict[str, str] = {
    # decoder-only transformers
    **dict.fromkeys(
        ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "falcon", "gpt2",
         "gpt_neox", "gptj", "gpt_neo", "gpt_bigcode", "opt", "bloom", "stablelm", "starcoder2", "olmo", "olmo2",
         "cohere", "cohere2", "granite", "glm", "smollm3", "codegen", "mpt", "xglm", "nemotron", "llama4_text"],
        CAUSAL_LM,
    ),
    # mixture-of-experts decoders
    **dict.fromkeys(["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "gpt_oss"], CAUSAL_LM),
    # state-space and recurrent decoders
    **dict.fromkeys(["mamba", "falcon_mamba", "rwkv", "recurrent_gemma"], CAUSAL_LM),
    # encoder-only (masked LM)
    **dict.fromkeys(
        ["bert", "roberta", "deberta", "deberta-v2", "electra", "xlm-roberta", "modernbert", "distilbert", "big_bird"],
        MASKED_LM,
    ),
    # encoder-decoder
    **dict.fromkeys(
        ["t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus", "marian", "led", "nllb-moe"],
        SEQ2SEQ,
    ),
}

#: Per-architecture config settings on top of the generic tiny recipe, with why each is needed.
OVERRIDES: dict[str, dict[str, Any]] = {
    # The local/global attention pattern is a list of (pattern, repeats) that must add up to the layer count.
    "gpt_neo": {"attention_types": [[["global", "local"], BLOCKS // 2]]},
}

#: Generic tiny sizes, by the attribute names configs use for them (after ``attribute_map``).
_SIZES: dict[str, int] = {
    **dict.fromkeys(["hidden_size", "d_model", "n_embd", "embed_dim", "dim", "n_embed"], 32),
    **dict.fromkeys(["num_attention_heads", "n_head", "num_heads", "n_heads"], 4),
    **dict.fromkeys(["encoder_attention_heads", "decoder_attention_heads", "num_decoder_heads"], 4),
    **dict.fromkeys(["num_key_value_heads", "n_kv_heads", "num_kv_heads"], 2),
    **dict.fromkeys(["head_dim", "d_kv", "kv_channels", "attention_head_size"], 8),
    **dict.fromkeys(["intermediate_size", "n_inner", "d_ff", "ffn_dim", "ffn_hidden_size"], 64),
    **dict.fromkeys(["encoder_ffn_dim", "decoder_ffn_dim"], 64),
    **dict.fromkeys(["max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"], 64),
    **dict.fromkeys(["num_experts", "num_local_experts", "n_routed_experts"], 4),
    **dict.fromkeys(["num_experts_per_tok", "moe_topk", "top_k_experts"], 2),
    **dict.fromkeys(["moe_intermediate_size", "shared_expert_intermediate_size"], 32),
    "rotary_dim": 4,  # GPT-J, CodeGen: rotary dimensions per head, at most the head size (32 / 4 heads)
    "vocab_size": VOCAB_SIZE,
    "embedding_size": 32,
}
_LAYER_COUNTS = ["num_hidden_layers", "n_layer", "num_layers", "n_layers"]
_SEQ2SEQ_LAYER_COUNTS = ["encoder_layers", "decoder_layers", "num_layers", "num_decoder_layers"]
_DROPOUT_MARKERS = ("dropout", "pdrop", "drop_rate", "drop_prob", "layerdrop")
_SPECIAL_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 0}


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One architecture of the installed transformers, for one task."""

    model_type: str
    task: str
    class_name: str

    @property
    def expected_blocks(self) -> int:
        return BLOCKS

    def model_class(self) -> type:
        import transformers

        return getattr(transformers, self.class_name)


def _mapping(task: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, TASK_MAPPINGS[task], {}))


def registered_class(model_type: str, task: str) -> str | None:
    """The class name the installed release registers for ``model_type`` and ``task``, if any."""
    class_name = _mapping(task).get(model_type)
    return class_name if isinstance(class_name, str) else None


def _class_named(class_name: str) -> type | None:
    import transformers

    try:
        return getattr(transformers, class_name)
    except (AttributeError, ImportError, RuntimeError):
        return None


def architectures(model_types: dict[str, str] | None = None) -> list[Architecture]:
    """The architectures of ``model_types`` (default :data:`COMMON`) that the installed release provides.

    Provided means: registered for the task in the auto mappings, the class importable, and the class declares
    ``supports_gradient_checkpointing``.
    """
    found = []
    for model_type, task in (COMMON if model_types is None else model_types).items():
        class_name = registered_class(model_type, task)
        if class_name is None:
            continue
        model_class = _class_named(class_name)
        if model_class is None or not getattr(model_class, "supports_gradient_checkpointing", False):
            continue
        found.append(Architecture(model_type, task, class_name))
    return found


def all_registered() -> dict[str, str]:
    """Every model type the installed release registers for a causal-LM, masked-LM or seq2seq head, with its
    task (the first of those three that has it)."""
    registered: dict[str, str] = {}
    for task in TASK_MAPPINGS:
        for model_type, class_name in _mapping(task).items():
            if isinstance(class_name, str):
                registered.setdefault(model_type, task)
    return registered


def selected(choice: str | None) -> dict[str, str]:
    """The model types to sweep: ``COMMON`` (the default, and what CI runs), ``all`` (every registered one; for
    finding the next candidates for ``COMMON``, not all of them build tiny), or a comma-separated list."""
    if not choice or choice == "common":
        return dict(COMMON)
    if choice == "all":
        return all_registered()
    registered = all_registered()
    return {name: COMMON.get(name) or registered.get(name, CAUSAL_LM) for name in choice.split(",") if name}


def _config_class(model_type: str) -> type:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def _real_name(config_class: type, name: str) -> str:
    return getattr(config_class, "attribute_map", {}).get(name, name)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def tiny_config_kwargs(arch: Architecture) -> dict[str, Any]:
    """The keyword arguments that make ``arch``'s config tiny: generic sizes, no dropout, small token ids."""
    config_class = _config_class(arch.model_type)
    defaults = config_class().to_dict()
    kwargs: dict[str, Any] = {}
    for name, value in _SIZES.items():
        real = _real_name(config_class, name)
        if real in defaults and (defaults[real] is None or _is_number(defaults[real])):
            kwargs[real] = value
    layer_names = _SEQ2SEQ_LAYER_COUNTS if arch.task == SEQ2SEQ else _LAYER_COUNTS
    per_stack = BLOCKS // 2 if arch.task == SEQ2SEQ else BLOCKS
    for name in layer_names:
        real = _real_name(config_class, name)
        if real in defaults:
            kwargs[real] = per_stack
    for name, value in defaults.items():
        if _is_number(value) and any(marker in name.lower() for marker in _DROPOUT_MARKERS):
            kwargs[name] = 0.0
    for name, value in _SPECIAL_TOKENS.items():
        if name in defaults and defaults[name] is not None:
            kwargs[name] = value
    # Some configs have no pad token although their model reads one (Phi, StableLM in 5.0).
    kwargs["pad_token_id"] = _SPECIAL_TOKENS["pad_token_id"]
    for name in ("torch_dtype", "dtype"):
        if name in defaults:
            kwargs[name] = "float32"  # caches are allocated in the config's dtype (Llama 4 defaults to bf16)
    if arch.task == SEQ2SEQ:
        # The decoder's first input; T5-style configs only get it from a checkpoint's config.json.
        kwargs["decoder_start_token_id"] = _SPECIAL_TOKENS["decoder_start_token_id"]
    kwargs.update(OVERRIDES.get(arch.model_type, {}))
    return kwargs


def tiny_config(arch: Architecture):
    return _config_class(arch.model_type)(**tiny_config_kwargs(arch))


class NotTiny(Exception):
    """The generic recipe does not make this architecture tiny (a nested or unusual config)."""


def build(arch: Architecture, model_class: type | None = None, seed: int = 0) -> torch.nn.Module:
    """A tiny fp32 instance of ``arch`` (or of ``model_class``, a subclass), in training mode.

    The same ``seed`` gives the same weights, also where a release leaves a parameter uninitialised (Llama 4's
    experts in 4.51 are ``torch.empty`` memory, sometimes NaN): those are drawn from N(0, 0.02) here.
    """
    config = tiny_config(arch)
    model_class = model_class or arch.model_class()
    with torch.device("meta"):  # sizes first, without allocating: a missed size would build a full-size model
        parameters = sum(p.numel() for p in model_class(config).parameters())
    if parameters > MAX_PARAMETERS:
        raise NotTiny(f"{arch.model_type} still has {parameters} parameters with the tiny config")
    torch.manual_seed(seed)
    with uninitialized_memory_is_nan():
        model = model_class(config).float().train()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if torch.isnan(parameter).any():  # never written by the model's own init
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def batch(arch: Architecture, seed: int = 0) -> dict[str, torch.Tensor]:
    """Two sequences of eight tokens outside the special ids, with labels."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB_SIZE, (BATCH_SIZE, SEQUENCE_LENGTH), generator=generator)
    labels = torch.randint(3, VOCAB_SIZE, (BATCH_SIZE, SEQUENCE_LENGTH), generator=generator)
    if arch.task == CAUSAL_LM:
        labels = input_ids.clone()
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def gradients(model: torch.nn.Module, inputs: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """One training step's gradients, for every parameter that gets one.

    Checkpointing turns the KV cache off in training, so every step here runs without it (``use_cache=False``
    where the model takes it): with and without checkpointing the runs then differ in checkpointing alone. Some
    releases train differently with a cache (Llama 4 in 4.51 allocates it in bf16, RecurrentGemma in 5.0 drops
    gradients with it); the config keeps its default, since a config-level ``use_cache=False`` trips generation
    config validation on some releases.
    """
    if "use_cache" in inspect.signature(model.forward).parameters:
        inputs = {**inputs, "use_cache": False}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(**inputs).loss
    loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
