"""Argument types and the workload options shared by ``hf-ckpt bench``, ``plan`` and ``verify``, and the workload
they describe.

Every value is checked while parsing, before any model is built: a wrong value is an argparse error, one line
naming the argument (and the file, for a model directory). Nothing here imports torch or transformers at module
level; the types that need them (``--device``, a model type name) load them when such a value is given, and
:func:`build_workload_from` when a command runs (:mod:`hf_ckpt.measure` loads a name on its first use).

The defaults below are those of :mod:`hf_ckpt.measure.workload` (a test keeps them equal); they are repeated
here so that ``--help`` does not import torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import struct
from typing import Any, Callable

from hf_ckpt import measure
from hf_ckpt.cli.errors import CommandError
from hf_ckpt.runtime.util import dtype_names
from hf_ckpt.runtime.util.units import precision_label

DEFAULT_MODEL = "llama"
DEFAULT_LAYERS = 8
DEFAULT_HIDDEN = 256
DEFAULT_BATCH = 2
DEFAULT_SEQ = 256


def positive_int(text: str) -> int:
    """An int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A float >= 0."""
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


def dtype_name(text: str) -> str:
    """``--dtype``: ``float32``, ``bfloat16`` or ``float16`` (``fp32``, ``bf16``, ``fp16`` accepted); the torch name."""
    name = dtype_names.dtype_name(text)
    if name is None:
        accepted, aliases = ", ".join(dtype_names.DTYPE_NAMES), ", ".join(dtype_names.DTYPE_ALIASES)
        raise argparse.ArgumentTypeError(f"dtype must be one of {accepted} (or {aliases}); got {text!r}")
    return name


def autocast_name(text: str) -> str:
    """``--autocast``: ``bfloat16`` or ``float16`` (``bf16``, ``fp16`` accepted); the torch name."""
    name = dtype_names.dtype_name(text)
    if name not in ("bfloat16", "float16"):
        raise argparse.ArgumentTypeError(f"--autocast must be bfloat16 or float16 (or bf16, fp16); got {text!r}")
    return name


def device(text: str) -> Any:
    """``--device``: a ``torch.device`` that exists on this machine."""
    return converter(measure.workload.parse_device)(text)  # torch loads when the option is given, not for --help


def output_file(text: str) -> str:
    """A path a file can be written to: not a directory, in a folder that exists."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory; expected a file path such as {os.path.join(text, 'out.json')}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder} of {text} does not exist")
    return text


def png_file(text: str) -> str:
    """An :func:`output_file` for a plot; matplotlib must be installed."""
    path = output_file(text)
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError("needs matplotlib: pip install 'hf_ckpt[bench]'")
    return path


def _looks_like_path(spec: str) -> bool:
    return os.sep in spec or spec.startswith(".") or os.path.exists(spec)


def _known_model_types() -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # imports torch: only for --model

    return CONFIG_MAPPING_NAMES


def _check_config(path: str) -> None:
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"{path}: cannot read it ({error.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise argparse.ArgumentTypeError(f"{path}: not valid JSON ({error})") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str):
        raise argparse.ArgumentTypeError(f"{path}: no \"model_type\" string in it; a transformers config has one")
    if model_type not in _known_model_types():
        import transformers

        raise argparse.ArgumentTypeError(
            f"{path}: unknown model_type {model_type!r} (not a model type of transformers {transformers.__version__})"
        )


def _check_safetensors(path: str) -> None:
    """A cheap structural check: the JSON header is whole and the tensors it lists fit in the file."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if 8 + length > size:
                raise ValueError(f"its header claims {length} bytes, the file has {size}")
            header = json.loads(handle.read(length))
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    except (struct.error, ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
        detail = str(error) if isinstance(error, ValueError) else "header unreadable"
        raise argparse.ArgumentTypeError(f"{path}: not a valid safetensors file ({detail})") from None
    if ends and 8 + length + max(ends) > size:
        raise argparse.ArgumentTypeError(f"{path}: not a valid safetensors file (truncated: tensors end past the file)")


def model_spec(text: str) -> str:
    """A model directory with a readable ``config.json`` (and whole ``.safetensors`` files), or a model type."""
    if _looks_like_path(text):
        if not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"model directory {text!r} does not exist")
        config = os.path.join(text, "config.json")
        if not os.path.isfile(config):
            raise argparse.ArgumentTypeError(f"model directory {text!r} has no config.json")
        _check_config(config)
        for name in sorted(os.listdir(text)):
            if name.endswith(".safetensors"):
                _check_safetensors(os.path.join(text, name))
        return text
    if text not in _known_model_types():
        raise argparse.ArgumentTypeError(
            f"unknown model {text!r}: not a directory, and not a transformers model type (e.g. llama, gpt2, bert, t5)"
        )
    return text


def add_workload_arguments(parser: Any, *, seed_help: str = "seed of the weights and the batch") -> None:
    """Declare ``--model --layers --hidden --batch --seq --dtype --autocast --device --seed`` on ``parser`` (or a
    group)."""
    add = parser.add_argument
    add(
        "--model",
        type=model_spec,
        default=None,
        help="a local model directory (its config.json; its weights when there are no size overrides), or a "
        f"transformers model type built tiny with random weights (llama, gpt2, bert, t5, ...); default: {DEFAULT_MODEL}",
    )
    add("--layers", type=positive_int, help=f"layers (per stack); default {DEFAULT_LAYERS} for a model type")
    add("--hidden", type=positive_int, help=f"hidden size; default {DEFAULT_HIDDEN} for a model type")
    add("--batch", type=positive_int, default=DEFAULT_BATCH, help="sequences (default %(default)s)")
    add("--seq", type=positive_int, default=DEFAULT_SEQ, help="tokens per sequence (default %(default)s)")
    add("--dtype", type=dtype_name, default="float32", help="float32 (default), bfloat16 or float16")
    add("--autocast", type=autocast_name, default=None, metavar="DTYPE",
        help="mixed precision: forward under autocast to bfloat16 or float16 over --dtype weights, as the Trainer's "
        "bf16=True runs it (--autocast bf16)")
    add("--device", type=device, default=None, help="cpu, cuda, cuda:1, ... (default: the first accelerator, else cpu)")
    add("--seed", type=int, default=0, help=f"{seed_help} (default %(default)s)")


def build_workload_from(args: argparse.Namespace, device: Any = None) -> Any:
    """The :class:`~hf_ckpt.measure.Workload` the parsed ``args`` describe.

    A model directory that passed the parse-time checks can still fail to load (weights that do not match the
    config, a format transformers refuses): that is a one-line :class:`CommandError` naming the directory.
    """
    spec = args.model
    try:
        return measure.workload.build_workload(
            spec,
            layers=args.layers,
            hidden=args.hidden,
            batch=args.batch,
            seq=args.seq,
            dtype=measure.workload.parse_dtype(args.dtype) if isinstance(args.dtype, str) else args.dtype,
            device=device if device is not None else (args.device or measure.workload.default_device()),
            seed=args.seed,
            autocast=measure.workload.parse_dtype(args.autocast) if getattr(args, "autocast", None) else None,
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
