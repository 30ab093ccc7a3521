"""Capability detection for the installed torch and transformers.

Every check looks at what the library *has* (attributes, signatures), never at version strings, so that
backports, nightlies and forks are handled by what they actually do.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.utils.checkpoint


@functools.lru_cache(maxsize=None)
def gradient_checkpointing_layer_class() -> type | None:
    """``transformers.modeling_layers.GradientCheckpointingLayer`` where it exists (transformers >= 4.52)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return None
    return GradientCheckpointingLayer


def is_gradient_checkpointing_layer(module: torch.nn.Module) -> bool:
    layer_cls = gradient_checkpointing_layer_class()
    return layer_cls is not None and isinstance(module, layer_cls)


@functools.lru_cache(maxsize=None)
def has_activation_checkpointing_names() -> bool:
    """True where transformers renamed ``gradient_checkpointing_*`` to ``activation_checkpointing_*`` (5.23+)."""
    from transformers import PreTrainedModel

    return hasattr(PreTrainedModel, "activation_checkpointing_enable")


@functools.lru_cache(maxsize=None)
def upstream_supports_every_n_layers() -> bool:
    """True where ``PreTrainedModel.gradient_checkpointing_enable`` accepts ``every_n_layers`` (5.16+)."""
    from transformers import PreTrainedModel

    enable = getattr(PreTrainedModel, "activation_checkpointing_enable", PreTrainedModel.gradient_checkpointing_enable)
    return "every_n_layers" in inspect.signature(enable).parameters


@functools.lru_cache(maxsize=None)
def upstream_supports_offload() -> bool:
    """True where ``PreTrainedModel.gradient_checkpointing_enable`` accepts ``offload`` (5.17+)."""
    from transformers import PreTrainedModel

    enable = getattr(PreTrainedModel, "activation_checkpointing_enable", PreTrainedModel.gradient_checkpointing_enable)
    return "offload" in inspect.signature(enable).parameters


@functools.lru_cache(maxsize=None)
def checkpoint_keyword_names() -> tuple[str, ...]:
    """Keyword arguments that ``torch.utils.checkpoint.checkpoint`` itself consumes.

    Read from its signature; ``preserve_rng_state`` travels through ``**kwargs`` there, and is added when the
    docstring documents it.
    """
    signature = inspect.signature(torch.utils.checkpoint.checkpoint)
    names = [
        name
        for name, parameter in signature.parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    if "preserve_rng_state" not in names and "preserve_rng_state" in (torch.utils.checkpoint.checkpoint.__doc__ or ""):
        names.append("preserve_rng_state")
    return tuple(sorted(names))


def current_accelerator() -> torch.device | None:
    """The accelerator PyTorch would use (CUDA, XPU, MPS, ...), or None on a CPU-only machine."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return accelerator.current_accelerator() if accelerator.is_available() else None
    if torch.cuda.is_available():
        return torch.device("cuda")
    return None


def defined_in(obj: object, package: str, *names: str) -> bool:
    """Whether a class of ``obj``'s hierarchy is one of ``names`` and comes from ``package`` (no import)."""
    return any(
        cls.__name__ in names and (cls.__module__ == package or cls.__module__.startswith(package + "."))
        for cls in type(obj).__mro__
    )


def peft_model_base(model: torch.nn.Module) -> torch.nn.Module | None:
    """The wrapped ``PreTrainedModel`` when ``model`` is a PEFT ``PeftModel``, else None (no peft import)."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        return model.get_base_model()
    return None


def has_peft_adapters(model: torch.nn.Module) -> bool:
    """True when PEFT adapter layers live inside ``model`` (wrapped by ``get_peft_model`` or via ``add_adapter``)."""
    if getattr(model, "_hf_peft_config_loaded", False):
        return True
    return any(
        any(base.__name__ == "BaseTunerLayer" for base in type(module).__mro__) for module in model.modules()
    )
