"""Every model type of the installed transformers that supports checkpointing, built tiny from its own config.

The full architecture sweep (``tests/test_architectures.py`` with ``HF_CKPT_SWEEP=full``, run by ``ci/sweep.py``)
asks this module three things:

* :func:`model_types` — every model type registered in the auto mappings (``transformers.models.auto``) whose
  model class declares ``supports_gradient_checkpointing = True``, with the class the sweep trains: the **base
  model class** (``MODEL_MAPPING``: the class every task head of that type wraps, and the one that holds every
  block and tower checkpointing acts on). A type registered only with task heads is swept with its first head
  (in the order of :data:`_HEAD_MAPPINGS`). Heads add no block, so one class per model type is the unit; the
  common task heads (causal LM, masked LM, seq2seq with their labels) are swept by the default sample
  (``arch_zoo.COMMON``). Found by capability; nothing here reads a version string.
* :func:`build` — a tiny fp32 instance: the config class's own defaults with every size-like field shrunk
  (layers to :data:`BLOCKS`, encoder/decoder layers to half of it each, hidden 32, 4 heads, vocab 128, images
  32x32 in 8x8 patches, 16 mel bins), recursively through the sub-configs of composite (multimodal) configs,
  every dropout 0, every special token id moved inside the small vocabulary.
* :func:`inputs` — a batch generated from the model's ``main_input_name`` and ``forward`` signature
  (``input_ids``/``attention_mask``, ``pixel_values``, ``input_features``, ``input_values``,
  ``decoder_input_ids`` for encoder-decoders, image tokens for vision-language models; by parameter name: Qwen2-VL
  style patches with ``grid_thw``, ``image_sizes`` of any-resolution models, ``pixel_position_ids``,
  ``input_features_mask``, Q-Former ``query_embeds``, a drafting assistant's ``shared_kv_states``, time-series
  windows), and :func:`loss`, a scalar from every floating tensor of the output (base models have no labels).

The generic rule also keeps a ViT-style backbone's ``out_features``/``out_indices`` inside the shrunk depth, adds
multimodal rotary sections (``mrope_section``) where a config has none, keeps one key/value head per query head for
multi-head latent attention, and generates the inputs named by a forward's required parameters or by its
``main_input_name`` (video frames, Qwen-VL style flattened patches with their ``grid_thw``, the encoder's input of a
speech encoder-decoder).

Per-type settings live next door: ``arch_overrides.OVERRIDES`` (config values the generic rule cannot guess),
``arch_overrides.MODEL_KWARGS`` (a model class's own keyword arguments) and ``arch_inputs.INPUT_RULES`` (batch
layouts only a model's own code defines), each entry with its reason; the tiny sizes and the helpers both use are
in ``arch_tiny``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import re
from typing import Any

import torch

from arch_inputs import EXTRA_INPUTS, IMAGE_SIZES, INPUT_RULES, features_last, time_series
from arch_overrides import DEFAULT_PARTS, MODEL_KWARGS, OVERRIDES, PARAMETER_BUDGETS
from arch_tiny import (AUDIO_SAMPLES, BATCH_SIZE, BLOCKS, FIRST_ID, IMAGE_SIZE, MAX_PARAMETERS, PATCH_SIZE,
                       RESERVED_IDS, SEQUENCE_LENGTH, SIZES, TIMM_VIT_ARGS, VOCAB_SIZE, find, grid_patches, required,
                       token_ids, uninitialized_memory_is_nan)

__all__ = ["AUDIO_SAMPLES", "BATCH_SIZE", "BLOCKS", "FIRST_ID", "IMAGE_SIZE", "MAX_PARAMETERS", "OVERRIDES",
           "PATCH_SIZE", "RESERVED_IDS", "SEQUENCE_LENGTH", "VOCAB_SIZE"]

_HORIZON = 4  # time series: steps predicted (the context is twice as long)

#: Task-head mappings tried, in order, for a model type with no base class in ``MODEL_MAPPING``.
_HEAD_MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_CTC_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES",
)

#: Counts capped, not set: grouped expert routing (DeepSeek-V3) needs whole groups of the tiny expert count.
_AT_MOST: dict[str, int] = {"n_group": 2, "num_expert_group": 2, "topk_group": 1,
                            "context_size": 8}  # chunked attention: chunks within the tiny sequence
#: Names of fields that may hold a width equal to some config's hidden size (projector outputs, adapters).
_WIDTH = re.compile(r"(size|dim|hidden|channels|width)")
#: Layer counts: encoder/decoder halves first (they sum to BLOCKS), then the single-stack names.
_HALF_LAYER_COUNTS = ("encoder_layers", "decoder_layers", "num_encoder_layers", "num_decoder_layers")
_LAYER_COUNT = re.compile(r"^(num_hidden_layers|n_layers?|num_layers|num_blocks|.*_num_hidden_layers|num_.*_hidden_layers"
                          r"|num_(text|vision|audio|encoder|decoder)_layers|(text|vision|audio)_layers)$")
_DROPOUT_MARKERS = ("dropout", "pdrop", "drop_rate", "drop_prob", "layerdrop", "drop_path", "drop_connect",
                    "mask_time_prob", "mask_feature_prob")  # SpecAugment masking: random, and needs long inputs
_FIXED_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 0,
                 "sep_token_id": 2, "cls_token_id": 1, "mask_token_id": 3}

@dataclasses.dataclass(frozen=True)
class ModelType:
    """One model type of the installed release and the class the sweep trains."""

    model_type: str
    class_name: str
    mapping: str  # the auto mapping the class came from

    def model_class(self) -> type:
        import transformers

        return getattr(transformers, self.class_name)


def _class(class_name: str) -> type | None:
    import transformers

    try:
        model_class = getattr(transformers, class_name)
        # A missing optional dependency gives a placeholder that raises on any attribute access.
        model_class.supports_gradient_checkpointing  # noqa: B018
        return model_class
    except BaseException:  # noqa: BLE001 (placeholders raise ImportError, some modules raise at import)
        return None


def _mapping(name: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    found = {}
    for model_type, class_name in dict(getattr(modeling_auto, name, {})).items():
        if isinstance(class_name, (tuple, list)):
            class_name = class_name[0]
        if isinstance(class_name, str):
            found[model_type] = class_name
    return found


@functools.lru_cache(maxsize=1)
def registered() -> dict[str, list[tuple[str, str]]]:
    """Every model type in any auto model mapping, with its (mapping, class name) pairs."""
    from transformers.models.auto import modeling_auto

    found: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(dir(modeling_auto)):
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES"):
            for model_type, class_name in _mapping(name).items():
                found.setdefault(model_type, []).append((name, class_name))
    return found


@functools.lru_cache(maxsize=None)
def model_types(only: tuple[str, ...] | None = None) -> list[ModelType]:
    """Every registered model type (of ``only``, if given) with a class declaring
    ``supports_gradient_checkpointing = True``, and the class the sweep trains (the base model class, else the
    first head of :data:`_HEAD_MAPPINGS`). Importing every class takes a while: ``only`` imports just those."""
    found = []
    for model_type, entries in sorted(registered().items()):
        if only is not None and model_type not in only:
            continue
        supporting = {(m, c) for m, c in entries if getattr(_class(c), "supports_gradient_checkpointing", False)}
        if not supporting:
            continue
        by_mapping = dict(supporting)
        for mapping in ("MODEL_MAPPING_NAMES", *_HEAD_MAPPINGS):
            if mapping in by_mapping:
                found.append(ModelType(model_type, by_mapping[mapping], mapping))
                break
        else:
            mapping, class_name = sorted(supporting)[0]
            found.append(ModelType(model_type, class_name, mapping))
    return found


# ------------------------------------------------------------------------------------------------------ configs


def config_class(model_type: str) -> type:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sub_config_class(parent: type, key: str, value: dict) -> type | None:
    sub_configs = getattr(parent, "sub_configs", {})
    declared = sub_configs.get(key) if isinstance(sub_configs, dict) else None  # a property on some 4.57 classes
    if isinstance(declared, type) and declared.__name__ != "AutoConfig":
        return declared
    with contextlib.suppress(KeyError):
        return config_class(value["model_type"])
    return None


def _accepted(sub: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as ``sub`` takes them: a sub-config that refuses keys it does not declare (DBRX's attention and
    feed-forward configs on 4.x raise on the generic ``PretrainedConfig`` fields of a ``to_dict``) gets its own."""
    try:
        sub(**copy.deepcopy(values))  # a copy: configs rewrite the dicts they are given (rope parameters)
    except Exception as error:  # noqa: BLE001 (huggingface_hub's strict validators raise their own class)
        if not any(word in str(error) for word in ("unknown", "unexpected keyword")):
            return values  # another refusal (a validator the per-type overrides satisfy): not about the keys
        declared = inspect.signature(sub.__init__).parameters
        return {k: v for k, v in values.items() if k in declared and k != "self"}
    return values


