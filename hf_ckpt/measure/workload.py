"""The model and batch a benchmark runs on: a local model directory, or a transformers model type built tiny.

Nothing is downloaded. A model type (``llama``, ``gpt2``, ``bert``, ``t5``, ...) is built from its config class
with small sizes and random weights; a local directory is loaded with ``from_pretrained`` when it holds weights,
and built from its ``config.json`` with random weights otherwise (or when sizes are overridden).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from hf_ckpt.runtime.util import dtype_names

#: The embedded default: a Llama-style decoder, sized so that ``hf-ckpt bench`` runs in well under two minutes
#: on two CPU cores while its activations dominate (see docs/benchmarks.md).
DEFAULT_MODEL = "llama"
DEFAULT_LAYERS = 8
DEFAULT_HIDDEN = 256
DEFAULT_VOCAB = 512
DEFAULT_BATCH = 2
DEFAULT_SEQ = 256


@dataclass
class Workload:
    """A model ready to train and a batch for it.

    Attributes:
        model: The model, in training mode, on its device, in its dtype.
        batch: Keyword arguments for ``model`` (labels included where the model has a loss head).
        loss_fn: Maps the output to the loss when the model has no head (None: ``output.loss``).
        info: What was built, for the report (model type, class, sizes, parameter count, ...).
    """

    model: nn.Module
    batch: dict[str, torch.Tensor]
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    info: dict[str, Any] = field(default_factory=dict)


def parse_dtype(name: str) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or ``fp32`` / ``bf16`` / ``fp16``) to a torch dtype."""
    canonical = dtype_names.dtype_name(name) if isinstance(name, str) else None
    if canonical is None:
        raise ValueError(f"dtype must be one of {', '.join(dtype_names.DTYPE_NAMES)} (or fp32, bf16, fp16); got {name!r}")
    return getattr(torch, canonical)


def parse_device(spec: str) -> torch.device:
    """A device that exists on this machine, or ``ValueError`` saying which ones do."""
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device {spec!r} is not a device name ({error}); e.g. cpu, cuda, cuda:1") from None
    available = available_devices()
    if device.type == "cpu":
        return device
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if is_available is None or not is_available():
        raise ValueError(f"device {spec!r} is not available on this machine; available: {', '.join(available)}")
    count = getattr(backend, "device_count", lambda: 1)()
    if device.index is not None and device.index >= count:
        raise ValueError(f"device {spec!r} is not available on this machine; available: {', '.join(available)}")
    return device


