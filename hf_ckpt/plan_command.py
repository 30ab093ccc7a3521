"""Moved to :mod:`hf_ckpt.cli.plan`; this module re-exports it for one release (remove in 0.3)."""

from .cli.plan import add_arguments, run  # noqa: F401

__all__ = ["add_arguments", "run"]
