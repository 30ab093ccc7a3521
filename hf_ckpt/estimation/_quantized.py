"""A base model quantized by bitsandbytes (QLoRA): its weights' bytes as bitsandbytes stores them, and the
dequantized weight each quantized layer makes for its matmul.

transformers replaces every ``nn.Linear`` (and GPT-2's ``Conv1D``) by bitsandbytes' layer, except the modules it
leaves in their dtype (the output embeddings, tied and last weights: ``get_keys_to_not_convert``; and
``llm_int8_skip_modules``, the model's ``_keep_in_fp32_modules``). Measured with bitsandbytes 0.50 on the CPU:

* 4-bit (``nf4``/``fp4``): the weight packed two values a byte, a float32 ``absmax`` per block of 64 and the
  16-value code (64 bytes) per layer; with double quantization the ``absmax`` is one byte a block, with a float32
  scale per 256 blocks, a float32 offset and its own 256-value code (1 KiB) per layer.
* 8-bit (``LLM.int8``): one byte an element and a float32 scale per row.

Biases, norms, embeddings and the layers left out stay in the training dtype. The activations are the traced
ones: bitsandbytes' matmul saves only the quantized weight for backward. Forward and backward each dequantize the
weight into the compute dtype (and, with double quantization, the ``absmax`` into float32): the largest such
layer is a transient of the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

_QUANT_TYPES = ("nf4", "fp4")


@dataclass(frozen=True)
class Quantization:
    """What the estimate reads of a ``BitsAndBytesConfig``."""

    bits: int
    quant_type: str
    double_quant: bool
    compute_dtype: torch.dtype
    skip_modules: tuple[str, ...] | None

    def describe(self) -> str:
        if self.bits == 8:
            return "8bit (LLM.int8)"
        dq = ", double quant" if self.double_quant else ""
        return f"4bit {self.quant_type}{dq}, compute {str(self.compute_dtype).removeprefix('torch.')}"


def check_quantization(value: Any, dtype: torch.dtype) -> Quantization | None:
    """``quantization_config`` read: None, or a ``transformers.BitsAndBytesConfig`` loading in 4 or 8 bits whose
    compute dtype is the training ``dtype``."""
    if value is None:
        return None
    from transformers import BitsAndBytesConfig

    if not isinstance(value, BitsAndBytesConfig):
        raise ValueError("quantization_config must be a transformers.BitsAndBytesConfig (load_in_4bit=True or "
                         f"load_in_8bit=True) or None; got {type(value).__name__}")
    if not (value.load_in_4bit or value.load_in_8bit):
        raise ValueError("quantization_config: set load_in_4bit=True or load_in_8bit=True")
    bits = 4 if value.load_in_4bit else 8
    compute = value.bnb_4bit_compute_dtype if bits == 4 else dtype
    if compute != dtype:
        raise ValueError(f"quantization_config: bnb_4bit_compute_dtype {str(compute).removeprefix('torch.')} differs "
                         f"from the training dtype {str(dtype).removeprefix('torch.')}; only a compute dtype equal to "
                         "it is modelled (set bnb_4bit_compute_dtype to the dtype)")
    quant_type = value.bnb_4bit_quant_type
    if bits == 4 and quant_type not in _QUANT_TYPES:
        raise ValueError(f"quantization_config: bnb_4bit_quant_type must be nf4 or fp4; got {quant_type!r}")
    skip = value.llm_int8_skip_modules
    return Quantization(bits, quant_type, bool(value.bnb_4bit_use_double_quant) and bits == 4, compute,
                        tuple(skip) if skip is not None else None)


def stored_bytes(elements: int, rows: int, quant: Quantization) -> int:
    """Bytes bitsandbytes keeps for a quantized weight of ``elements`` values in ``rows`` rows (its state too)."""
    if quant.bits == 8:
        return elements + 4 * rows
    blocks = math.ceil(elements / 64)
    packed = math.ceil(elements / 2) + 64  # two values a byte, and the 16-value float32 code
    if not quant.double_quant:
        return packed + 4 * blocks
    return packed + blocks + 4 * math.ceil(blocks / 256) + 4 + 1024  # uint8 absmax, its scales, offset, code


def _left_out(model: nn.Module, quant: Quantization) -> list[str]:
    """The module names transformers leaves unquantized (its own rule where this release has it)."""
    try:
        from transformers.quantizers.base import HfQuantizer
    except ImportError:  # pragma: no cover - older releases: the output embeddings only
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        return [name for name, module in model.named_modules() if output is not None and module is output]
    keep = getattr(model, "_keep_in_fp32_modules", None)
    return HfQuantizer.get_modules_to_not_convert(model, list(quant.skip_modules) if quant.skip_modules is not None
                                                  else None, list(keep) if keep else None)


def quantized_weights(model: nn.Module, quant: Quantization) -> dict[int, int]:
    """``id(weight)`` -> stored bytes, for each weight of ``model`` (before adapters are added) that transformers
    quantizes."""
    try:
        from transformers.quantizers.quantizers_utils import should_convert_module
    except ImportError:  # pragma: no cover
        def should_convert_module(name: str, patterns: list[str]) -> bool:
            return not any(name == p or name.endswith("." + p) for p in patterns)
    from transformers.pytorch_utils import Conv1D

    left_out = _left_out(model, quant)
    found = {}
    for name, module in model.named_modules():
        if (type(module) is nn.Linear or isinstance(module, Conv1D)) and should_convert_module(name, left_out):
            weight = module.weight
            rows = weight.shape[1] if isinstance(module, Conv1D) else weight.shape[0]
            found[id(weight)] = stored_bytes(weight.numel(), rows, quant)
    return found


def dequantized_bytes(model: nn.Module, quantized: dict[int, int], quant: Quantization) -> int:
    """The largest transient a quantized layer's matmul makes: its weight dequantized into the compute dtype
    (and the float32 ``absmax`` of a double-quantized one)."""
    size = torch.tensor([], dtype=quant.compute_dtype).element_size()
    largest = 0
    for p in model.parameters():
        if id(p) in quantized:
            extra = 4 * math.ceil(p.numel() / 64) if quant.double_quant else 0
            largest = max(largest, p.numel() * size + extra)
    return largest


class _KeepsInput(torch.autograd.Function):
    """bitsandbytes' 8-bit matmul as the trace sees it: the weight dequantized for the matmul (a transient), the
    input kept for backward (``ctx.A`` in ``MatMul8bitLt`` and ``MatMul8bitFp``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return nn.functional.linear(x, weight.to(x.dtype) * 1, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        return grad.matmul(weight.to(grad.dtype) * 1), None, None


def _keeps_input(module: nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return _KeepsInput.apply(x, module.weight, module.bias)

    return forward


def as_traced(model: nn.Module, quant: Quantization | None) -> None:
    """Make ``model``'s quantized layers save for backward what bitsandbytes' do (before adapters are added): 8-bit
    layers keep their input; 4-bit ones (``MatMul4Bit``) only the quantized weight, as a frozen ``nn.Linear``."""
    if quant is None or quant.bits != 8:
        return
    weights = quantized_weights(model, quant)
    for module in model.modules():
        if type(module) is nn.Linear and id(module.weight) in weights:
            module.forward = _keeps_input(module)
