"""Moved to :mod:`hf_ckpt.cli.bench`; this module re-exports it for one release (remove in 0.3)."""

from ..cli._bench_run import default_settings  # noqa: F401
from ..cli.bench import DEFAULT_REPEAT, DEFAULT_WARMUP, add_arguments, run  # noqa: F401

#: The old name of :func:`hf_ckpt.cli._bench_run.default_settings`.
default_strategies = default_settings

__all__ = ["DEFAULT_REPEAT", "DEFAULT_WARMUP", "add_arguments", "default_settings", "default_strategies", "run"]
