"""Moved to :mod:`hf_ckpt.cli.bench`; this module re-exports it for one release (remove in 0.3)."""

from ..cli.bench import DEFAULT_REPEAT, DEFAULT_WARMUP, add_arguments, default_settings, run  # noqa: F401

#: The old name of :func:`hf_ckpt.cli.bench.default_settings`.
default_strategies = default_settings

__all__ = ["DEFAULT_REPEAT", "DEFAULT_WARMUP", "add_arguments", "default_settings", "default_strategies", "run"]
