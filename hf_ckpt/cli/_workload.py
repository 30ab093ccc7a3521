"""The workload a command's parsed arguments describe (runners only: it imports torch and transformers)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from hf_ckpt.runtime.units import precision_label
from hf_ckpt.measure import workload
from hf_ckpt.cli.errors import CommandError


def build_workload_from(args: argparse.Namespace, device: Any = None) -> Any:
    """The :class:`~hf_ckpt.measure.Workload` the parsed ``args`` describe.

    A model directory that passed the parse-time checks can still fail to load (weights that do not match the
    config, a format transformers refuses): that is a one-line :class:`CommandError` naming the directory.
    """
    spec = args.model
    try:
        return workload.build_workload(
            spec,
            layers=args.layers,
            hidden=args.hidden,
            batch=args.batch,
            seq=args.seq,
            dtype=workload.parse_dtype(args.dtype) if isinstance(args.dtype, str) else args.dtype,
            device=device if device is not None else (args.device or workload.default_device()),
            seed=args.seed,
            autocast=workload.parse_dtype(args.autocast) if getattr(args, "autocast", None) else None,
        )
    except ValueError as error:
        if spec is None or not os.path.isdir(spec):
            raise CommandError(str(error)) from None
        raise _load_error(spec, error) from None
    except Exception as error:  # noqa: BLE001  (a user's directory: any loading failure is a one-line error)
        if spec is None or not os.path.isdir(spec):
            raise
        raise _load_error(spec, error) from None


def _load_error(directory: str, error: BaseException) -> CommandError:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return CommandError(f"cannot load the model in {directory}: {type(error).__name__}: {lines[0] if lines else ''}")


def workload_line(info: dict[str, Any]) -> str:
    """One line on the model and batch a command ran on (``Workload.info``)."""
    return (
        f"model: {info['class']} ({info['source']}), {info['layers']} layers, hidden {info['hidden']}; "
        f"batch {info['batch']} x seq {info['seq']}, {precision_label(info['dtype'], info.get('autocast'))} on "
        f"{info['device']}"
    )
