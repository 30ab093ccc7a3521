"""Moved to :mod:`hf_ckpt.cli.bench`; this module re-exports it for one release (remove in 0.3)."""

from ..cli.bench import DEFAULT_REPEAT, DEFAULT_WARMUP, add_arguments, default_strategies, run  # noqa: F401

__all__ = ["DEFAULT_REPEAT", "DEFAULT_WARMUP", "add_arguments", "default_strategies", "run"]
