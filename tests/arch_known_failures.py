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

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class Known:
    """One reviewed failure: the releases it applies to (a version specifier; empty: all) and why."""

    releases: str
    reason: str

    def applies(self, release: str) -> bool:
        return Version(release) in SpecifierSet(self.releases)


#: Reasons starting so are not run (xfail with run=False): one training step takes minutes.
TOO_SLOW = "cannot be built tiny: one training step takes over a minute"

#: By model type; a type's entries cover disjoint release ranges.
KNOWN_FAILURES: dict[str, tuple[Known, ...]] = {
    'fast_vlm': (Known('', 'needs the optional dependency `timm` (its vision tower is a TimmWrapperModel)'),),
    'gemma3n': (Known('', 'needs the optional dependency `timm` (its vision tower is a TimmWrapperModel); its text model passes alone (gemma3n_text)'),),
    'glm_image_vqmodel': (Known('', 'upstream bug: GlmImageVQVAE (modeling_glm_image.py), registered as the glm_image_vqmodel base model, inherits supports_gradient_checkpointing=True but defines no forward (only encode) and no block; reproduction: GlmImageVQVAE(GlmImageVQVAEConfig())(torch.randn(1, 3, 32, 32)) raises NotImplementedError'),),
    'llama4': (Known('', "upstream bug: Llama4ForConditionalGeneration.forward (modeling_llama4.py) builds its output with `image_outputs=outputs.image_outputs` from its language model's MoeCausalLMOutputWithPast, which has no such field: `Llama4ForConditionalGeneration(config)(input_ids=ids)` raises AttributeError for any input, with return_dict=False too"),),
    'pe_audio_video': (Known('', 'needs the optional dependency `timm` (not installed in the test environments): its video tower is a TimmWrapper model'),),
    'pe_audio_video_encoder': (Known('', 'needs the optional dependency `timm` (not installed in the test environments): its video tower is a TimmWrapper model'),),
    'pe_video': (Known('', 'needs the optional dependency `timm` (not installed in the test environments): its vision tower is a TimmWrapper model'),),
    'pe_video_encoder': (Known('', 'needs the optional dependency `timm` (not installed in the test environments): its vision tower is a TimmWrapper model'),),
    'perception_lm': (Known('', 'needs the optional dependency `timm` (not installed in the test environments): its vision tower is a TimmWrapper model'),),
    'pi0': (Known('', "upstream bug: PI0Model.forward runs the VLM prefix with use_cache=True and reads the returned cache (modeling_pi0.py: `vlm_input_length = cache.get_seq_length()`), but with checkpointing on in training the VLM's output-capturing wrapper sets use_cache=False (utils/generic.py), so cache is None; upstream's own gradient_checkpointing_enable() fails the same: `model.train(); model.gradient_checkpointing_enable(); model(input_ids=..., pixel_values=..., pixel_attention_mask=..., action_embeds=...)` raises AttributeError: 'NoneType' object has no attribute 'get_seq_length'"),),
    'qwen2_5_omni': (Known('', 'cannot be measured by counting: Qwen2_5OmniForConditionalGeneration defines no forward (it only generates: thinker, then talker, then token2wav), so there is no training step; its trainable thinker is swept as qwen2_5_omni_thinker'),),
    'qwen3_omni_moe': (Known('', 'cannot be measured by counting: Qwen3OmniMoeForConditionalGeneration defines no forward (it only generates: thinker, then talker, then code2wav), so there is no training step; its trainable thinker is swept as qwen3_omni_moe_thinker'),),
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