def _shrink_list(name: str, value: list, layers: int | None) -> list | None:
    per_layer = bool(layers and len(value) == layers and value) and name not in _STAGE_LISTS
    if name == "intermediate_size" and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [SIZES[name]] * (BLOCKS if layers and len(value) == layers else len(value))  # per-layer MLP widths
    if per_layer:
        value = value[:BLOCKS]  # per-layer lists (layer_types, attention patterns)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value) and value:
        # per-stage lists, also where the stage count is the layer count (Swin: num_layers = len(depths))
        if name in ("depths", "num_layers", "encoder_layers", "block_repeats"):
            return [1] * len(value)
        if name in ("hidden_sizes", "embed_dims", "dims", "channels", "conv_dim", "neck_hidden_sizes"):
            return [16 * min(2**i, 4) if name != "conv_dim" else 16 for i in range(len(value))]
        if name in ("num_heads", "num_attention_heads", "attention_heads"):
            return [2] * len(value)
    return value if per_layer else None


def _shrink_sizes(value: Any) -> Any:
    """A per-layer settings dict with its named sizes made tiny."""
    if not isinstance(value, dict):
        return value
    shrunk = {k: SIZES[k] if k in SIZES and _is_number(v) and v else v for k, v in value.items()}
    for kv_name, heads_name in _KV_HEADS:
        if kv_name in value and value[kv_name] == value.get(heads_name):
            shrunk[kv_name] = shrunk[heads_name]
    return shrunk


#: Per-stage lists of hierarchical (Swin-style) models, shrunk by name even when they have one entry per layer.
_STAGE_LISTS = ("depths", "num_heads", "hidden_sizes", "embed_dims")


class _Tokens:
    """Special token ids inside the tiny vocabulary: fixed ones for pad/bos/eos, the top ids for the others."""

    def __init__(self) -> None:
        self.assigned: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        if name in _FIXED_TOKENS:
            return _FIXED_TOKENS[name]
        if name not in self.assigned:
            self.assigned[name] = VOCAB_SIZE - 1 - len(self.assigned)
        return self.assigned[name]


def _hidden_sizes(defaults: dict[str, Any]) -> set[int]:
    """The default hidden sizes anywhere in a config tree (``defaults`` and its sub-config dicts)."""
    found = {defaults[k] for k in ("hidden_size", "d_model", "n_embd") if isinstance(defaults.get(k), int)}
    for value in defaults.values():
        if isinstance(value, dict) and "model_type" in value:
            found |= _hidden_sizes(value)
    return found


