"""hf_ckpt: correct, capable and measurable activation checkpointing for Hugging Face Transformers."""

from ._warnings import HfCkptWarning
from .config import CheckpointConfig
from .core import checkpointed_layers, disable, enable
from .mixin import GradientCheckpointingMixin
from .patch import is_patched, patch_transformers, unpatch_transformers
from .planner import plan
from .plans import CheckpointPlan
from .selective import SelectiveRecomputeError
from .verification import VerifyReport, verify
from . import measure  # noqa: E402  (hf_ckpt.measure: memory, FLOPs, time of a step)
from . import distributed  # noqa: E402  (hf_ckpt.distributed.apply / guard; imports after the core it uses)

__version__ = "0.1.0"

__all__ = [
    "CheckpointConfig",
    "CheckpointPlan",
    "GradientCheckpointingMixin",
    "HfCkptWarning",
    "VerifyReport",
    "checkpointed_layers",
    "disable",
    "enable",
    "is_patched",
    "patch_transformers",
    "plan",
    "SelectiveRecomputeError",
    "unpatch_transformers",
    "verify",
    "__version__",
]
