"""Package names loaded on first use (PEP 562), so that importing a package imports none of its heavy modules.

Each lazy package lists ``name -> module`` and binds what :func:`lazy_exports` returns::

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable, Mapping


def lazy_exports(
    package: str, exports: Mapping[str, str], submodules: tuple[str, ...] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each public name to the (relative) module
    that defines it; ``submodules`` are reachable as attributes. A loaded name is cached in the package."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(import_module(exports[name], package), name)
        elif name in submodules:
            value = import_module(f".{name}", package)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports) | set(submodules))

    return __getattr__, __dir__
