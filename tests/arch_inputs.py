"""Per-type input rules of the architecture sweep: batch layouts only a model's own code defines, each with its
reason, on top of the batch ``arch_build.inputs`` generates from ``main_input_name`` and the forward signature.

A rule gets the model, the generic batch and the seeded generator, and returns the entries to set (or sets them in
the batch itself and returns None: a rule that also removes entries). ``EXTRA_INPUTS``, ``IMAGE_SIZES`` and
``FEATURES_LAST`` are three small tables the generic generator reads.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from typing import Any, Callable

import torch

from arch_tiny import AUDIO_SAMPLES, BATCH_SIZE, FIRST_ID, IMAGE_SIZE, PATCH_SIZE, RESERVED_IDS, SEQUENCE_LENGTH, \
    VOCAB_SIZE, find, token_ids

def _frames_first(model: torch.nn.Module, batch: dict, generator: torch.Generator, stack: int = 1) -> dict:
    """Features as ``(batch, frames, num_mel_bins * stack)``: conformer encoders read time first (Whisper-style
    encoders read ``(batch, num_mel_bins, frames)``, the generic layout); ``stack`` frames stacked per row."""
    bins = find(model.config, "num_mel_bins", "feature_size", "input_feat_per_channel", default=16)
    frames = 2 * (find(model.config, "max_source_positions", default=16) or 16)
    return {"input_features": torch.randn(BATCH_SIZE, frames, bins * stack, generator=generator)}


def _patches_as_images(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """The flattened patches as one small ``(channels, patch, patch)`` image each (a Conv2d patch embedding)."""
    patch = find(model.config, "patch_size", default=PATCH_SIZE)
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
    if "pixel_values" not in batch:  # 4.x sweeps Mllama's text model alone: no image, no tile
        return {}
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
    tokens = features.shape[1] // find(model.config, "subsampling_factor", default=8)
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
    for ratio in find(model.config, "downsampling_ratios"):
        frame *= ratio
    return {"input_values": torch.randn(BATCH_SIZE, 1, 2 * frame, generator=generator)}


def _audio_and_video(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """PE-Audio-Video: the audio tower's mono waveform (two DAC frames) and the video tower's frames, ``(batch,
    frames, channels, size, size)``: the model refuses fewer than two modalities, and each tower holds blocks."""
    frames = find(model.config, "num_frames", default=None) or 2
    video = torch.randn(BATCH_SIZE, frames, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
    return {**_paired_audio(model, batch, generator), "pixel_values_videos": video}


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
    crop's patches (``image_token_pooling``), ``image_grids`` counts those tokens (a 2 x 2 grid per image),
    ``image_num_crops`` each image's crops and ``mm_token_type_ids`` marks the tokens. Up to 5.24 the pooling indexes
    the patches of all images together; from 5.25 (``get_image_features`` takes ``image_num_crops``) each image's
    pooling indexes only its own patches, and the model offsets them by its crops (required for more than one
    image)."""
    config = model.config
    patch = config.vision_config.patch_size
    patches = config.vision_config.num_position_embeddings
    tokens = patches // 4
    ids = torch.cat([torch.full((BATCH_SIZE, tokens), config.image_patch_id), batch["input_ids"]], dim=1)
    per_image = "image_num_crops" in inspect.signature(model.get_image_features).parameters
    pooling = torch.arange(patches).repeat(BATCH_SIZE) if per_image else torch.arange(BATCH_SIZE * patches)
    return {"pixel_values": torch.randn(BATCH_SIZE, patches, patch * patch * 3, generator=generator),
            "image_token_pooling": pooling.reshape(BATCH_SIZE * tokens, 4),
            "image_grids": torch.tensor([[2, tokens // 2, 0, 0]] * BATCH_SIZE),
            "image_num_crops": torch.ones(BATCH_SIZE, dtype=torch.long),
            "input_ids": ids, "attention_mask": torch.ones_like(ids),
            "mm_token_type_ids": (ids == config.image_patch_id).long()}


def _space_time_patches(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Inkling: ``(patches, temporal_patch_size, patch, patch, channels)`` blocks, one per image (the vision tower
    folds time and space into depth)."""
    config = model.config.vision_config
    shape = (BATCH_SIZE, config.temporal_patch_size, config.patch_size, config.patch_size, config.num_channels)
    return {"pixel_values": torch.randn(*shape, generator=generator)}


def _one_tile(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Perception LM: each image as ``(batch, tiles, channels, size, size)``, one tile (the model flattens tiles)."""
    return {"pixel_values": batch["pixel_values"].unsqueeze(1)} if "pixel_values" in batch else {}


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
    bins = find(model.config, "num_mel_bins", default=16)
    # 8 frames per text token: the encoder downsamples 8x and adds one audio embedding to every token
    batch["input_features"] = torch.randn(BATCH_SIZE, bins, 8 * SEQUENCE_LENGTH, generator=generator)


def _robot_step(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    """PI0 and PI0.5: one camera image per sample behind its image tokens, and the action-expert embeddings
    (required): one per step of the action chunk (5.25 splits the expert's attention into the prefix block and the
    last ``chunk_size`` positions); PI0.5's expert also requires the denoising timestep's embedding, ``(batch,
    width)``, which modulates its norms (the forward passes it on to the expert)."""
    vision = model.config.vlm_config.vision_config
    tokens = (vision.image_size // vision.patch_size) ** 2
    ids = torch.cat([torch.full((BATCH_SIZE, tokens), model.config.vlm_config.image_token_id), token_ids(generator)], dim=1)
    batch.update(input_ids=ids, attention_mask=torch.ones_like(ids),
                 pixel_values=torch.randn(BATCH_SIZE, 1, vision.num_channels, vision.image_size, vision.image_size,
                                          generator=generator),
                 pixel_attention_mask=torch.ones(BATCH_SIZE, 1, dtype=torch.bool),
                 action_embeds=torch.randn(BATCH_SIZE, model.config.chunk_size, model.config.dit_config.hidden_size,
                                           generator=generator))
    if "timestep_embeds" in inspect.signature(model.dit.forward).parameters:
        batch["timestep_embeds"] = torch.randn(BATCH_SIZE, model.config.dit_config.hidden_size, generator=generator)


def _text_line(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    # text recognition: a line image 96 pixels high (the model average-pools (3, 2) of a 1/32-high feature map)
    batch["pixel_values"] = torch.randn(BATCH_SIZE, 3, 96, 2 * IMAGE_SIZE, generator=generator)


def _glm_image(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> None:
    """GLM-Image: each source image's tokens between its start and end tokens (5.15 to 5.22 count a sample's source
    images by its end tokens); up to 5.0 (no ``images_per_sample``) the grids end with one more, the generated
    image's, which has no pixels (the model encodes ``image_grid_thw[:-1]``)."""
    if "image_grid_thw" not in batch:
        return
    config = model.config
    ids = batch["input_ids"]
    images = int((ids[0] == config.image_token_id).sum())
    start, end = (torch.full((BATCH_SIZE, 1), token) for token in (config.image_start_token_id,
                                                                    config.image_end_token_id))
    batch["input_ids"] = torch.cat([start, ids[:, :images], end, ids[:, images:]], dim=1)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    if "images_per_sample" not in inspect.signature(model.forward).parameters:
        batch["image_grid_thw"] = torch.cat([batch["image_grid_thw"], batch["image_grid_thw"][-1:]])


def _bounded_images(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Ovis 2.5: each image's tokens between its start and end tokens (the processor's ``<start><image>*<end>``),
    which the model replaces by learned visual indicators and counts: one pair per image."""
    config = model.config
    ids = batch["input_ids"]
    images = int((ids[0] == config.image_token_id).sum())
    if not images:  # the first try of the generic batch: no image token yet, the model's count asks for them
        return {}
    start, end = (torch.full((BATCH_SIZE, 1), token) for token in (config.image_start_token_id,
                                                                    config.image_end_token_id))
    ids = torch.cat([start, ids[:, :images], end, ids[:, images:]], dim=1)
    found = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if "mm_token_type_ids" in batch:
        found["mm_token_type_ids"] = (ids == config.image_token_id).long()
    return found


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


def _spectrogram(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """TVLT (deprecated, 4.x): a required spectrogram beside the video, (batch, channels, time, frequency), the time
    two patches long (its configured length is a maximum) and the frequency exactly the configured one."""
    config = model.config
    patch = config.audio_patch_size if isinstance(config.audio_patch_size, int) else config.audio_patch_size[0]
    shape = (BATCH_SIZE, config.num_audio_channels, 2 * patch, config.frequency_length)
    return {"audio_values": torch.randn(*shape, generator=generator)}


def _trajectories(model: torch.nn.Module, batch: dict, generator: torch.Generator) -> dict:
    """Trajectory Transformer (deprecated, 4.x): discretised trajectories, one token per dimension of each
    transition (each dimension's ids are offset by the model), whole transitions within its block size."""
    config = model.config
    length = max(1, min(SEQUENCE_LENGTH, config.block_size) // config.transition_dim) * config.transition_dim
    return {"trajectories": torch.randint(0, config.vocab_size, (BATCH_SIZE, length), generator=generator)}


#: Per-type input rules on top of the generic batch, each with why the generic rule cannot know; a rule gets the
#: model, the generic batch and the seeded generator and returns the entries to set (or sets them in the batch itself and returns
#: None: a rule that also removes entries).
INPUT_RULES: dict[str, Any] = {
    # The feature extractor stacks 4 frames per row: the input projection reads num_mel_bins * 4 features.
    "glm_image": _glm_image,
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
    "ovis2_5": _bounded_images,
    "paddleocr_vl": _patches_as_images,
    "pe_audio": _paired_audio,
    "pe_audio_encoder": _mono_waveform,  # the DAC encoder convolves (batch, channels, samples)
    **dict.fromkeys(["pe_audio_video", "pe_audio_video_encoder"], _audio_and_video),
    "perception_lm": _one_tile,
    **dict.fromkeys(["pi0", "pi05"], _robot_step),
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
    "trajectory_transformer": _trajectories,
    "tvlt": _spectrogram,
    "tvp": _one_video,  # text + video grounding: the video frames are an optional input
    "ultravbert": _one_image_per_sequence,
    "uvdoc": _document,
    "vilt": _image,  # the image is an optional input of a flat (towerless) config
    "voxtral_realtime": _audio_features,  # the audio features are an optional input of a text-first model
    "wav2vec2-bert": _projected_features,
    "xcodec2": _codec_with_semantics,
    "xmod": _language,  # X-MOD routes every sample through the adapter of its language
}


#: Inputs a model needs besides its main one, which its signature marks optional.
EXTRA_INPUTS: dict[str, list[str]] = {
    "apertus1p5": ["image_sizes"],  # the image tokenizer crops each image to its true size
    "clvp": ["input_features"],  # the speech conditioning encoder always reads the mel spectrogram
}

#: Input image sizes of models whose configs do not hold it.
IMAGE_SIZES: dict[str, int] = {
    "depth_pro": 4 * PATCH_SIZE,  # the 1/4-scaled image must still hold one patch_size crop
    "efficientloftr": 2 * IMAGE_SIZE,  # coarse features at 1/8, then pooled 4x4 by the attention aggregation
    "fast_vlm": 4 * IMAGE_SIZE,  # FastViT-MCi3 downsamples 64x: a 2 x 2 grid of image features
}

#: Audio encoders (by modeling module) that read (batch, frames, features) rather than (batch, mel bins, frames),
#: with the feature width they expect.
FEATURES_LAST: dict[str, Callable[[Any], int]] = {
    "parakeet": lambda config: config.num_mel_bins,
    "lasr": lambda config: config.num_mel_bins,
    "fun_asr_nano": lambda config: config.input_size,  # mel bins times stacked frames
    "granite_speech5": lambda config: 4 * config.num_mel_bins,  # delta-expanded, then stacked in pairs
    "gemma4": lambda config: config.subsampling_conv_channels[0],  # the projection assumes bins == channels
    "mctct": lambda config: config.input_feat_per_channel * config.input_channels,  # M-CTC-T (deprecated, 4.x)
}


def features_last(model: torch.nn.Module) -> int | None:
    """The feature width of an audio encoder reading (batch, frames, features), None for (batch, bins, frames)."""
    for module in model.modules():
        family = type(module).__module__.rpartition(".modeling_")[2]
        config = getattr(module, "config", None)
        if family in FEATURES_LAST and config is not None:  # the audio tower's config has the fields
            with contextlib.suppress(AttributeError, TypeError, IndexError):
                return FEATURES_LAST[family](config)
    return None


def time_series(config: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
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