def available_devices() -> list[str]:
    """The devices PyTorch can use here, ``cpu`` first."""
    devices = ["cpu"]
    for name in ("cuda", "xpu", "mps"):
        backend = getattr(torch, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            count = getattr(backend, "device_count", lambda: 1)()
            devices.extend(f"{name}:{index}" for index in range(count))
    return devices


def default_device() -> torch.device:
    """The first accelerator if there is one, else the CPU."""
    devices = available_devices()
    return torch.device(devices[1] if len(devices) > 1 else "cpu")


def _head_count(hidden: int) -> int:
    if hidden >= 128 and hidden % 64 == 0:
        return hidden // 64
    return 4 if hidden % 4 == 0 else 1


def _tiny_config(config_class: type, *, layers: int, hidden: int, seq: int) -> Any:
    """``config_class`` with small sizes; the names go through the class's ``attribute_map``."""
    heads = _head_count(hidden)
    defaults = config_class()
    standard = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "vocab_size": DEFAULT_VOCAB,
    }
    mapping = getattr(config_class, "attribute_map", {}) or {}
    sizes = {mapping.get(name, name): value for name, value in standard.items()}
    position_name = mapping.get("max_position_embeddings", "max_position_embeddings")
    if isinstance(getattr(defaults, position_name, None), int):
        sizes[position_name] = max(getattr(defaults, position_name), seq)
    gated = hasattr(defaults, "num_key_value_heads")
    optional = {
        "intermediate_size": (8 * hidden // 3 + 31) // 32 * 32 if gated else 4 * hidden,
        "n_inner": 4 * hidden,  # GPT-2
        "d_ff": 4 * hidden,  # T5
        "d_kv": hidden // heads,  # T5
        "num_decoder_layers": layers,  # T5
        "decoder_layers": layers,  # BART family
        "decoder_attention_heads": heads,
        "encoder_ffn_dim": 4 * hidden,
        "decoder_ffn_dim": 4 * hidden,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
    }
    for name, value in optional.items():
        if name not in sizes and getattr(defaults, name, None) is not None:
            sizes[name] = value
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        token = getattr(defaults, name, None)
        if isinstance(token, int) and token >= DEFAULT_VOCAB:  # keep special tokens inside the small vocabulary
            sizes[name] = DEFAULT_VOCAB - 1
    config = config_class(**sizes)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    return config


def _model_class(config: Any) -> tuple[type, str]:
    """The auto class with a loss head for ``config`` (seq2seq LM, masked LM, causal LM), else the base model."""
    import transformers
    from transformers.models.auto import modeling_auto

    kinds = [
        ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM", "seq2seq"),
        ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM", "masked"),
        ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM", "causal"),
    ]
    for mapping_name, auto_name, kind in kinds:
        if config.model_type in getattr(modeling_auto, mapping_name, {}):
            return getattr(transformers, auto_name), kind
    return transformers.AutoModel, "base"


def _has_weights(directory: str) -> bool:
    return any(
        name.endswith((".safetensors", ".bin", ".pt", ".pth")) or name.endswith(".index.json")
        for name in os.listdir(directory)
    )


def _hidden_state_loss(output: Any) -> torch.Tensor:
    hidden = output[0] if isinstance(output, (tuple, list)) else output.last_hidden_state
    return hidden.float().pow(2).mean()


def make_batch(
    config: Any, kind: str, *, batch: int, seq: int, device: torch.device, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random token ids (and labels for models with a loss head) for ``batch`` sequences of ``seq`` tokens."""
    generator = torch.Generator().manual_seed(seed)
    vocab = config.vocab_size
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    inputs = {"input_ids": input_ids}
    if kind in ("causal", "masked"):
        inputs["labels"] = input_ids.clone()
    elif kind == "seq2seq":
        labels = torch.randint(0, vocab, (batch, seq), generator=generator)
        start = getattr(config, "decoder_start_token_id", None)
        if start is None:
            start = getattr(config, "pad_token_id", None) or 0
        # given explicitly: some configs built without a hub config.json lack decoder_start_token_id
        inputs["decoder_input_ids"] = torch.cat([torch.full((batch, 1), start), labels[:, :-1]], dim=1)
        inputs["labels"] = labels
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def _from_directory(spec: str, *, layers: int | None, hidden: int | None, seq: int):
    """(config, model, kind, source) from a local model directory: its weights, or its config with overrides."""
    import transformers

    if not os.path.isdir(spec):
        raise ValueError(f"model directory {spec!r} does not exist")
    if not os.path.isfile(os.path.join(spec, "config.json")):
        raise ValueError(f"model directory {spec!r} has no config.json")
    config = transformers.AutoConfig.from_pretrained(spec)
    mapping = getattr(type(config), "attribute_map", {}) or {}
    for standard, value in (("num_hidden_layers", layers), ("hidden_size", hidden)):
        if value is not None:
            setattr(config, mapping.get(standard, standard), value)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    model_class, kind = _model_class(config)
    if layers is None and hidden is None and _has_weights(spec):
        return config, model_class.from_pretrained(spec, config=config), kind, f"{spec} (pretrained weights)"
    return config, model_class.from_config(config), kind, f"{spec} (config only, random weights)"


def _from_model_type(spec: str, *, layers: int | None, hidden: int | None, seq: int):
    """(config, model, kind, source) for a transformers model type, built tiny with random weights."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if spec not in CONFIG_MAPPING:
        raise ValueError(
            f"unknown model {spec!r}: not a directory, and not a transformers model type (e.g. llama, gpt2, bert, t5)"
        )
    config = _tiny_config(CONFIG_MAPPING[spec], layers=layers or DEFAULT_LAYERS, hidden=hidden or DEFAULT_HIDDEN, seq=seq)
    model_class, kind = _model_class(config)
    return config, model_class.from_config(config), kind, f"{spec} built from its config (random weights)"


def build_workload(
    model: str | None = None,
    *,
    layers: int | None = None,
    hidden: int | None = None,
    batch: int = DEFAULT_BATCH,
    seq: int = DEFAULT_SEQ,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    autocast: torch.dtype | None = None,
) -> Workload:
    """Build the model and batch to benchmark.

    Args:
        model: A local model directory, or a transformers model type (``llama``, ``gpt2``, ``bert``, ``t5``, ...)
            built tiny with random weights. Default: :data:`DEFAULT_MODEL`.
        layers: Override the number of layers (per stack for encoder-decoders). A local model with an override
            is rebuilt from its config with random weights.
        hidden: Override the hidden size (same rebuilding rule).
        batch: How many sequences the batch holds.
        seq: Tokens per sequence (random tokens).
        dtype: The precision the model runs in.
        device: Where the model and the batch live.
        seed: Seeds the weights and the batch.
        autocast: Mixed precision: the model's ``forward`` is wrapped in ``torch.autocast`` to this dtype
            (bfloat16 or float16) over weights in ``dtype``, as accelerate wraps it for the ``Trainer``'s
            ``bf16=True``: each forward enters autocast anew, backward runs outside it. None: no autocast.

    Raises:
        ValueError: The directory does not exist or holds no ``config.json``; the model type is unknown; a size
            is not a positive int.
    """
    for name, value in (("layers", layers), ("hidden", hidden), ("batch", batch), ("seq", seq)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    device = torch.device(device)
    spec = model or DEFAULT_MODEL
    looks_like_path = os.sep in spec or spec.startswith(".") or os.path.exists(spec)
    torch.manual_seed(seed)
    build = _from_directory if looks_like_path else _from_model_type
    config, module, kind, source = build(spec, layers=layers, hidden=hidden, seq=seq)
    module = module.to(device=device, dtype=dtype)
    module.train()
    if autocast is not None:
        module.forward = torch.autocast(device.type, dtype=autocast)(module.forward)
    inputs = make_batch(config, kind, batch=batch, seq=seq, device=device, seed=seed)
    mapping = getattr(type(config), "attribute_map", {}) or {}
    info = {
        "model": spec,
        "source": source,
        "class": type(module).__name__,
        "model_type": config.model_type,
        "layers": getattr(config, mapping.get("num_hidden_layers", "num_hidden_layers"), None),
        "hidden": getattr(config, mapping.get("hidden_size", "hidden_size"), None),
        "vocab": config.vocab_size,
        "parameters": sum(parameter.numel() for parameter in module.parameters()),
        "attention": getattr(module.config, "_attn_implementation", None),
        "batch": batch,
        "seq": seq,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
    }
    if autocast is not None:
        info["autocast"] = str(autocast).removeprefix("torch.")
    return Workload(module, inputs, _hidden_state_loss if kind == "base" else None, info)
