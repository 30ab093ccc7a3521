"""hf_ckpt: correct, capable and measurable activation checkpointing for Hugging Face Transformers.

The public names are loaded on first use (PEP 562), so that ``import hf_ckpt`` and ``hf-ckpt --help`` do not
import torch and transformers; ``from hf_ckpt import enable`` and ``hf_ckpt.enable`` work as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_ckpt.runtime.util.lazy import lazy_exports
from hf_ckpt.runtime.util.version import VERSION

# The packages that extend the runtime register with it (the kinds, the guard, the unwrappers), loading no torch.
from hf_ckpt import distributed, integrations, strategies  # noqa: F401

__version__ = VERSION

#: Public name -> the module that defines it.
_EXPORTS = {
    "HfCkptWarning": ".runtime.util.warn",
    "CheckpointConfig": ".runtime.config",
    "checkpointed_layers": ".core",
    "disable": ".core",
    "enable": ".core",
    "GradientCheckpointingMixin": ".mixin",
    "is_patched": ".patch",
    "patch_transformers": ".patch",
    "unpatch_transformers": ".patch",
    "plan": ".planning.planner",
    "CheckpointPlan": ".runtime.plans",
    "SelectiveRecomputeError": ".strategies.selective.policy",
    "VerifyReport": ".verification",
    "verify": ".verification",
    "BlockStrategy": ".strategies",
    "register_optimizer_states": ".meters.optimizer_states",
    "estimate": ".estimation._estimate",
}
_SUBMODULES = ("measure", "distributed", "estimation")

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from hf_ckpt.meters.optimizer_states import register_optimizer_states
    from hf_ckpt.runtime.util.warn import HfCkptWarning
    from hf_ckpt.strategies import BlockStrategy
    from hf_ckpt.runtime.config import CheckpointConfig
    from hf_ckpt.core import checkpointed_layers, disable, enable
    from hf_ckpt.estimation import estimate
    from hf_ckpt.mixin import GradientCheckpointingMixin
    from hf_ckpt.patch import is_patched, patch_transformers, unpatch_transformers
    from hf_ckpt.planning.planner import plan
    from hf_ckpt.runtime.plans import CheckpointPlan
    from hf_ckpt.strategies.selective.policy import SelectiveRecomputeError
    from hf_ckpt.verification import VerifyReport, verify


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)
