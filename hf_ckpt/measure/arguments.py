"""Moved to :mod:`hf_ckpt.cli.arguments`; this module re-exports it for one release (remove in 0.3).

New code imports ``hf_ckpt.cli.arguments``: importing this module first imports :mod:`hf_ckpt.measure` (torch).
"""

from ..cli._workload import build_workload_from  # noqa: F401
from ..cli.arguments import (  # noqa: F401
    add_workload_arguments,
    converter,
    non_negative_float,
    non_negative_int,
    positive_int,
)

__all__ = [
    "add_workload_arguments",
    "build_workload_from",
    "converter",
    "non_negative_float",
    "non_negative_int",
    "positive_int",
]
