"""Op-level selective recompute: keep the outputs of matmuls and attention, recompute the cheap ops.

Built on PyTorch's selective activation checkpointing (``torch.utils.checkpoint.create_selective_checkpoint_contexts``,
non-reentrant checkpointing only). A *policy* decides, op by op, whether the op's output is stored in forward or
recomputed in backward. Named policies are registered in :data:`SELECTIVE_POLICIES`; a user may also pass

* a list/tuple/set of aten ops (``torch.ops.aten.mm.default``, or packets such as ``torch.ops.aten.mm``) to save, or
* a callable ``policy(ctx, op, *args, **kwargs) -> torch.utils.checkpoint.CheckpointPolicy``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, Iterable, Union

import torch
from torch.utils.weak import WeakIdKeyDictionary

from hf_ckpt.runtime._torch import (
    TorchDispatchMode,
    is_op,
    op_schema,
    set_sac_respects_saved_tensors_hooks,
    tracing_functional,
)

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
    """Whether the installed torch has selective activation checkpointing: ``create_selective_checkpoint_contexts``
    and ``CheckpointPolicy`` in ``torch.utils.checkpoint`` (torch >= 2.5; 2.4 has neither there)."""
    return all(hasattr(torch.utils.checkpoint, name) for name in ("create_selective_checkpoint_contexts", "CheckpointPolicy"))


def _op_name(op: Any) -> str:
    """``"aten.mm"`` for ``aten.mm`` and ``"aten.mm.default"`` for ``aten.mm.default``: names pickle, ops do not."""
    return str(op)


def _save_listed(saved: frozenset[str], ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    packet = getattr(op, "overloadpacket", op)
    if _op_name(op) in saved or _op_name(packet) in saved:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


_POLICY_FORMS = (
    "a policy name ({names}), a list of aten ops to save (e.g. [torch.ops.aten.mm]), or a callable "
    "(ctx, op, *args, **kwargs) -> CheckpointPolicy"
)


def _policy_forms() -> str:
    return _POLICY_FORMS.format(names=", ".join(sorted(SELECTIVE_POLICIES)))


def _is_op(value: Any) -> bool:
    return is_op(value)


def _accepts_policy_arguments(function: Any) -> bool:
    try:
        inspect.signature(function).bind(object(), object())
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): give it the benefit of the doubt
        return True
    return True


def check_policy(policy: Any) -> None:
    """Raise at the call for a policy that is not a registered name, a callable taking ``(ctx, op, ...)``, or a
    non-empty collection of aten ops."""
    if policy is None:
        return
    if callable(policy) and not _is_op(policy):
        if not _accepts_policy_arguments(policy):
            raise TypeError(f"policy must be {_policy_forms()}; got a callable that cannot take (ctx, op): {policy!r}")
        return
    if isinstance(policy, str):
        if policy not in SELECTIVE_POLICIES:
            raise ValueError(f"policy must be {_policy_forms()}; got {policy!r}")
        return
    if isinstance(policy, (list, tuple, set, frozenset)):
        bad = [op for op in policy if not _is_op(op)]
        if bad or not policy:
            raise ValueError(f"policy must be {_policy_forms()}; got {'an empty list' if not policy else repr(bad[0])}")
        return
    raise TypeError(f"policy must be {_policy_forms()}; got {type(policy).__name__}")


def policy_function(policy: Policy | None) -> Callable[..., Any]:
    """The ``policy_fn`` for ``create_selective_checkpoint_contexts`` (picklable for names and op lists)."""
    if policy is None:
        policy = DEFAULT_POLICY
    if isinstance(policy, str):
        return functools.partial(_save_listed, frozenset(_op_name(op) for op in SELECTIVE_POLICIES[policy]))
    if callable(policy) and not _is_op(policy):
        return policy
    return functools.partial(_save_listed, frozenset(_op_name(op) for op in policy))


class SelectiveRecomputeError(RuntimeError):
    """A block modifies in place a tensor that selective recompute saved, so its gradients would be wrong."""


def written_tensors(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    written = []
    for position, argument in enumerate(op_schema(func).arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            if isinstance(value, torch.Tensor):
                written.append(value)
    return written


class InPlaceGuard(TorchDispatchMode):
    """Forward-side guard: fail loudly when an op writes into the output of an op the policy saves.

    Selective recompute stores such outputs and hands them back during the recompute; an in-place op on one
    (``scores += position_bias`` in T5's attention up to transformers 4.52) would then be applied twice, and the
    gradients would silently be wrong. PyTorch does not check this; hf_ckpt does.
    """

    def __init__(self, policy_fn: Callable[..., Any]) -> None:
        super().__init__()
        self.policy_fn = policy_fn
        # Keyed by the storage object, weakly: a freed storage's address may be reused by an unrelated tensor,
        # and fake tensors (hf_ckpt.estimate) have no addresses at all.
        self.saved: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

        kwargs = kwargs or {}
        for tensor in written_tensors(func, args, kwargs):
            producer = self.saved.get(tensor.untyped_storage())
            if producer is not None:
                raise SelectiveRecomputeError(
                    f"strategy='selective' cannot run on this block: {func} modifies in place the output of "
                    f"{producer}, which the selective policy saves, so the recompute would apply it twice and the "
                    "gradients would be wrong. Use strategy='full' for this model, or a policy that does not save "
                    f"{producer}."
                )
        out = func(*args, **kwargs)
        policy = self.policy_fn(SelectiveCheckpointContext(is_recompute=False), func, *args, **kwargs)
        if policy in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE):
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(tensor, torch.Tensor):
                    self.saved[tensor.untyped_storage()] = str(func)
        return out


def _compiling() -> bool:
    """Whether the checkpoint runs inside ``torch.compile``: dynamo tracing, or AOTAutograd tracing the graph with
    functional tensors (where torch checks the contexts are two ``TorchDispatchMode`` modes)."""
    compiler = getattr(torch, "compiler", None)
    dynamo = compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()
    return dynamo or tracing_functional()


class _GuardedForward:
    """The forward context: PyTorch's selective-checkpoint context, plus :class:`InPlaceGuard` in eager mode."""

    def __init__(self, forward_context: Any, policy_fn: Callable[..., Any]) -> None:
        self._contexts = (forward_context, InPlaceGuard(policy_fn))
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> None:
        for context in self._contexts:
            self._stack.enter_context(context)

    def __exit__(self, *exc_info: Any) -> Any:
        return self._stack.__exit__(*exc_info)


def selective_contexts(policy_fn: Callable[..., Any], respect_saved_tensors_hooks: bool | None = False) -> tuple[Any, Any]:
    """``torch.utils.checkpoint.create_selective_checkpoint_contexts(policy_fn)``, its forward context told whether
    the tensors selective checkpointing saves go through the saved-tensor hooks active around the checkpoint.

    torch <= 2.13 always bypasses them; torch 2.14 takes ``respect_saved_tensors_hooks`` (default None: bypass, with a
    FutureWarning whenever a hook is active, as under ``offload=True``, ``save_on_cpu`` or a plan's outside
    blocks). ``checkpoint`` passes it on only to a context it gets unwrapped, and hf_ckpt wraps the forward context
    with its in-place guard, so hf_ckpt sets it here: False by default, the behaviour of torch <= 2.13 (the same
    tensors kept on every torch, no warning); the user's own ``respect_saved_tensors_hooks`` otherwise.
    """
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    forward_context, recompute_context = create_selective_checkpoint_contexts(policy_fn)
    set_sac_respects_saved_tensors_hooks(forward_context, respect_saved_tensors_hooks)
    return forward_context, recompute_context


def _guarded_contexts(policy_fn: Callable[..., Any], respect_saved_tensors_hooks: bool | None = False) -> tuple[Any, Any]:
    """Forward and recompute contexts for ``policy_fn`` (see :func:`selective_contexts`).

    Under ``torch.compile`` the graph is traced with fake tensors, whose storages have no data pointer, and
    AOTAutograd re-derives what is saved from the policy itself: the eager in-place guard is left out there.
    """
    forward_context, recompute_context = selective_contexts(policy_fn, respect_saved_tensors_hooks)
    if _compiling():
        return forward_context, recompute_context
    return _GuardedForward(forward_context, policy_fn), recompute_context


def selective_context_fn(policy: Policy | None, respect_saved_tensors_hooks: bool | None = False) -> Callable[[], Any]:
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint`` that applies ``policy``.

    PyTorch's selective checkpoint contexts, plus a forward-side guard that raises
    :class:`SelectiveRecomputeError` when the block writes in place into a tensor the policy saved.
    """
    return functools.partial(_guarded_contexts, policy_function(policy), respect_saved_tensors_hooks)
