"""FLOP formulas: torch's ``FlopCounterMode`` registry, completed with the ops it lacks on this machine.

The runtime needs them (a partitioned block keeps an output only where remaking it is not cheap, see
:mod:`hf_ckpt.strategies.partition.boundary`); the lab counts with them (:mod:`hf_ckpt.meters.flops`, the planners).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode


def _cpu_attention(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return flop_counter.sdpa_flop_count(query, key, value)


def _cpu_attention_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


def missing_formulas() -> dict[Any, Any]:
    """Formulas for ops that run on this machine and that ``FlopCounterMode`` does not count by itself."""
    if not hasattr(flop_counter, "sdpa_flop_count") or not hasattr(flop_counter, "sdpa_backward_flop_count"):
        return {}
    candidates = {
        "_scaled_dot_product_flash_attention_for_cpu": _cpu_attention,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_attention_backward,
    }
    registry = getattr(flop_counter, "flop_registry", {})
    formulas = {}
    for name, formula in candidates.items():
        op = getattr(torch.ops.aten, name, None)
        if op is not None and op not in registry:
            formulas[op] = formula
    return formulas


def flop_registry() -> dict[Any, Callable[..., int]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dict(FlopCounterMode(display=False, custom_mapping=missing_formulas()).flop_registry)