def tiny_kwargs(cls: type, defaults: dict[str, Any], tokens: _Tokens,
                widths: set[int] | None = None, instance: Any = None) -> dict[str, Any]:
    """Keyword arguments that make ``cls`` (whose defaults are ``defaults``) tiny; recursive into sub-configs.

    Besides the named sizes, any size-like field (``*size*``, ``*dim*``, ...) whose default equals one of the
    tree's default hidden sizes is a width that must follow the hidden size (a projector's output, an adapter's
    input), and becomes the tiny hidden size too.
    """
    widths = _hidden_sizes(defaults) if widths is None else widths
    layers = next((defaults[k] for k in ("num_hidden_layers", "num_layers", "n_layer") if _is_number(defaults.get(k))),
                  None)
    is_encoder_decoder = any(k in defaults for k in _HALF_LAYER_COUNTS) or defaults.get("is_encoder_decoder")
    kwargs: dict[str, Any] = {}
    for name, value in defaults.items():
        lowered = name.lower()
        if isinstance(value, dict) and "model_type" in value:
            built = getattr(instance, name, None)
            sub = _sub_config_class(cls, name, value)
            if sub is None and hasattr(built, "to_dict"):
                # the class the default holds: before ``sub_configs`` (4.45), or a class registered under no
                # model type (4.57 T5Gemma's encoder and decoder: "t5_gemma_module", and no ``sub_configs``)
                sub = type(built)
            if sub is not None:
                tiny = _accepted(sub, {**value, **tiny_kwargs(sub, value, tokens, widths=widths, instance=built)})
                kwargs[name] = _merge(tiny, OVERRIDES.get(value["model_type"], {}))  # a sub-model's own overrides
            continue
        if isinstance(value, dict) and value and all(str(k).isdigit() for k in value) and (
                layers is None or max(int(k) for k in value) < layers):
            kwargs[name] = {k: _shrink_sizes(v) for k, v in value.items() if int(k) < BLOCKS}  # per-layer settings
            continue
        if isinstance(value, dict) and isinstance(value.get("mrope_section"), list):
            # multimodal rotary sections (t, h, w) must sum to half the tiny head size
            kwargs[name] = {**value, "mrope_section": _mrope_section(value, defaults)}
            continue
        if isinstance(value, list):
            shrunk = _shrink_list(name, value, layers)
            if shrunk is not None:
                kwargs[name] = shrunk
            continue
        if not (_is_number(value) or value is None):
            continue
        if name in SIZES and (value is None or isinstance(value, int)):
            if (value is None and name not in ("head_dim", "vocab_size")) or value == 0:  # 0: absent (NoPE)
                continue
            kwargs[name] = SIZES[name]
        elif name in _AT_MOST and isinstance(value, int):
            kwargs[name] = min(value, _AT_MOST[name])
        elif name in _HALF_LAYER_COUNTS and isinstance(value, int):
            kwargs[name] = BLOCKS // 2
        elif _LAYER_COUNT.match(name) and isinstance(value, int) and value > 0:
            kwargs[name] = BLOCKS // 2 if is_encoder_decoder else BLOCKS
        elif any(marker in lowered for marker in _DROPOUT_MARKERS) and isinstance(value, float):
            kwargs[name] = 0.0
        elif (lowered.endswith("_token_id") or lowered.endswith("_token_index")) and isinstance(value, int):
            kwargs[name] = tokens(name)
        elif isinstance(value, int) and value in widths and value > 32 and _WIDTH.search(lowered):
            kwargs[name] = SIZES["hidden_size"]
    for name in ("torch_dtype", "dtype"):
        if name in defaults:
            kwargs[name] = "float32"
    if "lags_sequence" in defaults and defaults.get("prediction_length") is None:  # probabilistic time series
        kwargs.update(prediction_length=_HORIZON, context_length=2 * _HORIZON, lags_sequence=[1, 2, 3],
                      num_time_features=1)
    for kv_name, heads_name in _KV_HEADS:
        heads = defaults.get(heads_name)
        if kv_name in kwargs and isinstance(heads, int) and defaults[kv_name] == heads:
            kwargs[kv_name] = kwargs.get(heads_name, defaults[heads_name])  # multi-head by default: some require it
    rope = defaults.get("rope_parameters")
    # squashed: 4.57 spells one "Glm4vMoe_text"; 5.0 configs do not list mrope_section among their rope keys yet
    multimodal_rope = _squashed(getattr(cls, "model_type", "")) in _MROPE_TYPES
    if (isinstance(rope, dict) and "rope_type" in rope and "mrope_section" not in rope
            and ("mrope_section" in getattr(cls, "ignore_keys_at_rope_validation", ()) or multimodal_rope)):
        # the model falls back to a full-size section list when the config has none (GLM-4V)
        kwargs["rope_parameters"] = {**rope, "mrope_section": _mrope_section(rope, defaults)}
    if defaults.get("rope_scaling", 0) is None and (multimodal_rope or _squashed(getattr(cls, "model_type", ""))
                                                   in _ROPE_TYPE_READERS):
        # 4.x Qwen-VL text models read rope_scaling["mrope_section"], 4.x Mllama's rope_scaling["rope_type"]; None
        # by default (checkpoints set it)
        kwargs["rope_scaling"] = {"rope_type": "default",
                                  **({"mrope_section": _mrope_section({}, defaults)} if multimodal_rope else {})}
    kwargs.update(_backbone_outputs(defaults, layers))
    if isinstance(defaults.get("architecture"), str) and "model_args" in defaults:
        kwargs.update(_timm_model_args(defaults))
    if defaults.get("use_mamba_kernels"):  # the fused Mamba kernels need CUDA (jamba raises before 4.5x without them)
        kwargs["use_mamba_kernels"] = False
    if layers and defaults.get("num_kv_shared_layers") == layers:  # every layer reuses another model's cache
        kwargs["num_kv_shared_layers"] = BLOCKS
    if isinstance(defaults.get("image_grid_pinpoints"), list):  # any-resolution tiles: one tiny image size
        kwargs["image_grid_pinpoints"] = [[IMAGE_SIZE, IMAGE_SIZE]]
    if "kv_lora_rank" in defaults and "num_key_value_heads" in kwargs:
        # multi-head latent attention expands its latent K/V to one head per query head
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", SIZES["num_attention_heads"])
    _follow_depth(defaults, kwargs)
    if "qk_rope_head_dim" in defaults and "head_dim" in defaults:
        kwargs["head_dim"] = SIZES["qk_rope_head_dim"]  # multi-head latent attention: head_dim is the rope part
    if "pad_token_id" in defaults or "vocab_size" in defaults:
        kwargs["pad_token_id"] = 0
    if defaults.get("is_encoder_decoder"):
        kwargs["decoder_start_token_id"] = 0
    return kwargs


