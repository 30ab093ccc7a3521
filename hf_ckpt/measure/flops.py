"""Compute of a training step, counted by ``torch.utils.flop_counter.FlopCounterMode``.

The counter sees every aten op that runs, so the forward that backward repeats for each checkpointed block is
counted like any other: the ratio of a strategy's FLOPs to the FLOPs without checkpointing is the measured
price of the recompute. Ops without a registered formula (elementwise ops, norms, softmax) count as zero, as in
every FLOPs figure quoted for transformers; matmuls and attention dominate.

``FlopCounterMode`` has formulas for the CUDA attention kernels but, in the torch releases hf_ckpt supports, not
for the CPU one that ``scaled_dot_product_attention`` dispatches to (``_scaled_dot_product_flash_attention_for_cpu``
and its backward). :func:`count_flops` adds them, with torch's own attention formulas, wherever the op exists and
torch does not count it already; without them attention would count zero on a CPU.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode


class FlopCount:
    """The result of :func:`count_flops`: ``total`` is filled in when the ``with`` block exits."""

    def __init__(self) -> None:
        self.total: int = 0


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


@contextlib.contextmanager
def count_flops() -> Iterator[FlopCount]:
    """Count the FLOPs of everything run inside the ``with`` block.

    Example::

        with count_flops() as flops:
            model(**batch).loss.backward()
        flops.total
    """
    result = FlopCount()
    with warnings.catch_warnings():
        # FlopCounterMode's module tracker warns when backward re-enters a module (as the recompute does);
        # the per-module breakdown is not used here, the total is exact.
        warnings.simplefilter("ignore", UserWarning)
        counter = FlopCounterMode(display=False, custom_mapping=missing_formulas())
        with counter:
            yield result
    result.total = int(counter.get_total_flops())
