"""Moved to :mod:`hf_ckpt.cli.verify`; this module re-exports it for one release (remove in 0.3)."""

from ..cli.verify import add_arguments, run  # noqa: F401

__all__ = ["add_arguments", "run"]
