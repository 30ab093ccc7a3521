"""Old names of the bench's settings, kept for one release (remove in 0.3): each use warns once, at the user's line.

The bench's named configurations were called "strategies" until the per-block strategy
(:class:`hf_ckpt.BlockStrategy`) got that word; they are *settings* now (:mod:`hf_ckpt.measure.settings`).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

#: Old public name -> new public name.
RENAMED = {
    "Strategy": "Setting",
    "StrategyResult": "SettingResult",
    "available_strategies": "available_settings",
    "parse_strategies": "parse_settings",
    "parse_strategy": "parse_setting",
    "register_strategy": "register_setting",
}


def _from_import_machinery() -> bool:
    """Whether the attribute is being looked up by ``importlib``'s ``from package import name`` pre-check
    (``hasattr``), which the ``from`` statement's own look-up follows: that one warns, so the statement warns once."""
    caller = sys._getframe(3)  # _from_import_machinery <- warn_renamed <- the module's __getattr__ <- caller
    return caller.f_code.co_filename.startswith("<frozen importlib")


def warn_renamed(module: str, old: str, new_value: Callable[[], Any]) -> Any:
    """``new_value()``, after a ``FutureWarning`` naming the new spelling, attributed to the caller's caller."""
    new = RENAMED[old]
    if not _from_import_machinery():
        warnings.warn(
            f"{module}.{old} is renamed {module}.{new} (the bench compares settings; a per-block strategy is "
            f"hf_ckpt.BlockStrategy); the old name will be removed in hf_ckpt 0.3",
            FutureWarning,
            stacklevel=3,
        )
    return new_value()
