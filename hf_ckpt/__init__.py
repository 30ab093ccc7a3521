"""hf_ckpt: correct, capable and measurable activation checkpointing for Hugging Face Transformers."""

from ._warnings import HfCkptWarning
from .config import CheckpointConfig
from .core import checkpointed_layers, disable, enable
from .mixin import GradientCheckpointingMixin
from .patch import is_patched, patch_transformers, unpatch_transformers

__version__ = "0.1.0"

__all__ = [
    "CheckpointConfig",
    "GradientCheckpointingMixin",
    "HfCkptWarning",
    "checkpointed_layers",
    "disable",
    "enable",
    "is_patched",
    "patch_transformers",
    "unpatch_transformers",
    "__version__",
]
