"""Op-level selective recompute: keep the outputs of matmuls and attention, recompute the cheap ops.

Built on PyTorch's selective activation checkpointing (``torch.utils.checkpoint.create_selective_checkpoint_contexts``,
non-reentrant checkpointing only). A *policy* decides, op by op, whether the op's output is stored in forward or
recomputed in backward. Named policies are registered in :data:`SELECTIVE_POLICIES`; a user may also pass

* a list/tuple/set of ``torch._ops.OpOverload`` (or packets) to save, or
* a callable ``policy(ctx, op, *args, **kwargs) -> torch.utils.checkpoint.CheckpointPolicy``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Union

import torch

aten = torch.ops.aten

Policy = Union[str, Callable[..., Any], Iterable[Any]]

_MATMULS = (aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.matmul, aten.linear)
_ATTENTION = tuple(
    getattr(aten, name)
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    )
    if hasattr(aten, name)
)

#: Named policies: the ops whose outputs are saved (everything else is recomputed).
SELECTIVE_POLICIES: dict[str, tuple[Any, ...]] = {
    "matmuls_and_attention": _MATMULS + _ATTENTION,
    "matmuls": _MATMULS,
    "attention": _ATTENTION,
}
DEFAULT_POLICY = "matmuls_and_attention"


def selective_supported() -> bool:
    """Whether the installed torch has selective activation checkpointing (torch >= 2.4)."""
    return hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts")


def _save_listed(saved: frozenset, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    packet = getattr(op, "overloadpacket", op)
    if op in saved or packet in saved:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def check_policy(policy: Any) -> None:
    """Raise at the call for a policy that is neither a registered name, a callable nor a collection of ops."""
    if policy is None or callable(policy):
        return
    if isinstance(policy, str):
        if policy not in SELECTIVE_POLICIES:
            raise ValueError(
                f"policy must be one of {', '.join(sorted(SELECTIVE_POLICIES))}, a list of aten ops to save, or a "
                f"callable (ctx, op, *args, **kwargs) -> CheckpointPolicy; got {policy!r}"
            )
        return
    if isinstance(policy, (list, tuple, set, frozenset)):
        return
    raise TypeError(
        f"policy must be a policy name, a list of aten ops to save, or a callable; got {type(policy).__name__}"
    )


def policy_function(policy: Policy | None) -> Callable[..., Any]:
    """The ``policy_fn`` for ``create_selective_checkpoint_contexts``."""
    if policy is None:
        policy = DEFAULT_POLICY
    if isinstance(policy, str):
        return functools.partial(_save_listed, frozenset(SELECTIVE_POLICIES[policy]))
    if callable(policy):
        return policy
    return functools.partial(_save_listed, frozenset(policy))


def selective_context_fn(policy: Policy | None) -> Callable[[], Any]:
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint`` that applies ``policy``."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return functools.partial(create_selective_checkpoint_contexts, policy_function(policy))
