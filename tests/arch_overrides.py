"""Per-type config settings of the architecture sweep: what the generic tiny rule (``arch_build.tiny_kwargs``)
cannot guess, each with its reason.

Keyed by model type, also a sub-config's (the settings update that sub-config's dict, key by key; a dict that
holds a ``model_type`` replaces it). Kept alphabetical.
"""

from __future__ import annotations

from typing import Any

from arch_tiny import BLOCKS, IMAGE_SIZE, PATCH_SIZE, RESERVED_IDS, SIZES, TIMM_VIT_ARGS, VOCAB_SIZE

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

_BERT_DECODER = {"model_type": "bert", "is_decoder": True, "add_cross_attention": True}

#: The parts of composite configs that have none by default before transformers 5 (their ``__init__`` raises
#: without them, or leaves the part None): those 5.x defaults to, given only where the config's own defaults fail
#: or leave one of them None (``tiny_config``), then made tiny by the generic rule like any sub-config.
DEFAULT_PARTS: dict[str, dict[str, Any]] = {
    # 5.15's config leaves the vision tower out by default, but the model builds it unconditionally (from None).
    "diffusion_gemma": {"vision_config": {"model_type": "gemma4_vision"}},
    "encoder-decoder": {"encoder": {"model_type": "bert"}, "decoder": _BERT_DECODER},
    # 5.15's assistant configs leave their text config out by default (the models then build a full-size one).
    **dict.fromkeys(["gemma4_assistant", "gemma4_unified_assistant"], {"text_config": {}}),
    # 5.15 defaults a missing text / vision config to Llama / SigLIP, not to the types a dict defaults to (and 5.22
    # defaults to): Llama lacks the Granite fields the text model reads, SigLIP the CLS token the "default" feature
    # selection drops (15 of 16 patch features left).
    "granite4_vision": {"text_config": {"model_type": "granite4_vision_text"},
                        "vision_config": {"model_type": "clip_vision_model"}},
    "musicgen": {"text_encoder": {"model_type": "t5"}, "audio_encoder": {"model_type": "encodec"}, "decoder": {}},
    "musicgen_melody": {"text_encoder": {"model_type": "t5"}, "audio_encoder": {"model_type": "encodec"},
                        "decoder": {}},
    # Upstream (4.5x): Phi4MultimodalConfig.__init__ builds the default vision config without assigning it, so
    # vision_config stays None (checkpoints set it), and builds the default audio config only where vision_config is
    # None; the model's feature embedding reads both.
    "phi4_multimodal": {"vision_config": {}, "audio_config": {}},
    "speech-encoder-decoder": {"encoder": {"model_type": "wav2vec2"}, "decoder": _BERT_DECODER},
    "vision-encoder-decoder": {"encoder": {"model_type": "vit"}, "decoder": _BERT_DECODER},
}

