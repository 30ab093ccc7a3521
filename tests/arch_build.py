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

``OVERRIDES`` holds the per-type config settings the generic rule cannot guess (keyed by model type, also a
sub-config's: they update that sub-config's dict), and ``INPUT_RULES`` the per-type input rules (a batch layout
only the model's own code defines), each with its reason; ``_EXTRA_INPUTS``, ``_IMAGE_SIZES`` and
``_FEATURES_LAST`` are three small tables of inputs some models need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import re
from typing import Any, Callable

import torch

BLOCKS = 4  # per model; encoder-decoder configs get BLOCKS // 2 of each (global order: encoder, then decoder)
BATCH_SIZE = 2
SEQUENCE_LENGTH = 8
VOCAB_SIZE = 128
IMAGE_SIZE = 32
PATCH_SIZE = 8
AUDIO_SAMPLES = 1600  # raw waveform: survives the 320x downsampling of wav2vec2-style feature encoders
MAX_PARAMETERS = 5_000_000
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

#: Generic tiny sizes by the names configs use for them.
_SIZES: dict[str, int] = {
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
#: Input ids are drawn from [FIRST_ID, VOCAB_SIZE - RESERVED_IDS); special token ids above that range.
FIRST_ID = 4
RESERVED_IDS = 24

_MIMI = {"upsample_groups": 32, "num_filters": 4, "codebook_dim": 32, "codebook_size": 32,
         "vector_quantization_hidden_dimension": 32}

_MUSE_AUDIO = {"hidden_sizes": [16, 32, 32, 32], "out_hidden_size": 32}

_QWEN4_INDEXER = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 8, "indexer_budget": 4,
                  "indexer_compress_ratio": 2}

_SEAMLESS = {"speech_encoder_layers": 2, "speech_encoder_attention_heads": 4, "speech_encoder_intermediate_size": 64,
             "t2u_encoder_layers": 1, "t2u_decoder_layers": 1, "t2u_encoder_ffn_dim": 64, "t2u_decoder_ffn_dim": 64,
             "t2u_encoder_attention_heads": 4, "t2u_decoder_attention_heads": 4, "t2u_vocab_size": VOCAB_SIZE,
             "t2u_max_position_embeddings": 64, "t2u_pad_token_id": 0, "unit_hifi_gan_vocab_size": VOCAB_SIZE,
             "unit_embed_dim": 32, "upsample_initial_channel": 32, "lang_embed_dim": 8, "spkr_embed_dim": 8}
_VIBEVOICE_TOKENIZER = {"num_filters": 2, "downsampling_ratios": [2, 2, 2, 2, 2, 2]}

_UVDOC_BACKBONE = {"resnet_head": [[3, 8], [8, 8]],
                   "resnet_configs": [[[8, 8, 1, False], [8, 8, 3, False]], [[8, 16, 1, True], [16, 16, 3, False]],
                                      [[16, 32, 1, True], [32, 32, 3, False]]],
                   "stage_configs": [[[32, 1]], [[32, 2]], [[32, 5]], [[32, 8], [32, 3]], [[32, 12], [32, 7]],
                                     [[32, 18], [32, 12]]]}

#: Per-type config settings on top of the generic rule, each with why the rule cannot work.
OVERRIDES: dict[str, dict[str, Any]] = {
    # EfficientNet scales its stage widths and repeats by these coefficients (2.0 and 3.1: 55 blocks, 62M weights);
    # the text projection must match the image embedding, the last stage's width (320 * 0.25 = 80).
    "align": {"vision_config": {"width_coefficient": 0.25, "depth_coefficient": 0.25, "hidden_dim": 32},
              "projection_dim": 80},
    # Image then audio codebook tokens sit at fixed offsets of the text vocabulary (131272 and 262344 by default);
    # the audio tokenizer's filters double at each of its 4 downsamplings.
    "apertus1p5": {"image_token_offset": 64, "audio_token_offset": 80, "vision_config": {"codebook_size": 16},
                   "audio_config": {"codebook_size": 16, "num_filters": 4}},
    # Image patches -> query tokens of the projector, by patch count: the tiny image has 16 patches.
    "aria": {"projector_patch_to_query_dict": {(IMAGE_SIZE // PATCH_SIZE) ** 2: 4}},
    # Spectrogram frames: the patch grid is fixed by max_length (1024 frames by default).
    "audio-spectrogram-transformer": {"max_length": 32},
    # The decoder's start window (label_length, 10 by default) is cut from the context, here 4 steps long.
    "autoformer": {"label_length": 2},
    # The image placeholder token comes with a checkpoint (None by default).
    "blip-2": {"image_token_id": VOCAB_SIZE - RESERVED_IDS + 1},
    # Hashed byte n-gram embeddings: one table of this many rows per n-gram size.
    "blt": {"encoder_hash_byte_group_vocab": VOCAB_SIZE},
    # The BPE <-> image-token map comes with a checkpoint (None by default); the model reads "<image>" from it.
    "chameleon": {"vocabulary_map": {"<image>": VOCAB_SIZE - 1}},
    # DPT-style head widths (not named like sizes the generic rule knows).
    "chmv2": {"post_process_channels": [16, 16, 32, 32], "fusion_hidden_size": 32, "head_hidden_size": 16,
              "number_output_channels": 16},
    # The encoders' rotary width is at least 32 (max(projection_dim // (2 * heads), 32)): one 32-wide head.
    "clvp": {"text_config": {"num_attention_heads": 1}, "speech_config": {"num_attention_heads": 1}},
    # The default config has no rotary parameters per layer type (checkpoints set them); the model indexes them.
    "cohere_compass_text": {"rope_parameters": {"full_attention": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}},
    # DETR-family defaults use a timm ResNet; the transformers ResNet backbone (same stages) needs no timm.
    **dict.fromkeys(["conditional_detr", "deformable_detr", "detr"], {"backbone_config": {
        "model_type": "resnet", "embedding_size": 16, "hidden_sizes": [16, 16, 16, 16], "depths": [1, 1, 1, 1],
        "out_features": ["stage1", "stage2", "stage3", "stage4"]}}),
    # The Mimi codec's upsampling conv is depthwise over its hidden size (512 groups by default); its filters double
    # at each of its 4 downsamplings.
    "csm": {"codec_config": {"upsample_groups": _SIZES["hidden_size"], "num_filters": 2}},
    # The attention reads attn_config.rope_theta and clamps by clip_qkv unconditionally: the checkpoints set both,
    # the default has no rope_theta and clip_qkv=None (clamp(None, None) raises).
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # The SAM neck's downsampling convs end at the encoder's width (896 by default).
    "deepseek_ocr2_sam_vision_model": {"downsample_channels": [_SIZES["hidden_size"]] * 2},
    # MoE layer kinds and top-k are None by default (checkpoints set them); the model indexes them per layer.
    "deepseek_ocr2_text": {"mlp_layer_types": ["dense"] + ["sparse"] * (BLOCKS - 1), "num_experts_per_tok": 2},
    # The config leaves the expert top-k unset (None: only checkpoints set it) and the MoE layers need it.
    "deepseek_v2": {"num_experts_per_tok": 2},
    # The high-resolution SAM tower's neck width (its projection convs quadruple it).
    "deepseek_vl_hybrid": {"high_res_vision_config": {"output_channels": 16}},
    # Neck widths of the multi-scale fusion, and the hooked encoder layers (of the full 24-layer encoder).
    "depth_pro": {"scaled_images_feature_dims": [32, 32, 32], "intermediate_feature_dims": [32, 32],
                  "fusion_hidden_size": 32, "intermediate_hook_ids": [BLOCKS - 1, 1]},
    # Expert counts are None by default (checkpoints set them) and every layer builds its experts.
    "diffusion_gemma_text": {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32},
    # Swin windows must fit every stage's resolution (the relative-position table is sized by window_size): a
    # 16x16 patch grid halves to 2x2 at the 4th stage.
    "donut-swin": {"image_size": 64, "patch_size": 4, "window_size": 2},
    # The serialized layout counts an attention and an mlp entry per layer (twice the layers). Input / recurrent /
    # output sections (4 input and 4 output layers by default) split the tiny depth. The recurrent section runs
    # n_recurrent_loops (2) times per forward, which counting cannot tell from a recompute: the sweep trains the
    # one-loop configuration.
    "dory": {"num_hidden_layers": 2 * BLOCKS, "n_input_layers": 2, "n_recurrent_layers": 2 * (BLOCKS - 2),
             "n_output_layers": 2, "n_recurrent_loops": 1,
             "layer_types": ["sliding_attention", "mlp"] * (BLOCKS - 1) + ["full_attention", "mlp"]},
    # The config leaves the expert counts unset (None: only checkpoints set them) and the MoE layers need them.
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    # Sliding-window layers use plain attention whose head size must be the MLA query's (nope + rope parts).
    "dots3_note_text": {"head_dim": _SIZES["qk_nope_head_dim"] + _SIZES["qk_rope_head_dim"]},
    # RepVGG stages (1, 2, 4, 14 blocks up to 256 channels); the last stage's width must be the hidden size; the
    # 2D rotary table is hidden_size / 2 wide and fills it only with the default 8 heads (head size * 4 / 2 each).
    "efficientloftr": {"stage_num_blocks": [1, 1, 1, 1], "out_features": [16, 16, 32, _SIZES["hidden_size"]],
                       "num_attention_heads": 8, "num_key_value_heads": 8},
    # The BPE <-> image-token map comes with a checkpoint (None by default); the model reads two entries of it.
    "emu3": {"vocabulary_map": {"<image>": VOCAB_SIZE - 1, "<|extra_200|>": VOCAB_SIZE - 2}},
    "emu3_vqgan": {"codebook_size": 64},  # "codebook_size" is not shrunk generically: audio codecs size by it
    # M-RoPE sections in (h, w, t) order, the h and w ones interleaved pairwise: they must be equal.
    "ernie4_5_vl_moe_text": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                                 "mrope_section": [1, 1, 2]}},
    # DaViT stage widths and channel-attention groups are lists named unlike the generic per-stage lists.
    "florence2": {"vision_config": {"embed_dim": [32] * 4, "num_groups": [2] * 4}},
    # The adaptor's width is fixed to a quarter of the text model's (checked by the config).
    "fun_asr_nano": {"adaptor_config": {"intermediate_size": _SIZES["hidden_size"] // 4}},
    # The last 15 of 35 layers reuse the cache of an earlier layer of each attention kind: both kinds must stay
    # among the first layers.
    "gemma3n_text": {"layer_types": ["sliding_attention", "full_attention"] * (BLOCKS // 2),
                     "num_kv_shared_layers": BLOCKS // 2},
    # The default text config is Gemma 4's, with per-layer inputs, MoE blocks and double-wide MLPs that the
    # assistant's own validation rejects (Gemma4AssistantConfig() raises).
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
                                         "enable_moe_block": False, "use_double_wide_mlp": False}},
    # The audio projection's input is (channels[0] // 4) * channels[1]: full-size channels give a 1024-wide input.
    "gemma4_audio": {"subsampling_conv_channels": [16, 8], "output_proj_dims": 32},
    # The local/global attention pattern is a list of (pattern, repeats) that must add up to the layer count.
    "gpt_neo": {"attention_types": [[["global", "local"], BLOCKS // 2]]},
    # Vision -> text injection points name layers of the full-size towers (none by default for the deepstack);
    # Q-Former heads are the vision width // 64 (zero below 64); the window downsampling rate has no default.
    "granite4_vision": {"deepstack_layer_map": [[-2, 0], [-1, 1]], "spatial_target_layers": list(range(BLOCKS)),
                        "vision_config": {"hidden_size": 64}, "downsample_rate": "1/2"},
    # Vision layers whose features the connector stacks, of the full-size 12-layer tower.
    "granite_docling_vision": {"deepstack_visual_indexes": [1, 2, 3]},
    # Chunked local attention: the context must fit the tiny position table.
    "granite_speech5_encoder": {"context_size": 16, "num_key_value_heads": 4},
    # Mamba heads must split mamba_expand * hidden_size (64) into heads of mamba_d_head.
    "granitemoehybrid": {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16},
    # Hiera's sizes are (height, width) pairs: the tiny image, the patch grid 8 x 8 = one 8 x 8 mask unit.
    "hiera": {"image_size": [IMAGE_SIZE, IMAGE_SIZE]},
    # A recurrent model: by default its low- and high-level stacks run H_cycles * L_cycles and H_cycles times a
    # step (each block runs several times without checkpointing); one cycle of each runs every block once (two
    # stacks of 2 make the 4 layers), which is what counting recomputed blocks needs.
    "hrm_text": {"H_cycles": 1, "L_cycles": 1, "L_bp_cycles": [1], "num_layers_per_stack": BLOCKS // 2},
    # The default rope has no multimodal sections, which the rotary embedding requires (real checkpoints set them):
    # sequence, width, height and image axes over the 4 rotary pairs of the tiny head.
    "hunyuan_vl": {"text_config": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                                       "mrope_section": [1, 1, 1, 1]}}},
    "hunyuan_vl_text": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                            "mrope_section": [1, 1, 1, 1]}},
    # The rotary part of the tiny latent attention is 4 wide: its (t, h, w) sections must sum to 2.
    "hy_v4_vl": {"text_config": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                                     "mrope_section": [1, 1, 0]}}},
    "hy_v4_vl_text": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default", "mrope_section": [1, 1, 0]}},
    # The default config freezes the vision and text layers (no parameter gradients, though the gradient still
    # flows through the text layers to the trainable cross-attention between them): train every block.
    "idefics": {"freeze_text_layers": False, "freeze_vision_layers": False},
    # The merger's widths (its hidden layer, and its output: the text model's width) have names of their own.
    **dict.fromkeys(["inkling2", "inkling2_loop"],
                    {"vision_config": {"projection_hidden_dim": 32, "text_hidden_size": 32}}),
    "inkling2_vision": {"projection_hidden_dim": 32, "text_hidden_size": 32},
    # The image placeholder token has no default id (real checkpoints add it to the tokenizer); the Q-Former's
    # query tokens (the image's tokens in the text) must fit the tiny sequence.
    "instructblip": {"image_token_index": VOCAB_SIZE - 1, "num_query_tokens": 4},
    "instructblipvideo": {"video_token_index": VOCAB_SIZE - 1, "num_query_tokens": 4},
    # The VQ image tokenizer's widths (multiples of its 32 norm groups) and codebook have names of their own.
    "janus": {"vq_config": {"base_channels": 32, "latent_channels": 32, "num_embeddings": 64,
                            "image_token_embed_dim": 32},
              "vision_config": {"num_image_tokens": (IMAGE_SIZE // PATCH_SIZE) ** 2}},
    # The linear-attention (KDA) heads and the routed experts per token have names of their own.
    "kimi_linear": {"linear_head_dim": 8, "linear_num_heads": 4, "num_experts_per_token": 2},
    # The number of latent image queries must fit the tiny sequence.
    "kosmos-2": {"latent_query_num": 4, "text_config": {"layers": BLOCKS}},  # (text layers: a name of their own)
    # The speech model reads the text token plus one token per codebook at each step; its codec is Mimi.
    "kyutai_speech_to_text": {"num_codebooks": 4, "codebook_vocab_size": 32, "codec_config": _MIMI},
    # layer_types has no default (None), and the decoder layers index it: conv and attention layers alternate.
    "lfm2_moe": {"layer_types": ["conv", "full_attention"] * (BLOCKS // 2)},
    # Six layout embeddings (4 box sides, height, width) of hidden_size // 6 each make up the hidden size.
    "lilt": {"hidden_size": 48},
    # The vision adapter and projector widths and the dense MLP size have names of their own; the vision MLP
    # reads the pixel-shuffled features (4 x hidden wide) as intermediate_size.
    "llama4": {"vision_config": {"vision_output_dim": 32, "projector_input_dim": 32, "projector_output_dim": 32,
                                 "intermediate_size": 128},
               "text_config": {"intermediate_size_mlp": 64}},
    # The experts' width and the identity ("zero") experts have names of their own.
    "longcat_flash": {"expert_ffn_hidden_size": 32, "zero_expert_num": 2},
    # The entity vocabulary and embedding width have names of their own.
    "luke": {"entity_vocab_size": 64, "entity_emb_size": 16},
    # Windowed attention: the patch grid (32 / 8 = 4 patches a side) must split into num_windows square windows.
    "lw_detr_vit": {"num_windows": 4, "num_windows_side": 2},
    # hidden_size * expand must equal num_heads * head_dim (4 * 8), and n_groups divide num_heads.
    "mamba2": {"expand": 1, "n_groups": 1, "state_size": 16},
    # The Mimi codec: the upsampling is a grouped (depthwise) transposed convolution, one group per hidden channel;
    # its convolution widths (num_filters doubled per stage) and codebooks have names of their own.
    **dict.fromkeys(["mimi", "mimi_decoder", "mimi_encoder"], _MIMI),
    # The window-attention merger runs after layer insert_layer_id, which must be one of the tiny layers.
    **dict.fromkeys(["minicpm_ocr_vision", "minicpmv4_7_vision"], {"insert_layer_id": BLOCKS // 2 - 1}),
    # The rotary share (rope / (nope + rope) head dims) of the tiny sizes, 4 / 12, floors to 3 rotated dims: an
    # even 4 + 4 split rotates exactly half.
    "mistral4": {"qk_nope_head_dim": 4, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 1.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1,
        "partial_rotary_factor": 0.5}},
    # Global vision layers, the vision layers whose outputs are kept and the text layers with cross-attention are
    # counts and indices of their own; one tile of one aspect ratio per image.
    "mllama": {"vision_config": {"num_global_layers": BLOCKS // 2, "intermediate_layers_indices": [1, 3],
                                 "max_num_tiles": 1, "supported_aspect_ratios": [[1, 1]],
                                 "vision_output_dim": 32 * 3},  # hidden x (kept layers + last)
               "text_config": {"cross_attention_layers": [1, 3]}},
    # MobileViTv2 unfolds 2 x 2 patches of its last 1/32 feature map: the default patch size, a 64-pixel image.
    "mobilevitv2": {"patch_size": 2, "image_size": 64},
    # The adapter reads vision layers by index (the default ones exist in the 25-layer tower only) and projects to
    # the text width (a field of its own); the positional table is one entry per patch of the crop (the tiny image:
    # 4 x 4 patches); the image token id (image_patch_id) must be inside the tiny vocabulary.
    "molmo2": {"adapter_config": {"vision_feature_layer": [BLOCKS - 1, BLOCKS - 2], "text_hidden_size": 32},
               "vision_config": {"num_position_embeddings": (IMAGE_SIZE // PATCH_SIZE) ** 2},
               "image_patch_id": VOCAB_SIZE - RESERVED_IDS // 2},
    # The config has no num_key_value_heads field, but the decoder's attention reads it.
    "moonshine_streaming": {"num_key_value_heads": 4},
    # The vision adapter's widths have names of their own (its input: 2 x 2 merged vision features).
    "muse_glimmer": {"out_hidden_size": 4 * 32, "projector_hidden_size": 32},
    # The draft block (tokens proposed at once) must fit the tiny sequence.
    "muse_glimmer_assistant": {"block_size": 4},
    # As Muse Glimmer, with an audio encoder (see muse_spark_audio) and experts (see muse_spark_text).
    "muse_spark": {"out_hidden_size": 4 * 32, "projector_hidden_size": 32, "audio_config": _MUSE_AUDIO,
                   "text_config": {"moe_hidden_size": 32}},
    # The audio encoder's stage widths are a list as long as its layer count (so no per-layer list to cut).
    "muse_spark_audio": _MUSE_AUDIO,
    # The experts' width has a name of its own.
    "muse_spark_text": {"moe_hidden_size": 32},
    # Its Nemotron-H text model's depth is the length of layers_block_type (no layer count to shrink); the Mamba
    # heads must split expand * hidden_size (64); the shared expert's width has a name of its own.
    "nemo_speechlm": {"text_config": {
        "layers_block_type": ["linear_attention", "moe", "full_attention", "moe"], "mamba_num_heads": 4,
        "mamba_head_dim": 16, "n_groups": 1, "ssm_state_size": 16, "moe_shared_expert_intermediate_size": 32}},
    # num_key_value_heads defaults to None, which the attention divides by.
    "nemotron": {"num_key_value_heads": 2},
    # The transducers' prediction network (an LSTM) has a width of its own.
    **dict.fromkeys(["nemotron3_5_asr", "nemotron_asr_streaming", "parakeet_rnnt", "parakeet_tdt"],
                    {"decoder_hidden_size": 32}),
    # The placeholder token has no default id (real checkpoints add it to the tokenizer).
    "nemotron_h_omni": {"image_token_id": VOCAB_SIZE - 1},
    # Every 6th layer is global: the first 4 layers of the default pattern would have none.
    # (with a quarter of the tiny head rotated, 2 dims, too few for its two M-RoPE axes: rotate half).
    "neomme": {"layer_types": ["sliding_attention", "full_attention"] * (BLOCKS // 2),
               "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "default", "rope_theta": 1000000.0,
                                                      "partial_rotary_factor": 0.5}}},
    # The acoustic encoder doubles encoder_hidden_size at each of its 5 downsampling stages; the quantizer's and
    # the semantic (w2v-BERT) encoder's widths have names of their own (the quantizer reads both concatenated); its
    # decoder's rotary attention has no grouped K/V heads.
    "neucodec": {"encoder_hidden_size": 2, "quantization_dim": 2 * 32, "num_key_value_heads": 4,
                 "semantic_model_config": {"tdnn_dim": [16, 16, 16, 16, 32], "xvector_output_dim": 16,
                                           "feature_projection_input_dim": 32}},
    # No multimodal rotary sections in the default rope: the model falls back to [16, 24, 24] (a 128-wide head).
    "paddleocr_vl": {"text_config": {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default",
                                                         "mrope_section": [2, 1, 1]}}},
    # Its DAC audio embedder doubles encoder_hidden_size at each downsampling stage; the DAC's decoder and codebook
    # widths have names of their own.
    "pe_audio": {"audio_config": {"dac_config": {"encoder_hidden_size": 2, "decoder_hidden_size": 32,
                                                 "codebook_dim": 8, "n_codebooks": 2}}},
    # The DAC feature encoder's widths double per downsampling (64 -> 1024) and its strides multiply to 1920.
    "pe_audio_encoder": {"dac_config": {"encoder_hidden_size": 4, "downsampling_ratios": [2, 2, 2, 2],
                                        "decoder_hidden_size": 16, "upsampling_ratios": [2, 2, 2, 2],
                                        "hop_length": 16}},
    # The upsampling convolution is grouped: its groups must divide the (tiny) hidden size.
    "pocket_tts_audio_tokenizer": {"upsample_groups": 32},
    "pocket_tts_audio_tokenizer_decoder": {"upsample_groups": 32},  # as pocket_tts_audio_tokenizer
    # Channels are the block_configs widths times scale (up to 512).
    "pp_lcnet_v3": {"scale": 0.25},
    # The CTC head's output is the character set (18385).
    "pp_ocrv5_mobile_rec": {"head_out_channels": VOCAB_SIZE},
    # As pp_ocrv5_mobile_rec; the HGNetV2 backbone's stems and stages have their own widths and depths.
    "pp_ocrv5_server_rec": {"head_out_channels": VOCAB_SIZE, "backbone_config": {
        "stem_channels": [3, 16, 16], "stage_in_channels": [16, 32, 64, 128], "stage_mid_channels": [16, 16, 32, 32],
        "stage_out_channels": [32, 64, 128, 128], "stage_num_blocks": [1, 1, 1, 1],
        "stage_numb_of_layers": [2, 2, 2, 2]}},
    "pp_ocrv6_small_rec": {"head_out_channels": VOCAB_SIZE},  # as pp_ocrv5_mobile_rec
    # Upstream: get_rope_index reads config.vision_start_token_id, which the thinker config does not declare.
    "qwen2_5_omni_thinker": {"vision_start_token_id": VOCAB_SIZE - RESERVED_IDS},
    "qwen3_omni_moe_thinker": {"vision_start_token_id": VOCAB_SIZE - RESERVED_IDS},  # as qwen2_5_omni_thinker
    # The sparse-attention indexer is built on every attention layer but its sizes default to None.
    "qwen4_exp": {"text_config": _QWEN4_INDEXER},
    "qwen4_exp_text": _QWEN4_INDEXER,
    # The glyph-shape and pronunciation embeddings have their own vocabularies and widths.
    "roc_bert": {"shape_embed_dim": 32, "shape_vocab_size": VOCAB_SIZE, "pronunciation_vocab_size": VOCAB_SIZE},
    # The prompt encoder's dense grid is image_size / patch_size of the vision encoder; windows and positions fit it.
    "sam": {"prompt_encoder_config": {"image_embedding_size": IMAGE_SIZE // PATCH_SIZE},
            "vision_config": {"window_size": 2, "global_attn_indexes": [1, 3], "num_pos_feats": 16}},
    "sam_hq": {"prompt_encoder_config": {"image_embedding_size": IMAGE_SIZE // PATCH_SIZE},
               "vision_config": {"window_size": 2, "global_attn_indexes": [1, 3], "num_pos_feats": 16}},  # as sam
    # Per-layer key/value heads and the full-attention layers at both ends are sized for 24 layers.
    "sapiens2": {"num_key_value_heads_per_layer": [4, 2, 2, 4], "num_key_value_attention_heads": 2,
                 "num_first_full_attention_layers": 1, "num_last_full_attention_layers": 1},
    # The speech encoder, text-to-unit model and HiFi-GAN vocoder have their own sizes; t2u positions reserve pad.
    "seamless_m4t": _SEAMLESS,
    "seamless_m4t_v2": _SEAMLESS,  # as seamless_m4t
    # The image and its prompt are stacked (image_size is their joint height x width); decoder taps after the merge.
    "seggpt": {"image_size": [2 * IMAGE_SIZE, IMAGE_SIZE], "pretrain_image_size": IMAGE_SIZE,
               "intermediate_hidden_state_indices": [1, 2, 3], "merge_index": 0},
    # Its layer pattern has sliding-window layers but the window defaults to None.
    "step3p7": {"text_config": {"sliding_window": 4}},
    # Swin: the relative position bias is sized by window_size at init, but a stage smaller than the window
    # clamps the window at forward, so the last stage (image / patch / 8) must stay at least one window wide.
    "swin": {"image_size": 64, "patch_size": 4, "window_size": 2},
    # Swin2SR keeps the full resolution (patch 1); 8x8 windows need more than the 4x4 grid of the tiny rule.
    "swin2sr": {"patch_size": 1, "window_size": 4},
    "swinv2": {"patch_size": 4, "window_size": 2},  # as Swin: windows no wider than the last stage
    # Upstream: the encoder's layers read text_config.dropout_rate, which T5Gemma2TextConfig does not declare.
    "t5gemma2_encoder": {"text_config": {"dropout_rate": 0.0}},
    # The forecast horizon has no default; short windows, two lags and one time feature.
    "time_series_transformer": {"prediction_length": 4, "context_length": 4, "lags_sequence": [1, 2],
                                "num_time_features": 1},
    # The visual prompter pads frames to max_img_size and frames a border of visual_prompt_size.
    "tvp": {"max_img_size": 2 * IMAGE_SIZE, "visual_prompt_size": 4},  # the ResNet grid pools 64 -> 1
    # The SAM encoder's output convolutions and windowed/global attention pattern have their own sizes.
    "unlimited_ocr": {"vision_config": {"sam_config": {"output_channels": 32, "downsample_channels": [32, 32],
                                                      "window_size": 2, "global_attn_indexes": [1, 3]}}},
    # UVDoc concatenates the bridge outputs of every stage (its head reads 6 x their width): all six are outputs.
    "uvdoc": {"backbone_config": {**_UVDOC_BACKBONE, "out_features": [f"stage{i}" for i in range(1, 7)],
                                  "out_indices": list(range(1, 7))},
              "bridge_connector": [32, 32], "out_point_positions2D": [[32, 32], [32, 2]]},
    # The ResNet stem and stages and the dilated bridge blocks have their own widths (32 to 128).
    "uvdoc_backbone": _UVDOC_BACKBONE,
    # The tokenizer encoders double their width per downsampling stage (32 -> 2048), strides multiply to 3200.
    "vibevoice": {"audio_config": _VIBEVOICE_TOKENIZER, "semantic_model_config": _VIBEVOICE_TOKENIZER},
    "vibevoice_asr": {"acoustic_tokenizer_encoder_config": _VIBEVOICE_TOKENIZER,
                      "semantic_tokenizer_encoder_config": _VIBEVOICE_TOKENIZER},  # as vibevoice
    # The projector reads five vision layers (default -2, -5, -8, -11, 6 of 24).
    "vipllava": {"vision_feature_layers": [-1, -2, -3, -4, -5]},
    # Upstream: the default fusion_hidden_sizes is a tuple, but the decoder prepends a list to it.
    # Its fusion upsamples the ViT features (1/16 of the image) to meet the detail features at 1/8: patch 16.
    "vitmatte": {"fusion_hidden_sizes": [32, 16, 16, 8], "backbone_config": {"patch_size": 16}},
    # The experts' part features are a slice of the MLP width (256 of 3072); the image size is a list (H, W); one
    # expert, the default (more need a dataset_index input per sample).
    "vitpose": {"backbone_config": {"part_features": 8, "image_size": [IMAGE_SIZE, IMAGE_SIZE], "num_experts": 1}},
    "vitpose_backbone": {"part_features": 8, "image_size": [IMAGE_SIZE, IMAGE_SIZE], "num_experts": 1},  # as vitpose
    # The HiFi-GAN vocoder, duration predictor and posterior encoder have their own widths and depths.
    "vits": {"upsample_initial_channel": 32, "duration_predictor_filter_channels": 32,
             "posterior_encoder_num_wavenet_layers": 2, "spectrogram_bins": 16},
    # The predictor has its own width and heads; positions follow the crop size.
    "vjepa2": {"pred_hidden_size": 32, "pred_num_attention_heads": 4, "crop_size": IMAGE_SIZE},
    # The acoustic encoder doubles its width per stride; the quantizer reads both encoders (2 x hidden); no GQA.
    "xcodec2": {"encoder_hidden_size": 4, "downsampling_ratios": [2, 2, 2, 2, 2], "quantization_dim": 64,
                "num_key_value_heads": 4},
    # The shared transformer is tied across hybrid layers: the tiny stack needs two of them.
    "zamba": {"layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]},
    # ZAYA routes each token to one expert only (checked by the config).
    "zaya": {"num_experts_per_tok": 1},
    # The metric head reads the neck's fusion output through convolutions of this width.
    "zoedepth": {"bottleneck_features": 32},
}


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
    declared = getattr(parent, "sub_configs", {}).get(key)
    if isinstance(declared, type) and declared.__name__ != "AutoConfig":
        return declared
    with contextlib.suppress(KeyError):
        return config_class(value["model_type"])
    return None


def _shrink_list(name: str, value: list, layers: int | None) -> list | None:
    per_layer = bool(layers and len(value) == layers and value) and name not in _STAGE_LISTS
    if name == "intermediate_size" and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [_SIZES[name]] * (BLOCKS if layers and len(value) == layers else len(value))  # per-layer MLP widths
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
    shrunk = {k: _SIZES[k] if k in _SIZES and _is_number(v) and v else v for k, v in value.items()}
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
                widths: set[int] | None = None) -> dict[str, Any]:
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
            sub = _sub_config_class(cls, name, value)
            if sub is not None:
                kwargs[name] = {**value, **tiny_kwargs(sub, value, tokens, widths=widths),
                                **OVERRIDES.get(value["model_type"], {})}  # a sub-model's own overrides
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
        if name in _SIZES and (value is None or isinstance(value, int)):
            if (value is None and name not in ("head_dim", "vocab_size")) or value == 0:  # 0: absent (NoPE)
                continue
            kwargs[name] = _SIZES[name]
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
            kwargs[name] = _SIZES["hidden_size"]
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
    if (isinstance(rope, dict) and "rope_type" in rope and "mrope_section" not in rope
            and "mrope_section" in getattr(cls, "ignore_keys_at_rope_validation", ())):
        # the model falls back to a full-size section list when the config has none (GLM-4V)
        kwargs["rope_parameters"] = {**rope, "mrope_section": _mrope_section(rope, defaults)}
    kwargs.update(_backbone_outputs(defaults, layers))
    if layers and defaults.get("num_kv_shared_layers") == layers:  # every layer reuses another model's cache
        kwargs["num_kv_shared_layers"] = BLOCKS
    if isinstance(defaults.get("image_grid_pinpoints"), list):  # any-resolution tiles: one tiny image size
        kwargs["image_grid_pinpoints"] = [[IMAGE_SIZE, IMAGE_SIZE]]
    if "kv_lora_rank" in defaults and "num_key_value_heads" in kwargs:
        # multi-head latent attention expands its latent K/V to one head per query head
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", _SIZES["num_attention_heads"])
    _follow_depth(defaults, kwargs)
    if "qk_rope_head_dim" in defaults and "head_dim" in defaults:
        kwargs["head_dim"] = _SIZES["qk_rope_head_dim"]  # multi-head latent attention: head_dim is the rope part
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


def _mrope_section(rope: dict, defaults: dict) -> list[int]:
    """Multimodal rotary sections (t, h, w) summing to half the tiny rotary width (head size 8 times the
    partial rotary factor)."""
    factor = rope.get("partial_rotary_factor", defaults.get("partial_rotary_factor")) or 1.0
    half = int(_SIZES["head_dim"] * factor) // 2
    t = (half + 1) // 2
    h = (half - t + 1) // 2
    return [t, h, half - t - h]


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
        defaults = cls().to_dict()
    except Exception:  # noqa: BLE001 (defaults its own validation rejects: start from the per-type settings)
        defaults = cls(**OVERRIDES.get(model_type, {})).to_dict()
    kwargs = _merge(tiny_kwargs(cls, defaults, _Tokens()), OVERRIDES.get(model_type, {}))
    return cls(**kwargs)


class NotTiny(Exception):
    """The generic rule does not make this model type tiny."""


def build(entry: ModelType, seed: int = 0) -> torch.nn.Module:
    """A tiny fp32 instance of ``entry``'s class in training mode; the same ``seed`` gives the same weights."""
    config = tiny_config(entry.model_type)
    model_class = entry.model_class()
    wanted = getattr(model_class, "config_class", None)
    if isinstance(wanted, type) and not isinstance(config, wanted):  # a base class built from one part of its
        config = next((v for v in vars(config).values() if isinstance(v, wanted)), config)  # type's composite config
    with torch.device("meta"):  # sizes first, without allocating: a missed size would build a full-size model
        parameters = sum(p.numel() for p in model_class(config).parameters())
    if parameters > MAX_PARAMETERS:
        raise NotTiny(f"{entry.model_type} still has {parameters} parameters with the tiny config")
    torch.manual_seed(seed)
    model = model_class(config).float().train()
    model._sweep_model_type = entry.model_type  # the key of INPUT_RULES (a sub-config has a type of its own)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if not torch.isfinite(parameter).all():  # never written by the model's own init (torch.empty)
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


# ------------------------------------------------------------------------------------------------------- inputs


def _find(config: Any, *names: str, default: Any = None) -> Any:
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


def _ids(generator: torch.Generator, length: int = SEQUENCE_LENGTH) -> torch.Tensor:
    return torch.randint(FIRST_ID, VOCAB_SIZE - RESERVED_IDS, (BATCH_SIZE, length), generator=generator)


def _image_token_id(config: Any) -> int | None:
    return _find(config, "image_token_id", "image_token_index")


_FEATURES = re.compile(r"tokens: \d+, features:? (\d+)|Got (\d+) feature vectors for \d+ placeholder tokens")


def inputs(model: torch.nn.Module, seed: int = 0) -> dict[str, Any]:
    """A batch for ``model`` from its ``main_input_name`` and ``forward`` signature.

    A model with a vision sub-config that takes ``pixel_values`` next to ``input_ids`` gets both. Where it also has
    an image token (vision-language models), the number of image tokens per sequence is what the model's own
    check asks for: the first forward (no gradients) with no image token raises "... tokens: 0, features: N",
    and the batch then carries N / batch-size image tokens per sequence.
    """
    parameters = inspect.signature(model.forward).parameters
    pixels = "pixel_values" in parameters and _find(model.config, "vision_config") is not None
    batch = _inputs(model, seed, pixels=pixels)
    if not (pixels and "input_ids" in batch and _image_token_id(model.config) is not None):
        return batch
    candidates: list[int] | None = None
    while True:
        try:
            with torch.no_grad():
                model(**batch)
            return batch
        except (ValueError, RuntimeError) as error:
            found = _FEATURES.search(str(error))
            if not (found or "image tokens" in str(error)) or candidates == []:
                raise
            if candidates is None and found:  # "features": a token count or tokens x hidden size, over the batch
                features = int(found.group(1) or found.group(2))
                hidden = _find(model.config, "hidden_size", default=1)
                candidates = [c for c in (features // BATCH_SIZE, features // BATCH_SIZE // hidden, features) if c]
            elif candidates is None:  # older releases: one token per image, expanded by the model, or one per patch
                patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
                candidates = [1, patches, patches + 1]
            batch = _inputs(model, seed, pixels=True, image_tokens=candidates.pop(0))


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
    wanted += [n for n in ("pixel_values", "input_features", "input_values") if _required(parameters, n)
               and n not in wanted]
    wanted += [name for name in _EXTRA_INPUTS.get(config.model_type, []) if name != "image_sizes"]
    for name in wanted:
        if name == "input_ids":
            ids = _ids(generator)
            token = _image_token_id(config)
            if image_tokens and token is not None:
                ids = torch.cat([torch.full((BATCH_SIZE, image_tokens), token), ids], dim=1)
            batch["input_ids"] = ids
            if "mm_token_type_ids" in parameters and image_tokens:  # 1 marks an image token (GLM-4V, Qwen-VL)
                batch["mm_token_type_ids"] = (ids == token).long()
            if "attention_mask" in parameters:
                batch["attention_mask"] = torch.ones_like(ids)
        elif name == "pixel_values":
            channels = _find(config, "num_channels", "in_channels", "in_chans", default=3)
            size = _find(config, "image_size", "img_size", default=IMAGE_SIZE)
            size = _IMAGE_SIZES.get(config.model_type, size if isinstance(size, int) else IMAGE_SIZE)
            frames = _find(config, "num_frames") or (2 if _matches_pairs(config.model_type) else None)
            shape = (BATCH_SIZE, channels, size, size) if not frames else (BATCH_SIZE, frames, channels, size, size)
            any_resolution = _find(config, "image_grid_pinpoints") is not None
            if "image_sizes" in parameters and (any_resolution or "image_sizes" in _EXTRA_INPUTS.get(
                    config.model_type, [])):  # each image's true (height, width)
                batch["image_sizes"] = torch.tensor([[size, size]] * BATCH_SIZE)
                if any_resolution:
                    # LLaVA-NeXT style (any-resolution): the base image and its one tile (the tiny pinpoint grid)
                    shape = (BATCH_SIZE, 2, channels, size, size)
            if "tile_fine_mask" in parameters:  # Granite Docling: tiles per sample, and which are real
                shape = (BATCH_SIZE, 1, channels, size, size)
                batch["pixel_attention_mask"] = torch.ones(BATCH_SIZE, 1, dtype=torch.bool)
            grid = next((g for g in ("image_grid_thw", "grid_thw", "image_grid_hw") if g in parameters), None)
            if grid:  # Qwen2-VL style: flattened patches and a (t, h, w) grid per image (its vision tower: grid_thw)
                batch["pixel_values"], thw = _grid_patches(config, generator)
                batch[grid] = thw[:, 1:] if grid.endswith("_hw") else thw
                if "image_merge_sizes" in parameters:  # VideoLLaMA3: each image's spatial merge
                    batch["image_merge_sizes"] = torch.full((BATCH_SIZE,), _find(config, "spatial_merge_size", default=1))
                if "images_per_sample" in parameters:  # GLM-Image: each sample's grids end with its target's
                    batch[grid] = batch[grid].repeat_interleave(2, dim=0)
                    batch["images_per_sample"] = torch.tensor([2] * BATCH_SIZE)
                continue
            batch["pixel_values"] = torch.randn(*shape, generator=generator)
        elif name == "input_features":
            bins = _find(config, "num_mel_bins", "feature_size", "input_feat_per_channel", default=16)
            frames = 2 * (_find(config, "max_source_positions", default=16) or 16)
            width = _features_last(model)
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
            channels = _find(config, "num_channels", "in_channels", "in_chans", default=3)
            size = _find(config, "image_size", "crop_size", "img_size", default=IMAGE_SIZE)
            size = size if isinstance(size, int) else IMAGE_SIZE
            frames = _find(config, "num_frames", default=None) or max(2, _find(config, "tubelet_size", default=2))
            batch[name] = torch.randn(BATCH_SIZE, frames, channels, size, size, generator=generator)
        elif name == "inputs_embeds":
            batch["inputs_embeds"] = torch.randn(BATCH_SIZE, SEQUENCE_LENGTH, config.hidden_size, generator=generator)
    if "qformer_input_ids" in parameters:  # InstructBLIP: the instruction, read by the Q-Former too
        batch["qformer_input_ids"] = _ids(generator)
        batch["qformer_attention_mask"] = torch.ones_like(batch["qformer_input_ids"])
    if main == "past_values" and hasattr(config, "lags_sequence"):  # GluonTS-style forecasters (Autoformer)
        batch.update(_time_series(config, generator))
    if "input_features_mask" in parameters and "input_features" in batch:  # every frame valid
        features = batch["input_features"]
        frames = features.shape[-1] if _features_last(model) is None else features.shape[1]
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
        side = _find(config, "image_size", default=IMAGE_SIZE) // _find(config, "patch_size", default=PATCH_SIZE)
        patch = _find(config, "patch_size", default=PATCH_SIZE)
        grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="xy"), -1).reshape(-1, 2)
        batch["pixel_values"] = torch.rand(BATCH_SIZE, side * side, 3 * patch * patch, generator=generator)
        batch["pixel_position_ids"] = grid.expand(BATCH_SIZE, -1, -1).clone()
    if "grid_thw" in parameters:  # a Qwen2-VL-style vision tower alone: its first argument takes the patches
        first = next(iter(parameters))
        batch = {first: None, "grid_thw": None}
        batch[first], batch["grid_thw"] = _grid_patches(config, generator)
        if _required(parameters, "merge_sizes"):  # VideoLLaMA3: the spatial merge of each image
            batch["merge_sizes"] = torch.full((BATCH_SIZE,), _find(config, "spatial_merge_size", default=1))
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters:
        channels = getattr(getattr(config, "decoder_config", None), "num_channels", None)
        batch["decoder_input_ids"] = _ids(generator)
        if channels:  # audio codebooks (Dia): one id per channel and step
            batch["decoder_input_ids"] = torch.randint(FIRST_ID, VOCAB_SIZE - RESERVED_IDS,
                                                       (BATCH_SIZE, SEQUENCE_LENGTH, channels), generator=generator)
    rule = INPUT_RULES.get(getattr(model, "_sweep_model_type", getattr(config, "model_type", "")))
    if rule is not None:
        batch.update(rule(model, batch, generator) or {})
    for name, value in (("use_cache", False), ("return_dict", True)):
        if name in parameters:
            batch[name] = value
    return batch


def _frames_first(model: torch.nn.Module, batch: dict, generator: torch.Generator, stack: int = 1) -> dict:
    """Features as ``(batch, frames, num_mel_bins * stack)``: conformer encoders read time first (Whisper-style
    encoders read ``(batch, num_mel_bins, frames)``, the generic layout); ``stack`` frames stacked per row."""
    bins = _find(model.config, "num_mel_bins", "feature_size", default=16)
    frames = 2 * (_find(model.config, "max_source_positions", default=16) or 16)
    return {"input_features": torch.randn(BATCH_SIZE, frames, bins * stack, generator=generator)}


def _patches_as_images(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """The flattened patches as one small ``(channels, patch, patch)`` image each (a Conv2d patch embedding)."""
    patch = _find(model.config, "patch_size", default=PATCH_SIZE)
    return {"pixel_values": batch["pixel_values"].reshape(-1, 3, patch, patch)}


def _image_sizes(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Each image's size: a Pixtral-style patch merger reads it (LLaVA, whose forward takes it too, reads it only
    with a Pixtral tower, so the generic batch leaves it out)."""
    return {"image_sizes": torch.tensor([list(batch["pixel_values"].shape[-2:])] * BATCH_SIZE)}


def _one_image_per_sequence(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Images as ``(batch, images, channels, height, width)``: models that take several images per sequence
    (IDEFICS also takes which image each token attends to: ``image_attention_mask``)."""
    found = {"pixel_values": batch["pixel_values"].unsqueeze(1)}
    if "image_attention_mask" in inspect.signature(model.forward).parameters:
        found["image_attention_mask"] = torch.ones(*batch["input_ids"].shape, 1, dtype=torch.long)
    return found


def _kosmos2(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """KOSMOS-2 places its latent image queries at the positions ``image_embeds_position_mask`` marks."""
    mask = torch.zeros_like(batch["input_ids"])
    mask[:, 1:1 + model.config.latent_query_num] = 1
    return {"image_embeds_position_mask": mask}


def _text_and_codebooks(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Kyutai STT: each step is a text token and one token per audio codebook, ``(batch, length, 1 + codebooks)``."""
    config = model.config
    audio = torch.randint(FIRST_ID, config.codebook_vocab_size, (BATCH_SIZE, SEQUENCE_LENGTH, config.num_codebooks),
                          generator=generator)
    return {"input_ids": torch.cat([batch["input_ids"].unsqueeze(-1), audio], dim=-1)}


def _codebook_rows(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """MusicGen's decoder: one row of audio codes per codebook, ``(batch * codebooks, length)``."""
    rows = BATCH_SIZE * model.config.num_codebooks
    ids = torch.randint(FIRST_ID, VOCAB_SIZE - RESERVED_IDS, (rows, SEQUENCE_LENGTH), generator=generator)
    return {"input_ids": ids,
            "attention_mask": torch.ones(BATCH_SIZE, SEQUENCE_LENGTH, dtype=torch.long)}


def _video_query_tokens(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """InstructBLIP-Video: a one-frame clip ``(batch, frames, channels, size, size)`` whose Q-Former queries fill
    ``num_query_tokens`` video tokens at the start of each sequence."""
    config = model.config
    ids = torch.cat([torch.full((BATCH_SIZE, config.num_query_tokens), config.video_token_index), batch["input_ids"]],
                    dim=1)
    return {"pixel_values": batch["pixel_values"].unsqueeze(1), "input_ids": ids,
            "attention_mask": torch.ones_like(ids)}


def _packed_patches(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """MiniCPM-V's vision tower: every image's patches side by side in one ``(1, channels, patch, patches * patch)``
    strip, with each image's patch grid in ``target_sizes``."""
    patch = model.config.patch_size
    side = IMAGE_SIZE // patch
    return {"pixel_values": torch.randn(1, 3, patch, BATCH_SIZE * side * side * patch, generator=generator),
            "target_sizes": torch.tensor([[side, side]] * BATCH_SIZE)}


def _mllama_tiles(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Mllama: one image of one tile per sequence, ``(batch, images, tiles, channels, size, size)``, its aspect
    ratio (id 1: the single 1 x 1 ratio, see ``OVERRIDES``) and which tiles each token cross-attends to."""
    length = batch["input_ids"].shape[1]
    return {"pixel_values": batch["pixel_values"][:, None, None],
            "aspect_ratio_ids": torch.ones(BATCH_SIZE, 1, dtype=torch.long),
            "aspect_ratio_mask": torch.ones(BATCH_SIZE, 1, 1, dtype=torch.long),
            "cross_attention_mask": torch.ones(BATCH_SIZE, length, 1, 1, dtype=torch.long)}


def _draft_block(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Muse Glimmer's speculative-decoding assistant: noised embeddings of a block of draft tokens, and the main
    model's hidden states (of its ``target_layer_ids`` layers, concatenated) for the tokens accepted so far."""
    config = model.config
    width = config.hidden_size
    return {"noise_embeds": torch.randn(BATCH_SIZE, config.block_size, width, generator=generator),
            "context_hidden_states": torch.randn(BATCH_SIZE, SEQUENCE_LENGTH, width * len(config.target_layer_ids),
                                                 generator=generator)}


def _whole_audio_frames(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Muse Spark's audio encoder: a waveform of two whole frames (the product of its stages' patch sizes)."""
    config = getattr(model.config, "audio_config", model.config)
    frame = 1
    for size in config.patch_sizes:
        frame *= size
    return {"input_values": torch.randn(BATCH_SIZE, 2 * frame, generator=generator)}


def _speech_prompt(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """A speech LM's audio prompt: time-first features and, ahead of the text, one audio token per
    ``subsampling_factor`` frames."""
    features = _frames_first(model, batch, generator)["input_features"]
    tokens = features.shape[1] // _find(model.config, "subsampling_factor", default=8)
    ids = torch.cat([torch.full((BATCH_SIZE, tokens), model.config.audio_token_id), batch["input_ids"]], dim=1)
    return {"input_features": features, "input_features_mask": torch.ones(features.shape[:2], dtype=torch.long),
            "input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _neucodec(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """NeuCodec: the mono waveform for its acoustic encoder and, for its semantic (w2v-BERT) encoder, time-first
    features, as many frames as the acoustic encoder makes of the waveform."""
    frames = AUDIO_SAMPLES // 320
    width = model.config.semantic_model_config.feature_projection_input_dim
    return {"input_values": batch["input_values"].unsqueeze(1),
            "input_features": torch.randn(BATCH_SIZE, frames, width, generator=generator)}


def _paired_audio(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """PE-Audio (contrastive audio-text): a mono waveform of two frames of its DAC embedder next to the text."""
    frame = 1
    for ratio in model.config.audio_config.dac_config.downsampling_ratios:
        frame *= ratio
    return {"input_values": torch.randn(BATCH_SIZE, 1, 2 * frame, generator=generator)}


def _merged_patches(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Inkling2: one ``(patch * merge, patch * merge, channels)`` pixel block per language-model image token, and
    each image's grid counted in those tokens."""
    config = getattr(model.config, "vision_config", model.config)
    block = config.patch_size * config.spatial_merge_size
    side = IMAGE_SIZE // block
    return {"pixel_values": torch.randn(BATCH_SIZE * side * side, block, block, 3, generator=generator),
            "image_grid_thw": torch.tensor([[1, side, side]] * BATCH_SIZE)}


def _pooled_crops(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Molmo2: one crop per image, ``(crops, patches, patch * patch * channels)``; each image token pools 4 of its
    crop's patches (``image_token_pooling``), ``image_grids`` counts those tokens (a 2 x 2 grid per image), and
    ``mm_token_type_ids`` marks them."""
    config = model.config
    patch = config.vision_config.patch_size
    patches = config.vision_config.num_position_embeddings
    tokens = patches // 4
    ids = torch.cat([torch.full((BATCH_SIZE, tokens), config.image_patch_id), batch["input_ids"]], dim=1)
    return {"pixel_values": torch.randn(BATCH_SIZE, patches, patch * patch * 3, generator=generator),
            "image_token_pooling": torch.arange(BATCH_SIZE * patches).reshape(BATCH_SIZE * tokens, 4),
            "image_grids": torch.tensor([[2, tokens // 2, 0, 0]] * BATCH_SIZE),
            "input_ids": ids, "attention_mask": torch.ones_like(ids),
            "mm_token_type_ids": (ids == config.image_patch_id).long()}


def _space_time_patches(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Inkling: ``(patches, temporal_patch_size, patch, patch, channels)`` blocks, one per image (the vision tower
    folds time and space into depth)."""
    config = model.config.vision_config
    shape = (BATCH_SIZE, config.temporal_patch_size, config.patch_size, config.patch_size, config.num_channels)
    return {"pixel_values": torch.randn(*shape, generator=generator)}


def _mono_waveform(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """The waveform as ``(batch, 1, samples)``: one audio channel."""
    return {"input_values": batch["input_values"].unsqueeze(1)}


def _latents(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    batch["latents"] = torch.randn(BATCH_SIZE, model.config.hidden_size, 4, generator=generator)  # (batch, width, frames)
    batch.pop("input_ids", None)


def _image(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    batch["pixel_values"] = torch.randn(BATCH_SIZE, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)


def _document(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    # UVDoc: the head's reflect-padded 5x5 convolutions need more than 2x2 features (1/16 of the image)
    batch["pixel_values"] = torch.randn(BATCH_SIZE, 3, 2 * IMAGE_SIZE, 2 * IMAGE_SIZE, generator=generator)


def _one_video(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    """TVP: one sample of text and video frames (padded to max_img_size). Upstream bug: the column position
    embeddings are viewed as (batch_size, 1, width, hidden) in ``TvpVisionInputEmbedding``, so a batch of more
    than one sample raises "shape '[2, 1, 1, 32]' is invalid for input of size 32"."""
    for name, value in list(batch.items()):
        if isinstance(value, torch.Tensor):
            batch[name] = value[:1]
    size = model.config.max_img_size
    batch["pixel_values"] = torch.randn(1, 2, 3, size, size, generator=generator)


def _language(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    batch["lang_ids"] = torch.zeros(BATCH_SIZE, dtype=torch.long)  # the language adapter of every sample


def _projected_features(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    # stacked fbank frames: (batch, frames, feature_projection_input_dim)
    batch["input_features"] = torch.randn(BATCH_SIZE, 2 * SEQUENCE_LENGTH, model.config.feature_projection_input_dim,
                                          generator=generator)


def _codec_with_semantics(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    # X-Codec2: the waveform for the acoustic encoder and its fbank frames for the semantic (W2V-BERT) encoder
    batch["input_values"] = torch.randn(BATCH_SIZE, 1, AUDIO_SAMPLES, generator=generator)
    width = model.config.semantic_model_config.feature_projection_input_dim
    frames = AUDIO_SAMPLES // math.prod(model.config.downsampling_ratios)  # one semantic frame per acoustic frame
    batch["input_features"] = torch.randn(BATCH_SIZE, frames, width, generator=generator)


def _audio_features(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    bins = _find(model.config, "num_mel_bins", default=16)
    # 8 frames per text token: the encoder downsamples 8x and adds one audio embedding to every token
    batch["input_features"] = torch.randn(BATCH_SIZE, bins, 8 * SEQUENCE_LENGTH, generator=generator)


def _robot_step(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    """PI0: one camera image per sample behind its image tokens, and the action-expert embeddings (required)."""
    vision = model.config.vlm_config.vision_config
    tokens = (vision.image_size // vision.patch_size) ** 2
    ids = torch.cat([torch.full((BATCH_SIZE, tokens), model.config.vlm_config.image_token_id), _ids(generator)], dim=1)
    batch.update(input_ids=ids, attention_mask=torch.ones_like(ids),
                 pixel_values=torch.randn(BATCH_SIZE, 1, vision.num_channels, vision.image_size, vision.image_size,
                                          generator=generator),
                 pixel_attention_mask=torch.ones(BATCH_SIZE, 1, dtype=torch.bool),
                 action_embeds=torch.randn(BATCH_SIZE, 4, model.config.dit_config.hidden_size, generator=generator))


def _text_line(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    # text recognition: a line image 96 pixels high (the model average-pools (3, 2) of a 1/32-high feature map)
    batch["pixel_values"] = torch.randn(BATCH_SIZE, 3, 96, 2 * IMAGE_SIZE, generator=generator)


def _features_mask(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    # one chunk of 2 * n_window frames (the encoder's attention window), all valid
    frames = 2 * model.config.n_window
    batch["input_features"] = torch.randn(BATCH_SIZE, model.config.num_mel_bins, frames, generator=generator)
    batch["input_features_mask"] = torch.ones(BATCH_SIZE, frames, dtype=torch.long)


def _segmentation_prompt(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    pixels = batch["pixel_values"]  # the image to segment, a prompt image and its mask, all of one size
    batch["prompt_pixel_values"] = torch.randn(pixels.shape, generator=generator)
    batch["prompt_masks"] = torch.randn(pixels.shape, generator=generator)


def _boxes(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    corners = torch.rand(*batch["input_ids"].shape, 2, generator=generator) / 2  # normalised x0, y0, x1, y1
    batch["bbox"] = torch.cat([corners, corners + 0.25], dim=-1)


def _speech_hidden_states(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    # SpeechT5Model without pre-nets: encoder and decoder take hidden states directly
    batch["input_values"] = torch.randn(BATCH_SIZE, SEQUENCE_LENGTH, model.config.hidden_size, generator=generator)
    batch["decoder_input_values"] = torch.randn(BATCH_SIZE, SEQUENCE_LENGTH, model.config.hidden_size, generator=generator)


def _patchified(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    """Siglip2 (NaFlex): patches flattened per image, their validity mask and each image's patch grid."""
    vision = getattr(model.config, "vision_config", model.config)
    side = IMAGE_SIZE // vision.patch_size
    batch["pixel_values"] = torch.randn(BATCH_SIZE, side * side, vision.num_channels * vision.patch_size ** 2,
                                        generator=generator)
    batch["pixel_attention_mask"] = torch.ones(BATCH_SIZE, side * side, dtype=torch.long)
    batch["spatial_shapes"] = torch.tensor([[side, side]] * BATCH_SIZE)


#: Per-type input rules on top of the generic batch, each with why the generic rule cannot know; a rule gets the
#: model, the generic batch and the seeded generator and returns the entries to set (or sets them in the batch itself and returns
#: None: a rule that also removes entries).
INPUT_RULES: dict[str, Any] = {
    # The feature extractor stacks 4 frames per row: the input projection reads num_mel_bins * 4 features.
    "granite_speech5_encoder": functools.partial(_frames_first, stack=4),
    **dict.fromkeys(["idefics", "idefics2", "idefics3", "modernvbert"], _one_image_per_sequence),
    **dict.fromkeys(["inkling2", "inkling2_loop", "inkling2_vision"], _merged_patches),
    "inkling_mm_model": _space_time_patches,
    "instructblipvideo": _video_query_tokens,
    **dict.fromkeys(["kimi_k25", "kimi_k25_vision"], _patches_as_images),
    "kosmos-2": _kosmos2,
    "kyutai_speech_to_text": _text_and_codebooks,
    # Conformer (FastConformer/NeMo-style) encoders: time-first features.
    **dict.fromkeys(["lasr_ctc", "lasr_encoder", "nemotron3_5_asr", "nemotron3_5_transcribe_asr_audio",
                     "nemotron3_5_transcribe_audio", "nemotron3_diarization", "nemotron3_diarization_audio",
                     "nemotron_asr_streaming", "nemotron_asr_streaming_encoder", "parakeet_ctc", "parakeet_encoder",
                     "parakeet_rnnt", "parakeet_tdt"], _frames_first),
    "lfm2_vl": _patchified,
    **dict.fromkeys(["lighton_ocr", "mistral3", "mistral_large4"], _image_sizes),
    **dict.fromkeys(["mimi", "mimi_encoder", "omniasr_audio", "omniasr_ctc"], _mono_waveform),
    # The Mimi decoder alone decodes continuous latents, (batch, hidden_size, frames).
    "mimi_decoder": lambda model, batch, generator: {
        "latents": torch.randn(BATCH_SIZE, model.config.hidden_size, 4, generator=generator)},
    **dict.fromkeys(["minicpm_ocr_vision", "minicpmv4_7_vision"], _packed_patches),
    "mllama": _mllama_tiles,
    "molmo2": _pooled_crops,
    "muse_glimmer_assistant": _draft_block,
    "muse_spark_audio": _whole_audio_frames,
    **dict.fromkeys(["musicgen", "musicgen_melody"], _codebook_rows),
    "nemo_speechlm": _speech_prompt,
    "neucodec": _neucodec,
    "paddleocr_vl": _patches_as_images,
    "pe_audio": _paired_audio,
    "pe_audio_encoder": _mono_waveform,  # the DAC encoder convolves (batch, channels, samples)
    "pi0": _robot_step,
    "pocket_tts_audio_tokenizer": _mono_waveform,  # a codec: (batch, channels, samples)
    "pocket_tts_audio_tokenizer_decoder": _latents,  # the decoder alone takes the codec's latent frames
    "pocket_tts_audio_tokenizer_encoder": _mono_waveform,
    "pp_ocrv5_mobile_rec": _text_line,
    "pp_ocrv5_server_rec": _text_line,
    "pp_ocrv6_small_rec": _text_line,
    "qwen3_asr_encoder": _features_mask,  # the encoder requires the valid-frame mask of its features
    "seggpt": _segmentation_prompt,  # in-context segmentation: the forward requires a prompt image and mask
    "siglip2": _patchified,
    "siglip2_vision_model": _patchified,
    "smolvlm": _one_image_per_sequence,  # images are grouped per sample
    "speech_to_text": _frames_first,  # the convolutional subsampler reads (batch, frames, features)
    "speecht5": _speech_hidden_states,
    "udop": _boxes,  # the text encoder's 2-D relative position bias needs every token's box
    "tvp": _one_video,  # text + video grounding: the video frames are an optional input
    "ultravbert": _one_image_per_sequence,
    "uvdoc": _document,
    "vilt": _image,  # the image is an optional input of a flat (towerless) config
    "voxtral_realtime": _audio_features,  # the audio features are an optional input of a text-first model
    "wav2vec2-bert": _projected_features,
    "xcodec2": _codec_with_semantics,
    "xmod": _language,  # X-MOD routes every sample through the adapter of its language
}


def _required(parameters: Any, name: str) -> bool:
    return name in parameters and parameters[name].default is inspect.Parameter.empty


def _matches_pairs(model_type: str) -> bool:
    """Keypoint matchers take a pair of images per sample."""
    return any("KEYPOINT_MATCHING" in mapping for mapping, _ in registered().get(model_type, []))


#: Inputs a model needs besides its main one, which its signature marks optional.
_EXTRA_INPUTS: dict[str, list[str]] = {
    "apertus1p5": ["image_sizes"],  # the image tokenizer crops each image to its true size
    "clvp": ["input_features"],  # the speech conditioning encoder always reads the mel spectrogram
}

#: Input image sizes of models whose configs do not hold it.
_IMAGE_SIZES: dict[str, int] = {
    "depth_pro": 4 * PATCH_SIZE,  # the 1/4-scaled image must still hold one patch_size crop
    "efficientloftr": 2 * IMAGE_SIZE,  # coarse features at 1/8, then pooled 4x4 by the attention aggregation
}

#: Audio encoders (by modeling module) that read (batch, frames, features) rather than (batch, mel bins, frames),
#: with the feature width they expect.
_FEATURES_LAST: dict[str, Callable[[Any], int]] = {
    "parakeet": lambda config: config.num_mel_bins,
    "lasr": lambda config: config.num_mel_bins,
    "fun_asr_nano": lambda config: config.input_size,  # mel bins times stacked frames
    "granite_speech5": lambda config: 4 * config.num_mel_bins,  # delta-expanded, then stacked in pairs
    "gemma4": lambda config: config.subsampling_conv_channels[0],  # the projection assumes bins == channels
}


def _features_last(model: torch.nn.Module) -> int | None:
    """The feature width of an audio encoder reading (batch, frames, features), None for (batch, bins, frames)."""
    for module in model.modules():
        family = type(module).__module__.rpartition(".modeling_")[2]
        config = getattr(module, "config", None)
        if family in _FEATURES_LAST and config is not None:  # the audio tower's config has the fields
            with contextlib.suppress(AttributeError, TypeError, IndexError):
                return _FEATURES_LAST[family](config)
    return None


def _time_series(config: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Past values (context plus the largest lag) with their time features and mask, and the future window."""
    past = config.context_length + max(config.lags_sequence)
    future = config.prediction_length
    features = config.num_time_features

    def values(length: int) -> torch.Tensor:
        shape = (BATCH_SIZE, length) if config.input_size == 1 else (BATCH_SIZE, length, config.input_size)
        return torch.randn(*shape, generator=generator)

    return {"past_values": values(past), "past_observed_mask": torch.ones_like(values(past)),
            "past_time_features": torch.randn(BATCH_SIZE, past, features, generator=generator),
            "future_values": values(future),
            "future_time_features": torch.randn(BATCH_SIZE, future, features, generator=generator)}


def _grid_patches(config: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL style images: every image's patches flattened to rows, and each image's (t, h, w) patch grid."""
    channels = _find(config, "num_channels", "in_channels", "in_chans", default=3)
    size = _find(config, "image_size", "img_size", default=IMAGE_SIZE)
    size = size if isinstance(size, int) else IMAGE_SIZE
    patch = _find(config, "patch_size", default=PATCH_SIZE)
    temporal = _find(config, "temporal_patch_size", "patch_temporal", default=1)
    side = size // patch
    patches = torch.randn(BATCH_SIZE * side * side, channels * temporal * patch * patch, generator=generator)
    return patches, torch.tensor([[1, side, side]] * BATCH_SIZE)


def _tensors(output: Any):
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, dict):
        for value in output.values():
            yield from _tensors(value)
    elif isinstance(output, (tuple, list)):
        for value in output:
            yield from _tensors(value)


def loss(output: Any) -> torch.Tensor:
    """A scalar from every floating tensor of ``output`` that carries a gradient (base models have no loss)."""
    parts = [t.float().pow(2).mean() for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise NotTiny("the output has no tensor that carries a gradient")
    return torch.stack(parts).sum()


def live_blocks(model: torch.nn.Module, grads: dict[str, torch.Tensor]) -> list[int]:
    """Blocks some parameter of which got a gradient: the only ones a backward can recompute (a vision tower's
    last block is often unused: Llava reads the second-to-last hidden state)."""
    from hf_ckpt.blocks import find_blocks

    names = {id(p): n for n, p in model.named_parameters()}
    return [b.index for b in find_blocks(model) if any(names.get(id(p)) in grads for p in b.module.parameters())]


def gradients(model: torch.nn.Module, batch: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """One training step's gradients (RNG seeded, so any dropout draws the same masks in every run)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
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