def _follow_depth(defaults: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """A ViT-style backbone (one stage per layer) keeps the same number of output stages, the last ones of the
    shrunk depth, where its ``out_features``/``out_indices`` name stages beyond it (DPT necks read 4 of 12)."""
    layers = kwargs.get("num_hidden_layers")
    features, indices = defaults.get("out_features"), defaults.get("out_indices")
    if not (isinstance(layers, int) and isinstance(features or indices, list) and defaults.get("num_hidden_layers")):
        return
    count = len(features or indices)
    stages = [int(f[len("stage"):]) for f in features or [] if re.fullmatch(r"stage\d+", str(f))]
    if count > layers or max([*stages, *(indices or [])], default=0) <= layers:
        return
    if features:
        kwargs["out_features"] = [f"stage{layers - count + 1 + i}" for i in range(count)]
    if indices:
        kwargs["out_indices"] = [layers - count + 1 + i for i in range(count)]


def _merge(values: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``values`` updated by ``overrides``; a dict for a sub-config updates that sub-config's values."""
    merged = dict(values)
    for name, value in overrides.items():
        both = isinstance(value, dict) and isinstance(merged.get(name), dict) and "model_type" not in value
        merged[name] = _merge(merged[name], value) if both else value
    return merged


#: (key/value head count, attention head count) field pairs.
_KV_HEADS = (("num_key_value_heads", "num_attention_heads"), ("n_kv_heads", "n_heads"), ("num_kv_heads", "num_heads"),
             ("num_kv_heads", "num_attention_heads"))


def _squashed(model_type: str) -> str:
    return model_type.replace("_", "").lower()


#: Model types whose text model reads multimodal rotary sections that their 4.x and 5.0 configs do not set
#: (``rope_scaling`` None, ``rope_parameters`` without ``mrope_section``: checkpoints set them); squashed.
_MROPE_TYPES = frozenset(_squashed(name) for name in (
    "glm4v", "glm4v_moe", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v_text", "glm4v_moe_text",
    "qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "qwen3_vl_moe_text", "glm_image_text"))


#: Model types whose 4.x text model reads ``rope_scaling["rope_type"]`` from a config that defaults it to None.
_ROPE_TYPE_READERS = frozenset({_squashed("mllama_text_model")})


def _mrope_section(rope: dict, defaults: dict) -> list[int]:
    """Multimodal rotary sections (t, h, w) summing to half the tiny rotary width (head size 8 times the
    partial rotary factor)."""
    factor = rope.get("partial_rotary_factor", defaults.get("partial_rotary_factor")) or 1.0
    half = int(SIZES["head_dim"] * factor) // 2
    t = (half + 1) // 2
    h = (half - t + 1) // 2
    return [t, h, half - t - h]


def _timm_model_args(defaults: dict) -> dict[str, Any]:
    """A timm tower (``timm_wrapper`` config) of the ViT family made tiny through its ``model_args``, which timm
    passes to the model class over the named architecture's own; nothing where that class takes other sizes (or
    timm is not installed: the type then fails its build, naming timm)."""
    try:
        import timm
    except ImportError:
        return {}
    model_args = {**(defaults.get("model_args") or {}), **TIMM_VIT_ARGS}
    try:
        with torch.device("meta"):
            timm.create_model(defaults["architecture"], pretrained=False, **model_args)
    except Exception:  # noqa: BLE001 (another family: ResNet, FastViT, MobileNet take other sizes)
        return {}
    return {"model_args": model_args}


def _backbone_outputs(defaults: dict, layers: int | None) -> dict[str, Any]:
    """A backbone's selected stages follow its shrunk depth: the same number of stages, the last ones."""
    stages, indices = defaults.get("stage_names"), defaults.get("out_indices")
    if not (layers and isinstance(stages, list) and len(stages) == layers + 1 and isinstance(indices, (list, tuple))
            and 0 < len(indices) <= BLOCKS):
        return {}
    picked = list(range(BLOCKS - len(indices) + 1, BLOCKS + 1))
    return {"out_indices": picked, "out_features": [f"stage{i}" for i in picked]}


def tiny_config(model_type: str):
    cls = config_class(model_type)
    try:
        instance = cls()
    except Exception:  # noqa: BLE001 (defaults its own validation rejects: start from the per-type settings)
        # copies: 4.x composite configs pop "model_type" out of the dicts they are given
        instance = cls(**copy.deepcopy({**DEFAULT_PARTS.get(model_type, {}), **OVERRIDES.get(model_type, {})}))
    defaults = instance.to_dict()
    parts = DEFAULT_PARTS.get(model_type, {})
    if any(defaults.get(name) is None or part.get("model_type", defaults[name].get("model_type"))
           != defaults[name].get("model_type") for name, part in parts.items()):
        # defaults that leave a part out (5.0's Phi-4 multimodal) or give one of another type (5.15's Granite 4
        # Vision: a Llama text config)
        try:
            instance = cls(**copy.deepcopy(parts))
        except Exception:  # noqa: BLE001 (a part its validation rejects, as above: with the part's own overrides)
            overrides = OVERRIDES.get(model_type, {})
            instance = cls(**copy.deepcopy({name: _merge(part, overrides.get(name, {}))
                                            for name, part in parts.items()}))
        defaults = instance.to_dict()
    kwargs = _merge(tiny_kwargs(cls, defaults, _Tokens(), instance=instance), OVERRIDES.get(model_type, {}))
    if "backbone_config" in kwargs and isinstance(defaults.get("backbone"), str) and "use_timm_backbone" in defaults:
        # a backbone config replaces the named (timm) checkpoint; 4.x configs refuse both at once
        kwargs.update(backbone=None, use_timm_backbone=False)
    if defaults.get("use_pretrained_backbone"):  # random weights: nothing to load (4.45's Deformable DETR default)
        kwargs["use_pretrained_backbone"] = False
    return cls(**kwargs)


class NotTiny(Exception):
    """The generic rule does not make this model type tiny."""


def _parameters(model_class: type, config: Any, **kwargs: Any) -> int:
    """The parameter count of ``model_class(config)``, sized on the meta device first, without allocating (a missed
    size would build a full-size model); a model whose ``__init__`` reads a tensor's value (older releases' drop
    path rates: ``torch.linspace(...)[i].item()``) cannot be built there and is counted on the CPU."""
    try:
        with torch.device("meta"):
            return sum(p.numel() for p in model_class(config, **kwargs).parameters())
    except (RuntimeError, NotImplementedError) as error:
        if "meta" not in str(error):
            raise
    return sum(p.numel() for p in model_class(config, **kwargs).parameters())


def model_config(entry: ModelType) -> Any:
    """The tiny config :func:`build` makes ``entry``'s class from (a part of a composite config where the class
    takes that part's config)."""
    config = tiny_config(entry.model_type)
    wanted = getattr(entry.model_class(), "config_class", None)
    if isinstance(wanted, type) and not isinstance(config, wanted):  # a base class built from one part of its
        config = next((v for v in vars(config).values() if isinstance(v, wanted)), config)  # type's composite config
    return config


def build(entry: ModelType, seed: int = 0) -> torch.nn.Module:
    """A tiny fp32 instance of ``entry``'s class in training mode; the same ``seed`` gives the same weights."""
    config = model_config(entry)
    model_class = entry.model_class()
    kwargs = MODEL_KWARGS.get(entry.model_type, {})
    parameters = _parameters(model_class, config, **kwargs)
    if parameters > PARAMETER_BUDGETS.get(entry.model_type, MAX_PARAMETERS):
        raise NotTiny(f"{entry.model_type} still has {parameters} parameters with the tiny config")
    torch.manual_seed(seed)
    with uninitialized_memory_is_nan():
        model = model_class(config, **kwargs).float().train()
    model._sweep_model_type = entry.model_type  # the key of INPUT_RULES (a sub-config has a type of its own)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if not torch.isfinite(parameter).all():  # never written by the model's own init (NaN, see below)
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


# ------------------------------------------------------------------------------------------------------- inputs



def _matches_pairs(model_type: str) -> bool:
    """Keypoint matchers take a pair of images per sample."""
    return any("KEYPOINT_MATCHING" in mapping for mapping, _ in registered().get(model_type, []))


def _image_token_id(config: Any) -> int | None:
    return find(config, "image_token_id", "image_token_index")


_FEATURES = re.compile(r"tokens: \d+, features:? (\d+)|Got (\d+) feature vectors for \d+ placeholder tokens"
                       r"|but (\d+) tokens from image embeddings|multi_modal_projector returned (\d+)")
#: Releases before the placeholder check scatter the features into the image-token positions: with none there, the
#: scatter fails with the feature count (flat: tokens x hidden size over the batch; or [tokens, hidden]).
_SCATTER = re.compile(r"value tensor of shape \[(\d+)(, \d+)?\] cannot be broadcast to indexing result of shape \[0")


def inputs(model: torch.nn.Module, seed: int = 0) -> dict[str, Any]:
    """A batch for ``model`` from its ``main_input_name`` and ``forward`` signature.

    A model with a vision sub-config that takes ``pixel_values`` next to ``input_ids`` gets both. Where it also has
    an image token (vision-language models), the number of image tokens per sequence is what the model's own
    check asks for: the first forward (no gradients) with no image token raises "... tokens: 0, features: N",
    and the batch then carries N / batch-size image tokens per sequence.
    """
    parameters = inspect.signature(model.forward).parameters
    pixels = "pixel_values" in parameters and find(model.config, "vision_config") is not None
    batch = _inputs(model, seed, pixels=pixels)
    if not (pixels and "input_ids" in batch and _image_token_id(model.config) is not None):
        return batch
    candidates: list[int] | None = None
    counted = False
    while True:
        try:
            with torch.no_grad():
                model(**batch)
            return batch
        except (ValueError, RuntimeError) as error:
            found = _FEATURES.search(str(error))
            scattered = _SCATTER.search(str(error))
            if not (found or scattered or "image tokens" in str(error)) or (candidates == [] and counted):
                raise
            if candidates is None and scattered:
                hidden = 1 if scattered.group(2) else find(model.config, "hidden_size", default=1)  # [tokens, hidden]
                candidates = [max(1, int(scattered.group(1)) // BATCH_SIZE // hidden)]
            elif candidates is None and found:  # "features": a token count or tokens x hidden size, over the batch
                features = int(next(group for group in found.groups() if group))
                hidden = find(model.config, "hidden_size", default=1)
                candidates = [c for c in (features // BATCH_SIZE, features // BATCH_SIZE // hidden, features) if c]
            elif candidates is None:  # older releases: one token per image, expanded by the model, or one per patch
                patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
                candidates = [1, patches, patches + 1]
            if not candidates and not counted:  # last: what the model's own image features count over the batch
                counted = True
                candidates = [c for c in [_feature_tokens(model, batch)] if c]
                if not candidates:
                    raise
            batch = _inputs(model, seed, pixels=True, image_tokens=candidates.pop(0))


def _feature_tokens(model: torch.nn.Module, batch: dict[str, Any]) -> int | None:
    """Image tokens per sequence from the features ``get_image_features`` returns, where the error's count is not
    (5.15's HunYuan-VL reports the features' leading dimension: 1, for 16 features of 2 images in one row)."""
    getter = getattr(model, "get_image_features", None)
    if getter is None:
        return None
    try:
        with torch.no_grad():
            found = getter(**{k: v for k, v in batch.items() if k in inspect.signature(getter).parameters})
    except Exception:  # noqa: BLE001 (a getter that needs more than the batch has: no count)
        return None
    found = getattr(found, "pooler_output", found)
    found = [found] if isinstance(found, torch.Tensor) else list(_tensors(found))
    return sum(f.numel() // f.shape[-1] for f in found) // BATCH_SIZE or None


def _inputs(model: torch.nn.Module, seed: int, pixels: bool = False, image_tokens: int = 0) -> dict[str, Any]:
    config = model.config
    parameters = inspect.signature(model.forward).parameters
    generator = torch.Generator().manual_seed(seed)
    batch: dict[str, Any] = {}
    main = getattr(model, "main_input_name", "input_ids")
    if main not in parameters and "pixel_values" in parameters:  # a vision tower that inherits "input_ids"
        main = "pixel_values"
    wanted = [main] + (["input_ids"] if "input_ids" in parameters and main != "input_ids" else [])
    if pixels and main != "pixel_values":
        wanted.append("pixel_values")
    if main == "inputs" and hasattr(model, "encoder"):  # speech encoder-decoder: the encoder's own input
        wanted[0] = getattr(model.encoder, "main_input_name", "input_values")
    # an input the forward requires under a name the generator knows, where main_input_name names another
    wanted += [n for n in ("pixel_values", "pixel_values_videos", "input_features", "input_values")
               if required(parameters, n)
               and n not in wanted]
    wanted += [name for name in EXTRA_INPUTS.get(config.model_type, []) if name != "image_sizes"]
    for name in wanted:
        if name == "input_ids":
            ids = token_ids(generator)
            token = _image_token_id(config)
            if image_tokens and token is not None:
                ids = torch.cat([torch.full((BATCH_SIZE, image_tokens), token), ids], dim=1)
            batch["input_ids"] = ids
            if "mm_token_type_ids" in parameters and image_tokens:  # 1 marks an image token (GLM-4V, Qwen-VL)
                batch["mm_token_type_ids"] = (ids == token).long()
            if "token_type_ids" in parameters and pixels and token is not None:
                # 1 marks an image token: PaliGemma's and Gemma 3's prefix mask, required in training on 5.0
                batch["token_type_ids"] = (ids == token).long()
            if "attention_mask" in parameters:
                batch["attention_mask"] = torch.ones_like(ids)
        elif name == "pixel_values":
            channels = find(config, "num_channels", "in_channels", "in_chans", default=3)
            size = find(config, "image_size", "img_size", default=IMAGE_SIZE)
            size = IMAGE_SIZES.get(config.model_type, size if isinstance(size, int) else IMAGE_SIZE)
            frames = find(config, "num_frames") or (2 if _matches_pairs(config.model_type) else None)
            shape = (BATCH_SIZE, channels, size, size) if not frames else (BATCH_SIZE, frames, channels, size, size)
            any_resolution = find(config, "image_grid_pinpoints") is not None
            if "image_sizes" in parameters and (any_resolution or required(parameters, "image_sizes") or (
                    "image_sizes" in EXTRA_INPUTS.get(config.model_type, []))):  # each image's true (height, width)
                batch["image_sizes"] = torch.tensor([[size, size]] * BATCH_SIZE)
                if any_resolution:
                    # LLaVA-NeXT style (any-resolution): the base image and its one tile (the tiny pinpoint grid)
                    shape = (BATCH_SIZE, 2, channels, size, size)
            if "tile_fine_mask" in parameters:  # Granite Docling: tiles per sample, and which are real
                shape = (BATCH_SIZE, 1, channels, size, size)
                batch["pixel_attention_mask"] = torch.ones(BATCH_SIZE, 1, dtype=torch.bool)
            grid = next((g for g in ("image_grid_thw", "grid_thw", "image_grid_hw") if g in parameters), None)
            if grid:  # Qwen2-VL style: flattened patches and a (t, h, w) grid per image (its vision tower: grid_thw)
                batch["pixel_values"], thw = grid_patches(config, generator)
                batch[grid] = thw[:, 1:] if grid.endswith("_hw") else thw
                if "image_merge_sizes" in parameters:  # VideoLLaMA3: each image's spatial merge
                    batch["image_merge_sizes"] = torch.full((BATCH_SIZE,), find(config, "spatial_merge_size", default=1))
                if "images_per_sample" in parameters:  # GLM-Image: each sample's grids end with its target's
                    batch[grid] = batch[grid].repeat_interleave(2, dim=0)
                    batch["images_per_sample"] = torch.tensor([2] * BATCH_SIZE)
                continue
            batch["pixel_values"] = torch.randn(*shape, generator=generator)
        elif name == "input_features":
            bins = find(config, "num_mel_bins", "feature_size", "input_feat_per_channel", default=16)
            frames = 2 * (find(config, "max_source_positions", default=16) or 16)
            width = features_last(model)
            shape = (BATCH_SIZE, bins, frames) if width is None else (BATCH_SIZE, frames, width)
            batch["input_features"] = torch.randn(*shape, generator=generator)
        elif name == "audio_mel":  # Gemma 3n: (batch, frames, bins) and its padding mask (True: padding)
            frames = 2 * SEQUENCE_LENGTH
            batch["audio_mel"] = torch.randn(BATCH_SIZE, frames, config.input_feat_size, generator=generator)
            batch["audio_mel_mask"] = torch.zeros(BATCH_SIZE, frames, dtype=torch.bool)
        elif name == "input_values" and isinstance(getattr(config, "max_length", None), int) and hasattr(
                config, "num_mel_bins"):  # a spectrogram (Audio Spectrogram Transformer): (batch, frames, bins)
            shape = (BATCH_SIZE, config.max_length, config.num_mel_bins)
            batch["input_values"] = torch.randn(*shape, generator=generator)
        elif name == "input_values":
            batch["input_values"] = torch.randn(BATCH_SIZE, AUDIO_SAMPLES, generator=generator)
        elif name == "pixel_values_videos":  # (batch, frames, channels, height, width)
            channels = find(config, "num_channels", "in_channels", "in_chans", default=3)
            size = find(config, "image_size", "crop_size", "img_size", default=IMAGE_SIZE)
            size = size if isinstance(size, int) else IMAGE_SIZE
            frames = find(config, "num_frames", default=None) or max(2, find(config, "tubelet_size", default=2))
            batch[name] = torch.randn(BATCH_SIZE, frames, channels, size, size, generator=generator)
        elif name == "inputs_embeds":
            batch["inputs_embeds"] = torch.randn(BATCH_SIZE, SEQUENCE_LENGTH, config.hidden_size, generator=generator)
    if "qformer_input_ids" in parameters:  # InstructBLIP: the instruction, read by the Q-Former too
        batch["qformer_input_ids"] = token_ids(generator)
        batch["qformer_attention_mask"] = torch.ones_like(batch["qformer_input_ids"])
    if main == "past_values" and hasattr(config, "lags_sequence"):  # GluonTS-style forecasters (Autoformer)
        batch.update(time_series(config, generator))
    if "input_features_mask" in parameters and "input_features" in batch:  # every frame valid
        features = batch["input_features"]
        frames = features.shape[-1] if features_last(model) is None else features.shape[1]
        batch["input_features_mask"] = torch.ones(BATCH_SIZE, frames, dtype=torch.long)
    if "high_res_pixel_values" in parameters and "pixel_values" in batch:  # DeepSeek-VL hybrid: a second tower
        size = config.high_res_vision_config.image_size
        batch["high_res_pixel_values"] = torch.randn(BATCH_SIZE, 3, size, size, generator=generator)
    if "shared_kv_states" in parameters and "inputs_embeds" in parameters:  # a drafting assistant (Gemma 4) runs on
        text = config.get_text_config()  # its target's last hidden states (two widths) and key/value states
        width = 2 * config.backbone_hidden_size
        batch = {"inputs_embeds": torch.randn(BATCH_SIZE, 1, width, generator=generator), "shared_kv_states": {
            kind: tuple(torch.randn(BATCH_SIZE, text.num_key_value_heads, SEQUENCE_LENGTH, text.head_dim,
                                    generator=generator) for _ in range(2)) for kind in sorted(set(text.layer_types))}}
    if "query_embeds" in parameters and main != "query_embeds":  # a Q-Former alone: learned queries, image features
        batch = {"query_embeds": torch.randn(BATCH_SIZE, SEQUENCE_LENGTH, config.hidden_size, generator=generator)}
        if "encoder_hidden_states" in parameters:
            width = getattr(config, "encoder_hidden_size", None) or config.hidden_size
            batch["encoder_hidden_states"] = torch.randn(BATCH_SIZE, SEQUENCE_LENGTH, width, generator=generator)
    if "pixel_position_ids" in parameters:  # Gemma 4 vision: flattened patches and their (x, y) positions
        side = find(config, "image_size", default=IMAGE_SIZE) // find(config, "patch_size", default=PATCH_SIZE)
        patch = find(config, "patch_size", default=PATCH_SIZE)
        grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="xy"), -1).reshape(-1, 2)
        batch["pixel_values"] = torch.rand(BATCH_SIZE, side * side, 3 * patch * patch, generator=generator)
        batch["pixel_position_ids"] = grid.expand(BATCH_SIZE, -1, -1).clone()
    if "grid_thw" in parameters:  # a Qwen2-VL-style vision tower alone: its first argument takes the patches
        first = next(iter(parameters))
        batch = {first: None, "grid_thw": None}
        batch[first], batch["grid_thw"] = grid_patches(config, generator)
        if required(parameters, "merge_sizes"):  # VideoLLaMA3: the spatial merge of each image
            batch["merge_sizes"] = torch.full((BATCH_SIZE,), find(config, "spatial_merge_size", default=1))
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters:
        channels = getattr(getattr(config, "decoder_config", None), "num_channels", None)
        batch["decoder_input_ids"] = token_ids(generator)
        if channels:  # audio codebooks (Dia): one id per channel and step
            batch["decoder_input_ids"] = torch.randint(FIRST_ID, VOCAB_SIZE - RESERVED_IDS,
                                                       (BATCH_SIZE, SEQUENCE_LENGTH, channels), generator=generator)
    rule = INPUT_RULES.get(getattr(model, "_sweep_model_type", getattr(config, "model_type", "")))
    if rule is not None:
        generic = (batch.get("input_features"), batch.get("input_features_mask"))
        batch.update(rule(model, batch, generator) or {})
        if batch.get("input_features") is not generic[0] and batch.get("input_features_mask") is generic[1]:
            batch.pop("input_features_mask", None)  # the generic mask fits the generic features, not the rule's
    for name, value in (("use_cache", False), ("return_dict", True)):
        if name in parameters:
            batch[name] = value
    return batch


#: Output fields that hold a key/value cache: no training loss reads them, and a model may return one only without
#: checkpointing (4.x Idefics2Model does not pass ``use_cache=False`` on to its text model, whose config default
#: returns the cache unless checkpointing turns it off).
_CACHES = frozenset({"past_key_values"})


def _tensors(output: Any):
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, dict):
        for name, value in output.items():
            if name not in _CACHES:
                yield from _tensors(value)
    elif isinstance(output, (tuple, list)):
        for value in output:
            yield from _tensors(value)


def loss(output: Any) -> torch.Tensor:
    """A scalar from every floating tensor of ``output`` that carries a gradient (base models have no loss), but a
    key/value cache (:data:`_CACHES`)."""
    parts = [t.float().pow(2).mean() for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise NotTiny("the output has no tensor that carries a gradient")
    return torch.stack(parts).sum()


def live_blocks(model: torch.nn.Module, grads: dict[str, torch.Tensor]) -> list[int]:
    """Blocks some parameter of which got a gradient: the only ones a backward can recompute (a vision tower's
    last block is often unused: Llava reads the second-to-last hidden state)."""
    from hf_ckpt.runtime.blocks import find_blocks

    names = {id(p): n for n, p in model.named_parameters()}
    return [b.index for b in find_blocks(model) if any(names.get(id(p)) in grads for p in b.module.parameters())]


def gradients(model: torch.nn.Module, batch: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """One training step's gradients (RNG seeded, so any dropout draws the same masks in every run).

    TorchScript runs unoptimized: its profiling executor runs a scripted function's first calls as profiled and
    the later ones through an optimized graph that rounds differently, so a reference step would differ from any
    later step with or without checkpointing (VITS's ``fused_add_tanh_sigmoid_multiply``, scripted before 5.24:
    1.6e-4 on gradients of up to 390 between two plain steps).
    """
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with torch.jit.optimized_execution(False):
        loss(model(**batch)).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


# ---------------------------------------------------------------------------------------------------- modality

MODALITIES = ("text decoder", "encoder", "encoder-decoder", "vision", "audio/speech", "multimodal", "MoE",
              "state-space/hybrid")
_STATE_SPACE = ("state_size", "ssm_state_size", "mamba_d_state", "d_state", "mamba_n_heads", "attn_layer_period",
                "block_types", "lru_width", "conv_L_cache")
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")
_MAPPING_MODALITY = {
    "multimodal": ("IMAGE_TEXT_TO_TEXT", "MULTIMODAL_LM", "VISION_2_SEQ", "VISUAL_QUESTION_ANSWERING",
                   "ZERO_SHOT_IMAGE_CLASSIFICATION", "DOCUMENT_QUESTION_ANSWERING"),
    "audio/speech": ("SPEECH_SEQ_2_SEQ", "CTC", "AUDIO_", "TEXT_TO_WAVEFORM", "TEXT_TO_SPECTROGRAM", "RNNT", "TDT"),
    "vision": ("IMAGE_CLASSIFICATION", "IMAGE_MAPPING", "BACKBONE", "OBJECT_DETECTION", "SEMANTIC_SEGMENTATION",
               "DEPTH_ESTIMATION", "MASKED_IMAGE_MODELING", "VIDEO_CLASSIFICATION", "MASK_GENERATION", "KEYPOINT",
               "POSE_ESTIMATION", "IMAGE_SEGMENTATION", "UNIVERSAL_SEGMENTATION", "IMAGE_TO_IMAGE"),
}


def modality(entry: ModelType) -> str:
    """The row of the compatibility table ``entry`` belongs to, from its auto mappings and its config's fields.

    First match wins: multimodal (a text model with a vision or audio tower), audio/speech, vision,
    state-space/hybrid, MoE, encoder-decoder, text decoder (a causal-LM head), encoder.
    """
    mappings = [m for m, _ in registered().get(entry.model_type, [])]
    try:
        defaults = config_class(entry.model_type)().to_dict()
    except Exception:  # noqa: BLE001 (a config that cannot even be built with its defaults)
        defaults = {}
    towers = {k for k, v in defaults.items() if isinstance(v, dict) and "model_type" in v}
    text = any(k.startswith("text") for k in towers) or "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" in mappings
    other = any(k.startswith(("vision", "audio", "speech", "image")) for k in towers)
    if (text and other) or any(key in m for m in mappings for key in _MAPPING_MODALITY["multimodal"]):
        return "multimodal"
    if "MODEL_FOR_MASKED_LM_MAPPING_NAMES" in mappings and "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" in mappings:
        text = False  # BERT-style encoders also register a causal-LM head
    main = getattr(_class(entry.class_name), "main_input_name", "input_ids")
    if main in ("input_features", "input_values", "audio_values"):
        return "audio/speech"
    if main in ("pixel_values", "pixel_values_videos"):
        return "vision"
    for name in ("audio/speech", "vision"):
        if any(key in m for m in mappings for key in _MAPPING_MODALITY[name]):
            return name
    if entry.model_type and any(k in defaults for k in _STATE_SPACE):
        return "state-space/hybrid"
    if any(isinstance(defaults.get(k), int) and defaults[k] > 1 for k in _EXPERTS):
        return "MoE"
    if defaults.get("is_encoder_decoder") or "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES" in mappings:
        return "encoder-decoder"
    if text and "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" in mappings:
        return "text decoder"
    return "encoder"
