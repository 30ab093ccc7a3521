"""Reviewed known failures of the generic architecture sweep, on every release of the matrix.

Each entry names a model type, the transformers releases it fails on (a version specifier: ``"<4.52"``,
``">=5.0,<5.16"``; ``""``: every release that has the type) and why. Where an entry applies, the type's cases are
strict expected failures in ``test_every_model_type``: a fix (upstream, or to the generic builder) turns the sweep
red on that release until the entry's range is narrowed or the entry removed. Categories: an upstream bug (the
reason names the code and gives a reproduction), a model that needs an optional dependency the release's
environment cannot load, and a model with no training forward. Review a release with ``ci/sweep.py --releases
<release>``: it fails on every unreviewed failure, with its message.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class Known:
    """One reviewed failure: the releases it applies to (a version specifier; empty: all) and why."""

    releases: str
    reason: str
    #: An optional dependency the failure is for: where it can be imported (the newest release's sweep environment
    #: has timm), the entry does not apply and the type must pass; so no release range has to follow the newest.
    unless_installed: str = ""

    def applies(self, release: str) -> bool:
        if self.unless_installed and importlib.util.find_spec(self.unless_installed) is not None:
            return False
        return Version(release) in SpecifierSet(self.releases)


#: Reasons starting so are not run (xfail with run=False): one training step takes minutes.
TOO_SLOW = "cannot be built tiny: one training step takes over a minute"

#: The optional dependencies some types import, which the matrix's CPU-torch environments cannot load.
_NEEDS_TIMM = ("needs the optional dependency `timm` (its {tower} is a TimmWrapper model), which needs torchvision: "
               "the index's torchvision is a CUDA build, which does not load beside this environment's CPU torch "
               "(\"operator torchvision::nms does not exist\"); the newest release is swept where it loads, in the torch "
               "range's ceiling environment, and passes there")
_NO_FORWARD = ("cannot be measured by counting: {cls} defines no forward (it only generates: thinker, then talker, "
               "then {vocoder}), so there is no training step; ")
_THINKER = "its trainable thinker is swept as {thinker}"
_NO_THINKER = "this release registers no thinker model type to sweep instead (5.15 does)"
_QFORMER_CONFIG_FLAG = (
    "upstream bug: {encoder}.forward ({module}) checkpoints only if `getattr(self.config, \"gradient_checkpointing\", "
    "False)`, a config attribute nothing sets, instead of its own `self.gradient_checkpointing` flag, so its Q-Former "
    "layers are never checkpointed (hf_ckpt's probe reports the truth; the check expects every selected block); "
    "upstream's own gradient_checkpointing_enable() skips them the same: {reproduction}")

#: By model type; a type's entries cover disjoint release ranges (of the matrix's releases).
KNOWN_FAILURES: dict[str, tuple[Known, ...]] = {
    # ---- upstream bugs, with a reproduction (run in that release's environment)
    "blip-2": (Known("<4.57", _QFORMER_CONFIG_FLAG.format(
        encoder="Blip2QFormerEncoder", module="modeling_blip_2.py",
        reproduction="`m = Blip2QFormerModel(Blip2QFormerConfig(num_hidden_layers=2, hidden_size=32, "
        "num_attention_heads=4, intermediate_size=64, encoder_hidden_size=32)).train(); "
        "m.gradient_checkpointing_enable({\"use_reentrant\": False}); m(query_embeds=x, "
        "encoder_hidden_states=x).last_hidden_state.sum().backward()` runs layer 0 once")),),
    "imagegpt": (Known(">=4.57,<5.0",
        "upstream bug: ImageGPTModel.forward (modeling_imagegpt.py) sets `past_length = ... else past_key_values`, "
        "None without a cache, so any forward with use_cache=False (which checkpointing forces in training) fails "
        "building position_ids; upstream's own gradient_checkpointing_enable() fails the same: "
        "`ImageGPTModel(ImageGPTConfig(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=16))` with "
        "checkpointing on, `m(ids)` raises TypeError: unsupported operand type(s) for +: 'int' and 'NoneType'"),),
    "instructblip": (Known("<4.57", _QFORMER_CONFIG_FLAG.format(
        encoder="InstructBlipQFormerEncoder", module="modeling_instructblip.py",
        reproduction="InstructBlipQFormerModel runs its layer 0 once in a training step")),),
    "instructblipvideo": (Known("<4.57", _QFORMER_CONFIG_FLAG.format(
        encoder="InstructBlipVideoQFormerEncoder", module="modeling_instructblipvideo.py",
        reproduction="InstructBlipVideoQFormerModel runs its layer 0 once in a training step")),),
    "maskformer-swin": (Known("<4.57",
        "upstream bug: MaskFormerSwinEncoder.forward (modeling_maskformer_swin.py) hands its checkpoint function "
        "`layer_module.__call__, hidden_states, layer_head_mask, output_attentions`, dropping `input_dimensions`, so "
        "MaskFormerSwinStage.forward's `height, width = input_dimensions` gets None; upstream's own "
        "gradient_checkpointing_enable() fails the same: `m = MaskFormerSwinModel(MaskFormerSwinConfig(embed_dim=16, "
        "depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])).train(); m.gradient_checkpointing_enable({\"use_reentrant\": "
        "False}); m(torch.randn(1, 3, 64, 64))` raises TypeError: cannot unpack non-iterable NoneType object"),),
    "moonshine": (Known(">=4.51,<4.57",
        "upstream bug: MoonshineDecoder.forward (modeling_moonshine.py) passes its layer's arguments positionally in "
        "an order MoonshineDecoderLayer.forward does not have, so past_key_value receives the bool use_cache; "
        "upstream's own gradient_checkpointing_enable() fails the same: `MoonshineModel(MoonshineConfig(hidden_size=32, "
        "intermediate_size=64, encoder_num_hidden_layers=2, decoder_num_hidden_layers=2, encoder_num_attention_heads=4, "
        "decoder_num_attention_heads=4, vocab_size=128))` with checkpointing on, `m(torch.randn(1, 4000), "
        "decoder_input_ids=ids)` raises AttributeError: 'bool' object has no attribute 'is_updated'"),),
    "pop2piano": (Known(">=4.51,<4.57",
        "upstream bug: Pop2PianoStack.forward (modeling_pop2piano.py) passes cache_position in the position of "
        "Pop2PianoBlock.forward's return_dict, so cache_position is None and Pop2PianoAttention.forward's "
        "`cache_position[-1]` fails; upstream's own gradient_checkpointing_enable() fails the same: "
        "Pop2PianoForConditionalGeneration (d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=128) "
        "with checkpointing on, `m(inputs_embeds=torch.randn(1, 8, 32), decoder_input_ids=ids)` raises TypeError: "
        "'NoneType' object is not subscriptable"),),
    "recurrent_gemma": (Known("<5.0",
        "upstream bug: RecurrentGemmaRglru.forward (modeling_recurrent_gemma.py) keeps its final state in "
        "`self.recurrent_states` and starts its next call from it, with use_cache=False too, so a checkpointed "
        "block's recompute starts from the state the forward just stored instead of zeros and runs a different "
        "graph; upstream's own gradient_checkpointing_enable() fails the same: `m = RecurrentGemmaModel("
        "RecurrentGemmaConfig(num_hidden_layers=1, block_types=[\"recurrent\"], vocab_size=128, hidden_size=32, "
        "intermediate_size=64, num_attention_heads=4, lru_width=32)).train(); m.gradient_checkpointing_enable("
        "{\"use_reentrant\": False}); m(ids).last_hidden_state.sum().backward()` raises CheckpointError"),),
    "speech_to_text_2": (Known(">=4.51,<5.0",
        "upstream bug: Speech2Text2PreTrainedModel._init_weights (deprecated/speech_to_text_2/"
        "modeling_speech_to_text_2.py) reads `module.weight` of Speech2Text2SinusoidalPositionalEmbedding, which has "
        "`weights`, so `Speech2Text2ForCausalLM(Speech2Text2Config(d_model=32, decoder_layers=2, "
        "decoder_attention_heads=4, decoder_ffn_dim=64, vocab_size=128))` raises AttributeError; a model loaded with "
        "from_pretrained has no `weights` either and its forward raises AttributeError: it cannot train"),),
    "udop": (Known("<4.57",
        "upstream bug: UdopStack.forward (modeling_udop.py) has no checkpointed branch and the stack has no "
        "gradient_checkpointing flag; only UdopAttention has one, and it only makes the zero position bias require "
        "grad, so nothing is ever checkpointed and hf_ckpt finds no block; upstream's own "
        "gradient_checkpointing_enable() checkpoints nothing: after `m.gradient_checkpointing_enable()` on "
        "`UdopModel(UdopConfig(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=128))`, only "
        "attention modules have the flag set"),),
    "umt5": (Known("<4.57",
        "upstream bug: UMT5Stack.forward (modeling_umt5.py) sets `hidden_states = layer_outputs[0]` only in the "
        "non-checkpointed branch, so with checkpointing every block's output is dropped: no block parameter gets a "
        "gradient and none is recomputed; upstream's own gradient_checkpointing_enable() fails the same: with "
        "`UMT5Model(UMT5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=128))`, one "
        "training step leaves `encoder.block[0].layer[0].SelfAttention.q.weight.grad` None"),),
    "zoedepth": (Known("<4.51",
        "upstream bug: its BEiT backbone's BeitEncoder.forward (modeling_beit.py) drops `resolution` in its "
        "checkpointed branch, so a BEiT with use_relative_position_bias=True (ZoeDepth's backbone) fails in "
        "BeitSelfAttention.forward at `height, width = resolution`; upstream's own gradient_checkpointing_enable() "
        "fails the same: `m = BeitModel(BeitConfig(use_relative_position_bias=True, hidden_size=32, "
        "num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8)).train(); "
        "m.gradient_checkpointing_enable({\"use_reentrant\": False}); m(torch.randn(1, 3, 32, 32))` raises "
        "TypeError: cannot unpack non-iterable NoneType object"),),
    "dbrx": (Known(">=5.0,<5.15",
        "upstream bug in 5.0: DbrxRouter.__init__ (modeling_dbrx.py) builds its router as nn.Linear("
        "ffn_config.ffn_hidden_size, moe_num_experts) but applies it to the d_model-wide hidden states, so any config "
        "whose ffn_hidden_size differs from d_model (the defaults: 3584 and 2048) fails (5.15 sizes it by "
        "hidden_size); reproduction: `DbrxModel(DbrxConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=128, "
        "attn_config={\"kv_n_heads\": 1, \"rope_theta\": 10000.0, \"clip_qkv\": 8.0}, ffn_config={\"hidden_size\": 32, "
        "\"ffn_hidden_size\": 64, \"moe_num_experts\": 4, \"moe_top_k\": 2}))(torch.randint(0, 128, (1, 8)))` raises "
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x32 and 64x4)"),),
    "glm_image_vqmodel": (Known("",
        "upstream bug: GlmImageVQVAE (modeling_glm_image.py), registered as the glm_image_vqmodel base model, "
        "inherits supports_gradient_checkpointing=True but defines no forward (only encode) and no block; "
        "reproduction: `GlmImageVQVAE(GlmImageVQVAEConfig())(torch.randn(1, 3, 32, 32))` raises NotImplementedError"),),
    "llama4": (
        Known(">=5.0,<5.15",
              "upstream bug in 5.0: Llama4ForConditionalGeneration.__init__ (modeling_llama4.py) reads "
              "self.config.pad_token_id, which Llama4Config does not declare (the pad token id lives in text_config; "
              "huggingface/transformers#43525, fixed by #43539), so the model cannot be built from any Llama 4 "
              "config: `with torch.device(\"meta\"): Llama4ForConditionalGeneration(Llama4Config())` raises "
              "AttributeError: 'Llama4Config' object has no attribute 'pad_token_id'"),
        Known(">=5.24,<5.25",
              "upstream bug in 5.24 (fixed in 5.25): Llama4ForConditionalGeneration.forward (modeling_llama4.py) builds its output with "
              "`image_outputs=outputs.image_outputs` from its language model's MoeCausalLMOutputWithPast, which has no "
              "such field: `Llama4ForConditionalGeneration(config)(input_ids=ids)` raises AttributeError for any "
              "input, with return_dict=False too"),
    ),
    "pi0": (Known("",
        "upstream bug: PI0Model.forward runs the VLM prefix with use_cache=True and reads the returned cache "
        "(modeling_pi0.py: `vlm_input_length = past_key_values.get_seq_length()`, `cache.get_seq_length()` on 5.24, "
        "`vlm_block_length = cache.get_seq_length() + ...` on 5.25), "
        "but with checkpointing on in training the VLM's output-capturing wrapper sets use_cache=False "
        "(utils/generic.py), so the cache is None; upstream's own gradient_checkpointing_enable() fails the same: "
        "`model.train(); model.gradient_checkpointing_enable(); model(input_ids=..., pixel_values=..., "
        "pixel_attention_mask=..., action_embeds=...)` raises AttributeError: 'NoneType' object has no attribute "
        "'get_seq_length'"),),
    "pi05": (Known("",
        "upstream bug, as pi0's: PI05Model.forward (modeling_pi05.py) runs the VLM prefix with use_cache=True and reads "
        "the returned cache (`vlm_block_length = cache.get_seq_length() + ...`), but with checkpointing on in training "
        "the VLM's output-capturing wrapper sets use_cache=False (utils/generic.py), so the cache is None; upstream's "
        "own activation_checkpointing_enable() (and gradient_checkpointing_enable()) fails the same, run in 5.25.0: "
        "`t = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, "
        "num_key_value_heads=1, head_dim=8, vocab_size=128); m = PI05Model(PI05Config(chunk_size=4, vlm_config={"
        "\"model_type\": \"paligemma\", \"image_token_id\": 127, \"projection_dim\": 32, \"text_config\": "
        "{\"model_type\": \"gemma\", **t}, \"vision_config\": {\"model_type\": \"siglip_vision_model\", "
        "\"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"image_size\": 32, \"patch_size\": 8, \"projection_dim\": 32}}, dit_config={\"model_type\": \"gemma\", "
        "**t})).train(); m.activation_checkpointing_enable(); m(input_ids=ids, attention_mask=..., "
        "pixel_values=torch.randn(1, 1, 3, 32, 32), pixel_attention_mask=torch.ones(1, 1, dtype=torch.bool), "
        "action_embeds=torch.randn(1, 4, 32), timestep_embeds=torch.randn(1, 32))` (ids: 16 image tokens, then "
        "text) raises AttributeError: 'NoneType' object has no attribute 'get_seq_length' (without checkpointing it "
        "returns the (1, 4, 32) action states)"),),
    # ---- no training forward
    "qwen2_5_omni": (
        Known("<5.15", _NO_FORWARD.format(cls="Qwen2_5OmniForConditionalGeneration", vocoder="token2wav") + _NO_THINKER),
        Known(">=5.15", _NO_FORWARD.format(cls="Qwen2_5OmniForConditionalGeneration", vocoder="token2wav")
              + _THINKER.format(thinker="qwen2_5_omni_thinker")),
    ),
    "qwen3_omni_moe": (
        Known("<5.15", _NO_FORWARD.format(cls="Qwen3OmniMoeForConditionalGeneration", vocoder="code2wav") + _NO_THINKER),
        Known(">=5.15", _NO_FORWARD.format(cls="Qwen3OmniMoeForConditionalGeneration", vocoder="code2wav")
              + _THINKER.format(thinker="qwen3_omni_moe_thinker")),
    ),
    # ---- optional dependencies the release's environment cannot load
    "deta": (Known("<5.0",
        "needs the optional dependency `torchvision` (its deformable attention's NMS): the index's torchvision is a "
        "CUDA build, which does not load beside this environment's CPU torch (libc10_cuda.so missing)"),),
    "fast_vlm": (Known(">=5.0", _NEEDS_TIMM.format(tower="vision tower"), unless_installed="timm"),),
    "gemma3n": (Known(">=4.57", _NEEDS_TIMM.format(tower="vision tower"), unless_installed="timm"),),
    "pe_audio_video": (Known(">=5.0", _NEEDS_TIMM.format(tower="video tower"), unless_installed="timm"),),
    "pe_audio_video_encoder": (Known(">=5.0", _NEEDS_TIMM.format(tower="video tower"), unless_installed="timm"),),
    "pe_video": (Known(">=5.0", _NEEDS_TIMM.format(tower="vision tower"), unless_installed="timm"),),
    "pe_video_encoder": (Known(">=5.0", _NEEDS_TIMM.format(tower="vision tower"), unless_installed="timm"),),
    "perception_lm": (Known(">=4.57", _NEEDS_TIMM.format(tower="vision tower"), unless_installed="timm"),),
    "qdqbert": (Known("<5.0",
        "needs the optional dependency `pytorch-quantization`, which cannot be installed: PyPI has only a "
        "placeholder package that refuses to install (the real one is on NVIDIA's own index)"),),
}


def known_failures(release: str) -> dict[str, str]:
    """The reviewed reason of every model type known to fail on ``release``."""
    found = {}
    for model_type, entries in KNOWN_FAILURES.items():
        reasons = [entry.reason for entry in entries if entry.applies(release)]
        if len(reasons) > 1:
            raise ValueError(f"{model_type}: {len(reasons)} known-failure entries apply to {release}")
        if reasons:
            found[model_type] = reasons[0]
    return found
