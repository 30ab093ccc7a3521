"""The tiny sizes every model of the architecture sweep is built with, and the helpers both the generic rule
(``arch_build``) and the per-type rules (``arch_overrides``, ``arch_inputs``) use."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

BLOCKS = 4  # per model; encoder-decoder configs get BLOCKS // 2 of each (global order: encoder, then decoder)
BATCH_SIZE = 2
SEQUENCE_LENGTH = 8
VOCAB_SIZE = 128
IMAGE_SIZE = 32
PATCH_SIZE = 8
AUDIO_SAMPLES = 1600  # raw waveform: survives the 320x downsampling of wav2vec2-style feature encoders
MAX_PARAMETERS = 5_000_000

#: ``model_args`` of a timm ViT-family tower (a ``timm_wrapper`` config's ``architecture``: Eva, PE core): the
#: timm model class takes them as keyword arguments over its named architecture's own.
TIMM_VIT_ARGS: dict[str, Any] = {"embed_dim": 32, "depth": BLOCKS, "num_heads": 4, "img_size": IMAGE_SIZE,
                                 "patch_size": PATCH_SIZE}

#: Input ids are drawn from [FIRST_ID, VOCAB_SIZE - RESERVED_IDS); special token ids above that range.
FIRST_ID = 4
RESERVED_IDS = 24

#: Generic tiny sizes by the names configs use for them.
SIZES: dict[str, int] = {
    **dict.fromkeys(["hidden_size", "d_model", "n_embd", "embed_dim", "dim", "n_embed", "word_embed_proj_dim",
                     "projection_dim", "text_embed_dim", "vision_embed_dim", "embedding_dim",
                     "out_hidden_size"], 32),  # out_hidden_size: a vision/audio merger's output, the text width
    **dict.fromkeys(["num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_decoder_heads", "encoder_num_attention_heads",
                     "decoder_num_attention_heads"], 4),
    **dict.fromkeys(["num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"], 2),
    **dict.fromkeys(["head_dim", "d_kv", "kv_channels", "attention_head_size", "attention_head_dim"], 8),
    **dict.fromkeys(["intermediate_size", "n_inner", "d_ff", "ffn_dim", "ffn_hidden_size", "encoder_ffn_dim",
                     "decoder_ffn_dim", "decoder_intermediate_size", "encoder_intermediate_size",
                     "mlp_dim", "hidden_dim", "projection_intermediate_size", "alignment_intermediate_size"], 64),
    **dict.fromkeys(["max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length",
                     "max_target_positions", "max_text_positions"], 64),
    **dict.fromkeys(["num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"], 4),
    **dict.fromkeys(["num_experts_per_tok", "moe_topk", "top_k_experts", "moe_top_k", "num_selected_experts",
                     "num_experts_per_token", "moe_k"], 2),
    **dict.fromkeys(["moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"], 32),
    **dict.fromkeys(["vocab_size", "text_vocab_size", "vocab_size_per_layer_input"], VOCAB_SIZE),
    "hidden_size_per_layer_input": 8,  # Gemma 3n/4 per-layer embeddings
    **dict.fromkeys(["image_size", "img_size"], IMAGE_SIZE),
    **dict.fromkeys(["patch_size"], PATCH_SIZE),
    **dict.fromkeys(["num_mel_bins"], 16),
    **dict.fromkeys(["max_source_positions"], 16),  # Whisper-style encoders take 2 * this many frames
    **dict.fromkeys(["num_conv_pos_embeddings"], 16),
    **dict.fromkeys(["num_conv_pos_embedding_groups"], 2),
    "fusion_hidden_size": 32,  # DPT-style necks: the width of every fusion stage
    "backbone_hidden_size": 32,  # an assistant model's target width (Gemma 4 assistants)
    "linear_head_dim": 8,  # linear-attention (KDA) layers of hybrid models
    "linear_num_heads": 4,
    # VQGAN image tokenizers (Chameleon, Emu3, Janus): conv widths and codebook
    **dict.fromkeys(["base_channels", "latent_channels"], 32),  # GroupNorm(32 groups) on every conv
    "num_embeddings": 64,
    "mamba_n_heads": 4,  # Mamba-2 heads of hybrid models: must divide mamba_expand * hidden_size
    "mamba_d_state": 16,
    "mamba_chunk_size": 8,
    "rotary_dim": 4,
    "embedding_size": 32,
    # multi-head latent attention (DeepSeek V2/V3 style)
    **dict.fromkeys(["kv_lora_rank", "q_lora_rank"], 16),
    **dict.fromkeys(["qk_nope_head_dim", "v_head_dim"], 8),
    "qk_rope_head_dim": 4,
    "num_frames": 2,  # video models: frames per clip
    "mm_tokens_per_image": 4,  # Gemma 3: pooled image tokens, at most the 16 patches of a tiny image
}

def find(config: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` set on ``config`` or, breadth-first, on its sub-configs."""
    queue = [config]
    while queue:
        current = queue.pop(0)
        for name in names:
            value = getattr(current, name, None)
            if value is not None and not isinstance(value, bool):
                return value
        for value in vars(current).values():
            if hasattr(value, "to_dict") and hasattr(value, "model_type"):
                queue.append(value)
    return default


def token_ids(generator: torch.Generator, length: int = SEQUENCE_LENGTH) -> torch.Tensor:
    return torch.randint(FIRST_ID, VOCAB_SIZE - RESERVED_IDS, (BATCH_SIZE, length), generator=generator)


def required(parameters: Any, name: str) -> bool:
    return name in parameters and parameters[name].default is inspect.Parameter.empty


def grid_patches(config: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL style images: every image's patches flattened to rows, and each image's (t, h, w) patch grid."""
    channels = find(config, "num_channels", "in_channels", "in_chans", default=3)
    size = find(config, "image_size", "img_size", default=IMAGE_SIZE)
    size = size if isinstance(size, int) else IMAGE_SIZE
    patch = find(config, "patch_size", default=PATCH_SIZE)
    temporal = find(config, "temporal_patch_size", "patch_temporal", default=1)
    side = size // patch
    patches = torch.randn(BATCH_SIZE * side * side, channels * temporal * patch * patch, generator=generator)
    return patches, torch.tensor([[1, side, side]] * BATCH_SIZE)


@contextlib.contextmanager
def uninitialized_memory_is_nan():
    """``torch.empty`` memory filled with NaN while the model is built, so that a weight the model's own init never
    writes is found (and seeded) every time, instead of holding whatever the allocator returned (finite garbage,
    now and then huge: non-finite gradients in one run, none in the next)."""
    from torch.utils import deterministic

    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        deterministic.fill_uninitialized_memory = previous[2]