#: Per-type keyword arguments of the model class itself (not of its config), each with why.
MODEL_KWARGS: dict[str, dict[str, Any]] = {
    # Upstream (4.51 to 4.57): ViTHybridPreTrainedModel._init_weights zeroes the embeddings' mask_token, which is None
    # unless the model is made with use_mask_token=True, so the model cannot be made from a config (from_pretrained
    # skips the init of loaded weights and trains). The token is used only with bool_masked_pos (never here).
    "vit_hybrid": {"use_mask_token": True},
}

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
    # The image placeholder token comes with a checkpoint (None by default). Under its constructor name: on 4.57
    # "image_token_id" is an alias that __init__ then overwrites with image_token_index (None).
    "blip-2": {"image_token_index": VOCAB_SIZE - RESERVED_IDS + 1},
    # Hashed byte n-gram embeddings: one table of this many rows per n-gram size.
    "blt": {"encoder_hash_byte_group_vocab": VOCAB_SIZE},
    # The BPE <-> image-token map comes with a checkpoint (None by default); the model reads "<image>" from it.
    "chameleon": {"vocabulary_map": {"<image>": VOCAB_SIZE - 1}},
    # DPT-style head widths (not named like sizes the generic rule knows).
    "chmv2": {"post_process_channels": [16, 16, 32, 32], "fusion_hidden_size": 32, "head_hidden_size": 16,
              "number_output_channels": 16},
    # The encoders' rotary width is at least 32 (max(projection_dim // (2 * heads), 32)): one 32-wide head. The
    # decoder's fixing codes (the speech token ids that replace its stop token before the speech encoder embeds
    # them) go up to 248: inside the tiny vocabulary.
    "clvp": {"text_config": {"num_attention_heads": 1}, "speech_config": {"num_attention_heads": 1},
             "decoder_config": {"decoder_fixing_codes": [83, 45, 45, 100]}},
    # The default config has no rotary parameters per layer type (checkpoints set them); the model indexes them.
    "cohere_compass_text": {"rope_parameters": {"full_attention": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}},
    # DETR-family defaults use a timm ResNet; the transformers ResNet backbone (same stages) needs no timm.
    **dict.fromkeys(["conditional_detr", "deformable_detr", "detr"], {"backbone_config": {
        "model_type": "resnet", "embedding_size": 16, "hidden_sizes": [16, 16, 16, 16], "depths": [1, 1, 1, 1],
        "out_features": ["stage1", "stage2", "stage3", "stage4"]}}),
    # The Mimi codec's upsampling conv is depthwise over its hidden size (512 groups by default); its filters double
    # at each of its 4 downsamplings.
    "csm": {"codec_config": {"upsample_groups": SIZES["hidden_size"], "num_filters": 2}},
    # The attention reads attn_config.rope_theta and clamps by clip_qkv unconditionally: the checkpoints set both,
    # the default has no rope_theta and clip_qkv=None (clamp(None, None) raises).
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # The SAM neck's downsampling convs end at the encoder's width (896 by default).
    "deepseek_ocr2_sam_vision_model": {"downsample_channels": [SIZES["hidden_size"]] * 2},
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
    # output sections (4 input and 4 output layers by default) split the tiny depth; the recurrent section keeps its
    # default loops (it runs twice per forward: only runs during backward count as recomputes).
    "dory": {"num_hidden_layers": 2 * BLOCKS, "n_input_layers": 2, "n_recurrent_layers": 2 * (BLOCKS - 2),
             "n_output_layers": 2,
             "layer_types": ["sliding_attention", "mlp"] * (BLOCKS - 1) + ["full_attention", "mlp"]},
    # The config leaves the expert counts unset (None: only checkpoints set them) and the MoE layers need them.
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    # Sliding-window layers use plain attention whose head size must be the MLA query's (nope + rope parts).
    "dots3_note_text": {"head_dim": SIZES["qk_nope_head_dim"] + SIZES["qk_rope_head_dim"]},
    # RepVGG stages (1, 2, 4, 14 blocks up to 256 channels); the last stage's width must be the hidden size; the
    # 2D rotary table is hidden_size / 2 wide and fills it only with the default 8 heads (head size * 4 / 2 each).
    "efficientloftr": {"stage_num_blocks": [1, 1, 1, 1], "out_features": [16, 16, 32, SIZES["hidden_size"]],
                       "num_attention_heads": 8, "num_key_value_heads": 8},
    # The BPE <-> image-token map comes with a checkpoint (None by default); the model reads two entries of it.
    "emu3": {"vocabulary_map": {"<image>": VOCAB_SIZE - 1, "<|extra_200|>": VOCAB_SIZE - 2}},
    "emu3_vqgan": {"codebook_size": 64},  # "codebook_size" is not shrunk generically: audio codecs size by it
    # M-RoPE sections in (h, w, t) order, the h and w ones interleaved pairwise: they must be equal.
    "ernie4_5_vl_moe_text": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                                 "mrope_section": [1, 1, 2]}},
    # FastViT-MCi3 (a timm tower) widths and depths are model_args; its attention stages need widths that are
    # multiples of their 32-wide heads, and its output (twice the last width) is the vision hidden size.
    "fast_vlm": {"vision_config": {"hidden_size": 64, "model_args": {
        "inference_mode": True, "layers": (1, 1, 1, 1, 1), "embed_dims": (8, 8, 16, 32, 32)}}},
    # DaViT stage widths and channel-attention groups are lists named unlike the generic per-stage lists.
    "florence2": {"vision_config": {"embed_dim": [32] * 4, "num_groups": [2] * 4}},
    # The adaptor's width is fixed to a quarter of the text model's (checked by the config).
    "fun_asr_nano": {"adaptor_config": {"intermediate_size": SIZES["hidden_size"] // 4}},
    # Its vision tower is timm's MobileNetV5 encoder (300M weights): a sixteenth of its channels (its widths and
    # depths are an architecture string, not arguments), whose output keeps 2048 channels (see PARAMETER_BUDGETS).
    "gemma3n": {"vision_config": {"model_args": {"channel_multiplier": 0.0625}, "hidden_size": 2048}},
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
    # (The Q-Former follows the vision width: 5.22 sets it so, 5.15 only for a Q-Former config it builds itself.)
    "granite4_vision": {"deepstack_layer_map": [[-2, 0], [-1, 1]], "spatial_target_layers": list(range(BLOCKS)),
                        "vision_config": {"hidden_size": 64}, "downsample_rate": "1/2",
                        "qformer_config": {"hidden_size": 64, "encoder_hidden_size": 64, "num_attention_heads": 1}},
    # Vision layers whose features the connector stacks, of the full-size 12-layer tower.
    "granite_docling_vision": {"deepstack_visual_indexes": [1, 2, 3]},
    # Chunked local attention: the context must fit the tiny position table.
    "granite_speech5_encoder": {"context_size": 16, "num_key_value_heads": 4},
    # Mamba heads must split mamba_expand * hidden_size (64) into heads of mamba_d_head. The layer kinds as the
    # checkpoints list them: layer_types defaults to None, and before 5.x fixed it (4.57, 5.0) the attribute map
    # sends config.layers_block_type to it past the all-Mamba fallback, so the layers index None.
    "granitemoehybrid": {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16,
                         "layer_types": ["mamba", "attention"] * (BLOCKS // 2)},
    # Hiera's sizes are (height, width) pairs: the tiny image, the patch grid 8 x 8 = one 8 x 8 mask unit.
    "hiera": {"image_size": [IMAGE_SIZE, IMAGE_SIZE]},
    # A recurrent model: two stacks of 2 make the 4 layers (its low- and high-level stacks keep their default
    # cycles: they run several times per forward; only runs during backward count as recomputes).
    "hrm_text": {"num_layers_per_stack": BLOCKS // 2},
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
    # flows through the text layers to the trainable cross-attention between them): train every block. Checkpoints
    # cross-attend every 4th of 32 layers, so the decoder layers outnumber the gated cross-attention layers (the
    # stack's blocks are its longest list): every 2nd of the tiny 4.
    "idefics": {"freeze_text_layers": False, "freeze_vision_layers": False, "cross_layer_interval": 2},
    # The merger's widths (its hidden layer, and its output: the text model's width) have names of their own.
    **dict.fromkeys(["inkling2", "inkling2_loop"],
                    {"vision_config": {"projection_hidden_dim": 32, "text_hidden_size": 32}}),
    "inkling2_vision": {"projection_hidden_dim": 32, "text_hidden_size": 32},
    # The encoder steps through one scale per prime factor of the patch (and temporal patch) size plus the input's:
    # with fewer layers than scales (8 x 8 patches: 5 scales for 4 layers) it assigns them with scipy's
    # linear_sum_assignment, an optional dependency; 4 x 4 patches make 4 scales (the default 40 x 40 ones: 6 for
    # 24 layers).
    "inkling_vision": {"patch_size": 4},
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
    # NVFP4 rounding of keys and values needs a head size that is a multiple of 16 (checked by the config), and the
    # indexer's heads at most the query heads of one key head (4 // 2); the last layer is an indexed-attention one
    # (every fifth by default: none of 4), so that the indexed (sparse) attention path runs too.
    "kolibri1_1": {"head_dim": 16, "index_num_heads": 2,
                   "layer_types": ["sliding_attention"] * (BLOCKS - 1) + ["indexed_attention"]},
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
    # The default vision tower names timm's resnet50 without model_args, but the projector reads
    # model_args["embed_dim"]: checkpoints use a PE-core ViT, given its tiny sizes (every token out: no pooling).
    "perception_lm": {"vision_config": {"architecture": "vit_pe_core_large_patch14_336",
                                        "model_args": {**TIMM_VIT_ARGS, "global_pool": ""}}},
    # The action chunk: steps the action expert predicts at once (the batch holds one action embedding per step).
    **dict.fromkeys(["pi0", "pi05"], {"chunk_size": 4}),
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
    # The ResNet grid pools 64 -> 1. On 4.x its text embeddings read type_vocab_size, which the config class does
    # not declare (the checkpoints' config.json carries it).
    "tvp": {"max_img_size": 2 * IMAGE_SIZE, "visual_prompt_size": 4, "type_vocab_size": 2},
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
    # The predictor has its own width and heads; positions follow the crop size. The 3D rotary embedding splits each
    # head in three parts of 2 * (head size // 6) channels, which 4.57 cannot rotate when 2 wide (rotate_queries_or_keys
    # squeezes its one frequency away): 2 heads of 16 channels in the encoder and in the predictor.
    "vjepa2": {"pred_hidden_size": 32, "pred_num_attention_heads": 2, "num_attention_heads": 2,
               "crop_size": IMAGE_SIZE},
    # The acoustic encoder doubles its width per stride; the quantizer reads both encoders (2 x hidden); no GQA.
    # ViT-hybrid (deprecated, 4.x): its BiT backbone's bottleneck blocks are a quarter of the stage width, and their
    # group norms take 32 groups (the tiny widths need fewer); its patches are the backbone's feature map, whose
    # shape (the tiny backbone's third stage: 64 channels, 1/16 of the image) the config states, one pixel each.
    "vit_hybrid": {"backbone_config": {"num_groups": 4}, "patch_size": 1,
                   "backbone_featmap_shape": [1, 64, IMAGE_SIZE // 16, IMAGE_SIZE // 16]},
    "xcodec2": {"encoder_hidden_size": 4, "downsampling_ratios": [2, 2, 2, 2, 2], "quantization_dim": 64,
                "num_key_value_heads": 4},
    # The shared transformer is tied across hybrid layers: the tiny stack needs two of them.
    "zamba": {"layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]},
    # Rotary positions in the shared attention blocks (a config option): 5.0's Zamba2Model.forward calls its rotary
    # embedding unconditionally but builds it only with use_mem_rope (False by default: AttributeError).
    "zamba2": {"use_mem_rope": True},
    # ZAYA routes each token to one expert only (checked by the config).
    "zaya": {"num_experts_per_tok": 1},
    # The metric head reads the neck's fusion output through convolutions of this width.
    "zoedepth": {"bottleneck_features": 32},
}


#: Parameter budgets above ``arch_tiny.MAX_PARAMETERS`` for the types whose towers keep fixed widths however small
#: their config, each with why.
PARAMETER_BUDGETS: dict[str, int] = {
    # MobileNetV5's multi-scale fusion always outputs 2048 channels (timm drops num_features from the encoder's
    # arguments) and the text model embeds them: 7.3M weights at a sixteenth of its channels.
    "gemma3n": 8_000_000,
}
