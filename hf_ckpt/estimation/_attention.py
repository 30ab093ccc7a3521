"""Which tensors the attention kernel of the target device keeps for backward: traced on CPU, modelled on CUDA.

The estimate is traced on fake CPU tensors, so on ``device="cpu"`` ``scaled_dot_product_attention`` dispatches
exactly as a real CPU step would (the fused CPU kernel where its conditions hold, which keeps query, key, value,
output and log-sum-exp; otherwise the math path, which keeps the attention probabilities, ``batch x heads x
seq x seq``). Nothing about it is modelled.

On CUDA the fused kernels cannot be dispatched without the device. They are **modelled**: the flash kernel
(fp16/bf16, no explicit mask) and the memory-efficient kernel (an explicit mask, or fp32) both keep only
query, key, value, the output and the log-sum-exp (fp32, ``batch x heads x seq``; the memory-efficient kernel
pads it to a multiple of 32 rows, under 1% of the output); a bias that takes a gradient (T5's position bias)
only the memory-efficient kernel takes, and it keeps the bias too. The trace therefore routes every SDPA call through
the fused CPU kernel, which keeps the same tensors with the same shapes (through the memory-efficient kernel's own
op, on fake tensors, where the bias takes a gradient). Attention written out in eager ops
(``attn_implementation="eager"``, T5's position-biased attention) is traced as it is on any device.
Figures for CUDA are **modelled, unverified on hardware** until ``benchmarks/gpu_check.py`` has run on one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from hf_ckpt.runtime import _torch
from hf_ckpt.meters.precision import autocast_state

#: Devices the estimate knows a kernel model for.
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class AttentionModel:
    """How attention memory was obtained for a device (reported with the estimate).

    Attributes:
        device: The target device type.
        modelled: True when the saved tensors are modelled rather than traced as they run.
        kernel: The kernel assumed (or traced) and what it keeps for backward.
        note: One line for the user.
    """

    device: str
    modelled: bool
    kernel: str
    note: str


def attention_model(device: str, dtype: torch.dtype) -> AttentionModel:
    """The attention model used for ``device`` and ``dtype``."""
    if device == "cpu":
        return AttentionModel(
            "cpu", False, "as dispatched on CPU (fused CPU kernel, or the math path where it does not apply)",
            "traced: the CPU dispatch of scaled_dot_product_attention runs on fake tensors as it would for real",
        )
    kernel = "flash" if dtype in (torch.float16, torch.bfloat16) else "memory-efficient"
    return AttentionModel(
        device, True, f"{kernel} (keeps query, key, value, output and fp32 log-sum-exp)",
        "modelled, unverified on hardware: CUDA SDPA kernels keep output + log-sum-exp, not the attention "
        "probabilities (run benchmarks/gpu_check.py on a GPU to verify)",
    )


def _fused(*args: Any, **kwargs: Any) -> Any:
    """``F.scaled_dot_product_attention`` through the fused CPU kernel: the saved tensors of a fused kernel."""
    op = _torch.aten_op("_scaled_dot_product_flash_attention_for_cpu")
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    query, key, value = bound["query"], bound["key"], bound["value"]
    if op is None or query.dim() != 4:
        with _torch.disable_torch_function():  # not back into _FusedAttention
            return _SDPA(*args, **kwargs)
    query, key, value, mask = _autocast(query, key, value, bound.get("attn_mask"))
    # Grouped-query attention (enable_gqa) stays unexpanded, as in the CUDA kernels: on fake tensors the
    # kernel's shape function accepts fewer key/value heads and backward returns gradients of their shape.
    if mask is not None and mask.dtype == torch.bool:
        # the kernel takes an additive mask; the conversion happens before the kernel on CUDA too
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(~mask, float("-inf"))
    dropout, causal = float(bound.get("dropout_p") or 0.0), bool(bound.get("is_causal") or False)
    if mask is not None and mask.requires_grad:  # a learned bias (T5's, in 5.x through SDPA)
        return _efficient(query, key, value, mask, dropout, causal, bound.get("scale"))
    out = op(query, key, value, dropout_p=dropout, is_causal=causal, attn_mask=mask, scale=bound.get("scale"))
    return out[0]


def _efficient(query: Any, key: Any, value: Any, bias: Any, dropout: float, causal: bool, scale: Any) -> Any:
    """Attention with a bias that takes a gradient: CUDA's memory-efficient kernel, the one that takes it (the fused
    CPU kernel is not differentiable in its mask); it keeps the bias besides what the other kernels keep."""
    op = _torch.aten_op("_scaled_dot_product_efficient_attention")
    if op is None or key.shape[1] != query.shape[1]:  # grouped-query attention: the math path, as torch's fallback
        with _torch.disable_torch_function():
            return _SDPA(query, key, value, attn_mask=bias, dropout_p=dropout, is_causal=causal, scale=scale)
    bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return op(query, key, value, bias, True, dropout, causal, scale=scale)[0]


#: torch's own, called by :func:`_fused` where the fused kernel does not apply.
_SDPA = F.scaled_dot_product_attention


class _FusedAttention(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to :func:`_fused` for code that imported the function itself."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        return _fused(*args, **kwargs) if func is _SDPA else func(*args, **kwargs)


def _autocast(*tensors: Any) -> list[Any]:
    """The tensors as autocast hands them to SDPA (a lower-precision op on every device): floating ones cast to
    autocast's dtype when the trace runs under it. The kernel called here in its place has no autocast rule."""
    enabled, dtype = autocast_state("cpu")  # the trace's autocast: its fake tensors are on the CPU
    if not enabled:
        return list(tensors)
    return [t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in tensors]


@contextlib.contextmanager
def attention_for(device: str) -> Iterator[None]:
    """Within the block, attention keeps what the kernels of ``device`` keep (see the module docstring)."""
    if device == "cpu":
        yield
        return
    # A checkpoint's recompute in backward runs without the forward's torch-function modes: the module attribute,
    # which transformers' attention functions look up at each call, routes it there too.
    F.scaled_dot_product_attention = _fused
    try:
        with _FusedAttention():
            yield
    finally:
        F.scaled_dot_product_attention = _SDPA
