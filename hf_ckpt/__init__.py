"""hf_ckpt: correct, capable and measurable activation checkpointing for Hugging Face Transformers.

The public names are loaded on first use (PEP 562), so that ``import hf_ckpt`` and ``hf-ckpt --help`` do not
import torch and transformers; ``from hf_ckpt import enable`` and ``hf_ckpt.enable`` work as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "HfCkptWarning": "._warnings",
    "CheckpointConfig": ".config",
    "checkpointed_layers": ".core",
    "disable": ".core",
    "enable": ".core",
    "GradientCheckpointingMixin": ".mixin",
    "is_patched": ".patch",
    "patch_transformers": ".patch",
    "unpatch_transformers": ".patch",
    "plan": ".planner",
    "CheckpointPlan": ".plans",
    "SelectiveRecomputeError": ".selective",
    "VerifyReport": ".verification",
    "verify": ".verification",
    "BlockStrategy": ".strategies",
    "register_optimizer_states": "._optimizer_states",
}
_SUBMODULES = ("measure", "distributed", "estimate")

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from ._optimizer_states import register_optimizer_states
    from ._warnings import HfCkptWarning
    from .strategies import BlockStrategy
    from .config import CheckpointConfig
    from .core import checkpointed_layers, disable, enable
    from .mixin import GradientCheckpointingMixin
    from .patch import is_patched, patch_transformers, unpatch_transformers
    from .planner import plan
    from .plans import CheckpointPlan
    from .selective import SelectiveRecomputeError
    from .verification import VerifyReport, verify


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)
