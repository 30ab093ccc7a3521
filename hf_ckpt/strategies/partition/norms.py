"""Norms and softmaxes the min-cut partitioner may recompute: the ``":norms"`` of ``"partition:<F>:norms"``.

torch's partitioner recomputes only ops on its allowlist (pointwise ops, views, a few reductions). Inductor
decomposes ``layer_norm``, ``softmax`` and ``log_softmax`` into such ops before partitioning, so under
torch.compile a norm's output is made again in backward from its input; an eager trace keeps the one opaque op,
which the allowlist bans, so a block keeps both the norm's input (its backward needs it) and its output (the next
linear layer's backward needs that). With ``norms`` the partitioner may recompute these ops themselves, the model's
own kernels, not decompositions: a post-norm block (BERT) then keeps one hidden-sized tensor fewer per norm at no
matmul recompute. Batch norm is left out: its training forward updates running statistics.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from hf_ckpt.runtime import _torch

#: The ops added to the partitioner's recomputable ops (those this torch has).
NORM_OPS: tuple[str, ...] = ("native_layer_norm", "_fused_rms_norm", "native_group_norm", "_softmax", "_safe_softmax",
                             "_log_softmax")


def _packets() -> set[Any]:
    return {getattr(torch.ops.aten, name) for name in NORM_OPS if hasattr(torch.ops.aten, name)}


def has_norm_ops(graph_module: Any) -> bool:
    """Whether a traced graph calls one of :data:`NORM_OPS`."""
    packets = _packets()
    return any(getattr(node.target, "overloadpacket", None) in packets for node in graph_module.graph.nodes)


def norms_unavailable() -> str | None:
    """Why this torch's partitioner cannot be told to recompute norms, or None when it can."""
    partitioners = _torch.partitioners()
    if partitioners is None:
        return "this torch has no AOT autograd partitioner (functorch's partitioners cannot be imported)"
    try:
        types = partitioners.get_default_op_list()
        types.recomputable_ops, types.fusible_ops  # noqa: B018
    except AttributeError as error:
        return f"this torch's partitioner has no list of recomputable ops to extend ({error})"
    return None


@contextlib.contextmanager
def recomputable_norms() -> Iterator[None]:
    """While it is entered, the partitioner counts :data:`NORM_OPS` as recomputable (and fusible) ops."""
    with _torch.extra_recomputable_ops(_packets):
        yield
