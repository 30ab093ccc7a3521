"""Command-line pieces shared by ``hf-ckpt bench``, ``hf-ckpt verify`` and ``hf-ckpt plan``.

The three commands work on the same workload (the embedded tiny Llama by default, a transformers model type built
tiny, or a local model directory): its options are declared once here, and so are the argument types whose
errors argparse turns into one line.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

from ..cli import CommandError
from . import workload as _workload


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a float >= 0, got {text!r}")
    return value


def converter(function: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` that turns ``function``'s ``ValueError`` into a one-line argument error."""

    def convert(text: str) -> Any:
        try:
            return function(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = function.__name__
    return convert


def add_workload_arguments(parser: Any, *, seed_help: str = "seed of the weights and the batch") -> None:
    """Declare ``--model --layers --hidden --batch --seq --dtype --device --seed`` on ``parser`` (or a group)."""
    add = parser.add_argument
    add(
        "--model",
        default=None,
        help="a local model directory, or a transformers model type built tiny with random weights "
        f"(llama, gpt2, bert, t5, ...); default: {_workload.DEFAULT_MODEL}",
    )
    add("--layers", type=positive_int, help=f"layers (per stack); default {_workload.DEFAULT_LAYERS} for a model type")
    add("--hidden", type=positive_int, help=f"hidden size; default {_workload.DEFAULT_HIDDEN} for a model type")
    add("--batch", type=positive_int, default=_workload.DEFAULT_BATCH, help="sequences (default %(default)s)")
    add("--seq", type=positive_int, default=_workload.DEFAULT_SEQ, help="tokens per sequence (default %(default)s)")
    add("--dtype", type=converter(_workload.parse_dtype), default="float32", help="float32 (default), bfloat16 or float16")
    add(
        "--device",
        type=converter(_workload.parse_device),
        default=None,
        help="cpu, cuda, cuda:1, ... (default: the first accelerator, else cpu)",
    )
    add("--seed", type=int, default=0, help=f"{seed_help} (default %(default)s)")


def build_workload_from(args: argparse.Namespace, device: Any = None) -> _workload.Workload:
    """The workload the parsed ``args`` describe; a bad model or size is a one-line :class:`CommandError`."""
    try:
        return _workload.build_workload(
            args.model,
            layers=args.layers,
            hidden=args.hidden,
            batch=args.batch,
            seq=args.seq,
            dtype=args.dtype,
            device=device if device is not None else (args.device or _workload.default_device()),
            seed=args.seed,
        )
    except ValueError as error:
        raise CommandError(str(error)) from None
