"""Renamed :mod:`hf_ckpt.measure.settings`; the old names here keep working for one release (remove in 0.3).

``Strategy``, ``parse_strategy``, ``parse_strategies``, ``register_strategy`` and ``available_strategies`` are
:class:`~hf_ckpt.measure.settings.Setting`, :func:`~hf_ckpt.measure.settings.parse_setting`, ... under their old
names: each use warns once with a ``FutureWarning`` naming the new spelling.
"""

from __future__ import annotations

from typing import Any

from . import settings
from ._renamed import RENAMED, warn_renamed


def __getattr__(name: str) -> Any:
    if name in RENAMED and hasattr(settings, RENAMED[name]):
        return warn_renamed(__name__, name, lambda: getattr(settings, RENAMED[name]))
    if not name.startswith("__"):  # private helpers (_REGISTRY, _upstream_functions, ...) and upstream_supports
        return getattr(settings, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
