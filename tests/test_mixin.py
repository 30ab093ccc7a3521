"""The mixin's method names stay coherent with upstream's, on every release."""

import warnings

import pytest

from transformers import PreTrainedModel

import hf_ckpt
from helpers import batch_for, recomputed_in_step, tiny_llama

RENAMED = hasattr(PreTrainedModel, "activation_checkpointing_enable")


def _mixin_llama():
    cls = type("CkptLlama", (hf_ckpt.GradientCheckpointingMixin, type(tiny_llama())), {})
    return tiny_llama(cls=cls)


def test_names_follow_the_installed_release():
    model = _mixin_llama()
    assert hasattr(model, "activation_checkpointing_enable") == RENAMED
    assert hasattr(model, "activation_checkpointing_disable") == RENAMED


def test_kwargs_dict_and_arguments():
    model = _mixin_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"every_n_layers": 2, "use_reentrant": True})
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == [0, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert model.is_gradient_checkpointing
        model.gradient_checkpointing_disable()
        assert not model.is_gradient_checkpointing


def _future_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, FutureWarning)]


def test_deprecation_warnings_match_the_installed_release():
    """From 5.23 the old names warn exactly as upstream's do and the new ones never warn; before, nothing warns."""
    model = _mixin_llama()
    if RENAMED:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            model.activation_checkpointing_enable(every_n_layers=2)
            assert model.is_activation_checkpointing
            model.activation_checkpointing_disable()
        assert _future_warnings(record) == []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.gradient_checkpointing_enable(every_n_layers=2)
    expected = (
        ["`gradient_checkpointing_enable` is deprecated and will be removed in v6. Use `activation_checkpointing_enable` instead."]
        if RENAMED
        else []
    )
    assert _future_warnings(record) == expected
    recomputed, _ = recomputed_in_step(model, batch_for(model))
    assert recomputed == [0, 2]


def test_post_init_backward_compatibility_path():
    """``config.gradient_checkpointing=True`` makes ``post_init`` call the enable method: the mixin's, no recursion."""
    model = tiny_llama()
    model.config.gradient_checkpointing = True
    cls = type("CkptLlama", (hf_ckpt.GradientCheckpointingMixin, type(model)), {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        rebuilt = cls(model.config)
    assert hf_ckpt.checkpointed_layers(rebuilt) == [0, 1, 2, 3]


def test_the_mixin_provides_the_new_names_itself():
    """Deleting the mixin's ``activation_checkpointing_*`` would route through upstream's and warn: caught here."""
    model = _mixin_llama()
    for name in ("activation_checkpointing_enable", "activation_checkpointing_disable"):
        if RENAMED:
            assert getattr(type(model), name) is hf_ckpt.GradientCheckpointingMixin.__dict__[name]
        else:  # the mixin does not invent names the release lacks
            assert not hasattr(model, name) and name not in hf_ckpt.GradientCheckpointingMixin.__dict__


@pytest.mark.skipif(not RENAMED, reason="the activation_* names and their hand-off exist from transformers 5.23")
@pytest.mark.parametrize("patched", [True, False])
def test_new_names_hand_off_to_an_instance_wrapper_as_upstream_does(patched):
    """TRL wraps the instance's ``gradient_checkpointing_enable`` to take its own keys out of the kwargs dict."""
    if patched:
        hf_ckpt.patch_transformers()
        model = tiny_llama()
    else:
        model = _mixin_llama()
    original = model.gradient_checkpointing_enable
    seen = []

    def wrapper(gradient_checkpointing_kwargs=None, **kwargs):
        kwargs_dict = dict(gradient_checkpointing_kwargs or {})
        seen.append(kwargs_dict.pop("selective", None))
        original(gradient_checkpointing_kwargs=kwargs_dict, **kwargs)

    model.gradient_checkpointing_enable = wrapper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.activation_checkpointing_enable({"every_n_layers": 2, "selective": True})
    assert seen == [True]
    assert recomputed_in_step(model, batch_for(model))[0] == [0, 2]


@pytest.mark.skipif(not RENAMED, reason="the deprecated names warn from transformers 5.23")
def test_the_deprecation_warning_is_filtered_like_upstreams():
    model = _mixin_llama()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=FutureWarning, module="transformers")
        # The exact text is the contract here: the mixin mirrors upstream's deprecation message on purpose, so that
        # filters written for upstream's warning catch the mixin's too.
        with pytest.raises(FutureWarning, match="`gradient_checkpointing_enable` is deprecated"):
            model.gradient_checkpointing_enable()
        with pytest.raises(FutureWarning, match="`gradient_checkpointing_enable` is deprecated"):
            tiny_llama().gradient_checkpointing_enable()  # upstream's own, for comparison
