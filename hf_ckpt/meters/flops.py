"""Compute of a training step, counted by ``torch.utils.flop_counter.FlopCounterMode``.

The counter sees every aten op that runs, so the forward that backward repeats for each checkpointed block is
counted like any other: the ratio of a strategy's FLOPs to the FLOPs without checkpointing is the measured
price of the recompute. Ops without a registered formula (elementwise ops, norms, softmax) count as zero, as in
every FLOPs figure quoted for transformers; matmuls and attention dominate.

That figure is blind to what selective recompute reruns: a policy that keeps every matmul output recomputes 0
FLOPs by it, yet reruns the norms, activations, softmax and dropout of the block. So :func:`count_flops` also
counts those, separately, in :attr:`FlopCount.elementwise`: **one per output element of every op that has no
FLOP formula** (pointwise ops, reductions, norms, softmax, dropout, copies and concatenations), views and
allocations (:func:`is_uncounted`) counting nothing. It is a count of elements written, not of arithmetic, and is
reported as its own column next to the matmul FLOPs, never added into them.

``FlopCounterMode`` has formulas for the CUDA attention kernels but, in the torch releases hf_ckpt supports, not
for the CPU one that ``scaled_dot_product_attention`` dispatches to (``_scaled_dot_product_flash_attention_for_cpu``
and its backward). :func:`count_flops` adds them, with torch's own attention formulas, wherever the op exists and
torch does not count it already; without them attention would count zero on a CPU.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Any, Iterator, Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode

from hf_ckpt.runtime.util.flop_formulas import missing_formulas
from hf_ckpt.runtime._torch import TorchDispatchMode, tree_leaves


class FlopCount:
    """The result of :func:`count_flops`, filled in when the ``with`` block exits.

    Attributes:
        total: FLOPs of the ops ``FlopCounterMode`` has formulas for (matmuls, convolutions, attention).
        elementwise: Output elements of every other op that computes (see :func:`elementwise_elements`).
    """

    def __init__(self) -> None:
        self.total: int = 0
        self.elementwise: int = 0


#: Ops that produce elements without computing them: allocations and views that are not flagged as views.
_UNCOUNTED = re.compile(
    r"^(empty|empty_strided|zeros|ones|full|new_empty|new_empty_strided|new_zeros|new_ones|new_full|scalar_tensor|"
    r"arange|linspace|_unsafe_view|alias|lift_fresh|lift_fresh_copy|detach|_local_scalar_dense)(_like)?$"
)


def is_uncounted(func: Any) -> bool:
    """True for ops whose outputs are no computation: views, metadata ops and allocations."""
    if getattr(func, "is_view", False):
        return True
    packet = getattr(func, "overloadpacket", None)
    name = getattr(packet, "__name__", None) or str(func).split(".")[1 if str(func).startswith("aten.") else 0]
    return bool(_UNCOUNTED.match(name))


def elementwise_elements(func: Any, out: Any, registry: Mapping[Any, Any]) -> int:
    """Output elements of ``func`` when it is an op without a FLOP formula that computes, else 0."""
    if getattr(func, "overloadpacket", func) in registry or is_uncounted(func):
        return 0
    return sum(value.numel() for value in tree_leaves(out) if isinstance(value, torch.Tensor))


class _ElementCounter(TorchDispatchMode):
    def __init__(self, registry: Mapping[Any, Any]) -> None:
        super().__init__()
        self.registry = registry
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.total += elementwise_elements(func, out, self.registry)
        return out


@contextlib.contextmanager
def count_flops() -> Iterator[FlopCount]:
    """Count the FLOPs of everything run inside the ``with`` block.

    Example::

        with count_flops() as flops:
            model(**batch).loss.backward()
        flops.total, flops.elementwise
    """
    result = FlopCount()
    with warnings.catch_warnings():
        # FlopCounterMode's module tracker warns when backward re-enters a module (as the recompute does);
        # the per-module breakdown is not used here, the total is exact.
        warnings.simplefilter("ignore", UserWarning)
        counter = FlopCounterMode(display=False, custom_mapping=missing_formulas())
        elements = _ElementCounter(dict(counter.flop_registry))
        with counter, elements:
            yield result
    result.total = int(counter.get_total_flops())
    result.elementwise = elements.total
