"""hf_ckpt: correct, capable and measurable activation checkpointing for Hugging Face Transformers.

The public names are imported on first use (PEP 562 ``__getattr__``), so ``import hf_ckpt`` and the ``hf-ckpt``
command's ``--help`` do not import torch or transformers; ``hf_ckpt.enable`` and every other name in ``__all__``
work as before, and so do the subpackages ``hf_ckpt.measure`` and ``hf_ckpt.distributed`` as attributes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
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
}
#: subpackages reachable as attributes without an explicit import
_SUBPACKAGES = ("measure", "distributed")

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


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from . import distributed, measure
    from ._warnings import HfCkptWarning
    from .config import CheckpointConfig
    from .core import checkpointed_layers, disable, enable
    from .mixin import GradientCheckpointingMixin
    from .patch import is_patched, patch_transformers, unpatch_transformers
    from .planner import plan
    from .plans import CheckpointPlan
    from .selective import SelectiveRecomputeError
    from .verification import VerifyReport, verify
