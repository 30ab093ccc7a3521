"""Every private torch API hf_ckpt uses, in one place.

torch keeps no promise about names with a leading underscore (``torch._C``, ``torch._functorch``,
``torch.utils._python_dispatch``, ``Module._forward_pre_hooks``, ...): any release may move or drop them. hf_ckpt
names them here and nowhere else, attributes included (``tensor._version``, ``module._modules``, ...):
``tests/test_torch_internals.py`` exercises each entry and counts, with ``ast``, every private torch name or attribute
used in another module of the package (none allowed). A new torch release then breaks, at most, this file, and a
maintainer sees at a glance what hf_ckpt relies on.

Each entry is a small function or constant with a capability check (an import guard or ``hasattr``, never a
version string) and a docstring that says what it is for and on which torch releases it was verified (the
releases ``tests/test_torch_internals.py`` ran on). Entries that can be missing return ``None`` (or a reason
string) instead of raising, and their callers say what is unavailable.

Modelled on torchtune's ``_activation_offloading.py`` discipline: the internals in one file, each one guarded.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import torch
from torch.utils import _pytree
from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode

#: The releases CI runs every entry below on (tests/test_torch_internals.py: the torch range's floor and ceiling and
#: the default run's torch); entries made before 2.15.0 became the ceiling also name 2.14.1, the ceiling then.
VERIFIED_ON = ("2.5.1", "2.13.0", "2.15.0")

# ---------------------------------------------------------------------------------------------- dispatch, pytree

#: ``torch.utils._python_dispatch.TorchDispatchMode``: the base class of hf_ckpt's recording and policy modes
#: (selective recompute, storage tracking, FLOP and op profiling, fake-tensor tracing).
#: Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0.
TorchDispatchMode = _TorchDispatchMode

#: ``torch.utils._pytree`` leaves/map/flatten/unflatten: walking the (nested) arguments and outputs of aten ops and
#: of block calls. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0.
tree_leaves = _pytree.tree_leaves
tree_map = _pytree.tree_map
tree_flatten = _pytree.tree_flatten
tree_unflatten = _pytree.tree_unflatten


@contextlib.contextmanager
def disable_current_modes() -> Iterator[None]:
    """``torch.utils._python_dispatch._disable_current_modes``: trace a block with no outer dispatch mode (the
    storage tracker, a FLOP counter) seeing the tracer's fake ops. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def is_op_overload(value: Any) -> bool:
    """Whether ``value`` is an aten op overload (``torch._ops.OpOverload``, e.g. ``aten.mm.default``): the nodes of
    an FX graph that are ops. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    return isinstance(value, torch._ops.OpOverload)


def is_op(value: Any) -> bool:
    """Whether ``value`` is an aten op overload or an overload packet (``torch._ops.OpOverloadPacket``, e.g.
    ``aten.mm``): the forms a selective policy lists. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    return isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))


def local_scalar_dense() -> Any:
    """``aten._local_scalar_dense.default``: the op a tensor's value is read through (``bool(t)``, ``t.item()``),
    which fake-tensor tracing answers. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    return torch.ops.aten._local_scalar_dense.default


def aten_op(name: str) -> Any | None:
    """The private aten op packet ``name`` (``_grouped_mm``, ``_scaled_dot_product_flash_attention_for_cpu``,
    ``_fused_rms_norm``, ...), or None where this torch has no such op. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0
    (which ops exist differs between them: hence None)."""
    return getattr(torch.ops.aten, name, None)


@contextlib.contextmanager
def disable_torch_function() -> Iterator[None]:
    """``torch._C.DisableTorchFunction``: call the real ``scaled_dot_product_attention`` from inside a
    ``__torch_function__`` override without re-entering it. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    with torch._C.DisableTorchFunction():
        yield


def fake_tensor_errors() -> tuple[type, ...]:
    """The exceptions of what fake tensors cannot run: an output shape or a branch that depends on tensor values
    (``nonzero``, boolean indexing, ``.item()``), an op with no fake implementation. Verified on torch 2.5.1, 2.13.0,
    2.15.0."""
    from torch._subclasses import fake_tensor

    names = ("DynamicOutputShapeException", "DataDependentOutputException", "UnsupportedOperatorException")
    return tuple(getattr(fake_tensor, name) for name in names if hasattr(fake_tensor, name))


def fake_tensor_mode() -> Any:
    """A new ``torch._subclasses.fake_tensor.FakeTensorMode``: the estimator traces a step on fake tensors (shapes
    and dtypes, no memory). Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def tracing_functional() -> bool:
    """Whether a functionalization mode is active on this thread (``torch._C._get_dispatch_mode`` with
    ``_TorchDispatchModeKey.FUNCTIONAL``): AOTAutograd traces a compiled graph so, where ``torch.compiler.is_compiling``
    is already False (torch 2.5's ``aot_eager`` calls a checkpoint's ``context_fn`` there). False where this torch has
    no such key. Verified on torch 2.5.1, 2.13.0, 2.15.0."""
    key = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FUNCTIONAL", None)
    return key is not None and torch._C._get_dispatch_mode(key) is not None


# ------------------------------------------------------------------------------------------------------ autograd


def in_backward() -> bool:
    """Whether the autograd engine runs a backward pass on this thread now (``torch._C._current_graph_task_id``
    is not -1): a block run then is a recompute. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    return torch._C._current_graph_task_id() != -1


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the running backward pass ends (``Variable._execution_engine.queue_callback``): the
    probe reports what a backward recomputed once it finished. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def can_see_saved_tensors_hooks() -> bool:
    """Whether this torch can tell if a saved-tensor hook is active (``torch._C._autograd.
    _top_saved_tensors_default_hooks``; 2.5.1 lacks it, 2.13.0 to 2.15.0 have it): without it, a plan's outside blocks
    and partitioned blocks cannot notice ``save_on_cpu`` around the forward. Verified on torch 2.5.1, 2.13.0,
    2.14.1, 2.15.0."""
    return hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks")


def saved_tensors_hook_active() -> bool:
    """Whether a saved-tensor hook (``save_on_cpu``, a user's ``saved_tensors_hooks``) is active on this thread
    (``torch._C._autograd._top_saved_tensors_default_hooks``); False where this torch cannot tell. Verified on
    torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is not None and top(False) is not None


def determinism_checks() -> tuple[str, ...]:
    """The values ``torch.utils.checkpoint.checkpoint`` accepts for ``determinism_check``
    (``torch.utils.checkpoint._allowed_determinism_checks_to_fns``; ``("default", "none")`` where it is missing).
    Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    import torch.utils.checkpoint

    return tuple(getattr(torch.utils.checkpoint, "_allowed_determinism_checks_to_fns", {"default": 0, "none": 0}))


def forward_pre_hooks(module: torch.nn.Module) -> dict:
    """``module._forward_pre_hooks``, the dict of its forward pre-hooks (id -> hook), to find or remove one of
    hf_ckpt's own by what it is. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    return module._forward_pre_hooks


# ------------------------------------------------------------------------------- tensor and module attributes
# Moved from their callers (#38): "Verified on" below means tests/test_torch_internals.py ran them on 2.5.1, 2.13.0 and
# 2.15.0; on 2.14.1 the callers' tests read the same attributes before the move.


def version_counter(tensor: torch.Tensor) -> int:
    """``tensor._version``: counts the in-place changes of its storage (through any view); a saved input whose count
    moved was overwritten. Verified on torch 2.5.1, 2.13.0, 2.15.0 (2.14.1 before the move)."""
    return tensor._version


def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor._base``: the tensor it is a view of, None for no view. Verified on torch 2.5.1, 2.13.0, 2.15.0
    (2.14.1 before the move)."""
    return tensor._base


def child_modules(module: torch.nn.Module) -> dict[str, torch.nn.Module | None]:
    """``module._modules``: its direct submodules by name, read past the attribute forwarding of FSDP1 units and
    checkpoint wrappers. Verified on torch 2.5.1, 2.13.0, 2.15.0 (2.14.1 before the move)."""
    return module._modules


def own_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter | None]:
    """``module._parameters``: its own parameters by name (an entry set replaces one, unchecked). Verified on torch
    2.5.1, 2.13.0, 2.15.0 (2.14.1 before the move)."""
    return module._parameters


def own_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """``module._buffers``: its own buffers by name (an entry set replaces one). Verified on torch 2.5.1, 2.13.0,
    2.15.0 (2.14.1 before the move)."""
    return module._buffers


def module_call_functions() -> set[Any]:
    """What a module's bound ``__call__`` may wrap: ``Module.__call__``, ``_wrapped_call_impl`` (None where missing),
    ``_call_impl``. Verified on torch 2.5.1, 2.13.0, 2.15.0 (2.14.1 before the move)."""
    return {torch.nn.Module.__call__, getattr(torch.nn.Module, "_wrapped_call_impl", None), torch.nn.Module._call_impl}


def call_impl(module: torch.nn.Module) -> Callable[..., Any]:
    """``module._call_impl``: its call with hooks, what ``Module.compile`` compiles. Verified on torch 2.5.1, 2.13.0,
    2.15.0 (2.14.1 before the move)."""
    return module._call_impl


def set_compiled_call(module: torch.nn.Module, compiled: Callable[..., Any] | None) -> None:
    """Set ``module._compiled_call_impl`` (run instead of its call, as ``Module.compile`` does; None: eager again).
    Verified on torch 2.5.1, 2.13.0, 2.15.0 (2.14.1 before the move)."""
    module._compiled_call_impl = compiled


def op_schema(op: Any) -> Any | None:
    """``op._schema``: an aten op's ``FunctionSchema`` (arguments, mutation), None for what has none. Verified on
    torch 2.5.1, 2.13.0, 2.15.0 (2.14.1 before the move)."""
    return getattr(op, "_schema", None)


# --------------------------------------------------------------------------------------------------- distributed


@functools.lru_cache(maxsize=None)
def checkpoint_wrapper_module() -> Any | None:
    """``torch.distributed.algorithms._checkpoint.checkpoint_wrapper`` (``checkpoint_wrapper``,
    ``CheckpointWrapper``, ``apply_activation_checkpointing``), or None where it cannot be imported. Verified on
    torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.algorithms._checkpoint import checkpoint_wrapper
    except ImportError:
        return None
    return checkpoint_wrapper


def composable_checkpoint_applied(module: torch.nn.Module) -> bool:
    """Whether ``torch.distributed._composable.checkpoint(module)`` was applied to ``module`` (its
    ``_composable.contract`` registry names "checkpoint"); False where this torch has no such registry. Verified on
    torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    if not torch.distributed.is_available():
        return False
    try:
        from torch.distributed._composable.contract import _get_registry
    except ImportError:
        return False
    registry = _get_registry(module)
    return bool(registry) and "checkpoint" in registry


def active_ddp_module() -> torch.nn.Module | None:
    """The ``DistributedDataParallel`` whose forward runs now (``DistributedDataParallel._get_active_ddp_module``,
    which TorchDynamo reads too), or None. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    if not torch.distributed.is_available():
        return None
    getter = getattr(torch.nn.parallel.DistributedDataParallel, "_get_active_ddp_module", None)
    return getter() if getter is not None else None


# ------------------------------------------------------------------------- AOT autograd, inductor (op-level lab)

#: The partitioner setting a compiled or partitioned block's budget is, as users set it (error messages).
ACTIVATION_MEMORY_BUDGET = "torch._functorch.config.activation_memory_budget"


def functorch_config() -> Any | None:
    """``torch._functorch.config`` (``activation_memory_budget``, ``enable_autograd_cache``; ``.patch``), or None
    where it cannot be imported. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    try:
        import torch._functorch.config as config
    except ImportError:
        return None
    return config


def partitioners() -> Any | None:
    """``torch._functorch.partitioners`` (``get_default_op_list``: the ops the min-cut partitioner may recompute),
    or None where it cannot be imported. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    try:
        from torch._functorch import partitioners as module
    except ImportError:
        return None
    return module


def aot_partitioner() -> Any | None:
    """``functorch.compile`` (``aot_function``, ``make_boxed_func``, ``min_cut_rematerialization_partition``: AOT
    autograd and its min-cut partitioner, re-exported from ``torch._functorch``), or None where it cannot be
    imported. Verified on torch 2.5.1, 2.13.0, 2.15.0."""
    try:
        import functorch.compile as module
    except ImportError:
        return None
    return module


def mark_boxed(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (taking its arguments as one list) marked as AOT autograd's boxed calling convention: its private
    ``_boxed_call`` flag, what ``make_boxed_func`` sets. Verified on torch 2.5.1, 2.13.0, 2.15.0."""
    function._boxed_call = True  # type: ignore[attr-defined]
    return function


def saved_alpha(node: Any) -> Any:
    """The ``alpha`` an ``AddBackward0`` autograd node saved (``a + alpha * b``; 1 where it saved none): its private
    ``_saved_alpha``. Verified on torch 2.5.1, 2.13.0, 2.15.0."""
    return getattr(node, "_saved_alpha", 1)


_partitioner_lock = threading.Lock()


@contextlib.contextmanager
def extra_recomputable_ops(extra: Callable[[], set[Any]]) -> Iterator[None]:
    """While entered (under a lock), functorch's min-cut partitioner counts ``extra()``'s ops as recomputable and
    fusible: :func:`partitioners`' ``get_default_op_list`` patched. Verified on torch 2.5.1, 2.13.0, 2.15.0 (2.14.1
    before the move)."""
    module = partitioners()
    with _partitioner_lock:
        original = module.get_default_op_list

        def extended() -> Any:
            types, added = original(), extra()
            types.recomputable_ops |= added
            types.fusible_ops |= added
            return types

        module.get_default_op_list = extended
        try:
            yield
        finally:
            module.get_default_op_list = original


def rng_prims() -> tuple[Any, Any] | None:
    """``torch._prims.rng_prims``' ``(run_and_save_rng_state, run_with_rng_state)``: the ops AOT autograd puts
    around random ops it replays; None where they cannot be imported.
    Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    try:
        from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    except ImportError:
        return None
    return run_and_save_rng_state, run_with_rng_state


def reparametrize_module() -> Callable[..., Any] | None:
    """``torch.nn.utils.stateless._reparametrize_module``: a block's parameters swapped for traced inputs for the
    duration of a call, or None where it is missing. Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    try:
        from torch.nn.utils.stateless import _reparametrize_module
    except ImportError:
        return None
    return _reparametrize_module


def inductor_config() -> Any | None:
    """``torch._inductor.config`` (``fx_graph_cache``, ``custom_partitioner_fn``; ``.patch``), or None where it
    cannot be imported. Used by the benchmark's compile reference only.
    Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    try:
        import torch._inductor.config as config
    except ImportError:
        return None
    return config


def custom_partitioner_class() -> type | None:
    """``torch._inductor.custom_graph_pass.CustomPartitionerFn`` (the base of an inductor
    ``custom_partitioner_fn``), or None where this torch has none (2.5.1 has none). Verified on torch 2.5.1, 2.13.0,
    2.14.1, 2.15.0."""
    try:
        from torch._inductor.custom_graph_pass import CustomPartitionerFn
    except ImportError:
        return None
    return CustomPartitionerFn


def compile_fx(graph: Any, example_inputs: Any, inner_compile: Callable[..., Any]) -> Any:
    """``torch._inductor.compile_fx.compile_fx`` with an ``inner_compile`` that records each partitioned graph
    (the compile reference's backend).
    Verified on torch 2.5.1, 2.13.0, 2.14.1, 2.15.0 (imported; compiled on 2.13.0)."""
    from torch._inductor.compile_fx import compile_fx as inductor_compile_fx

    return inductor_compile_fx(graph, example_inputs, inner_compile=inner_compile)


def compile_fx_inner(graph: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """``torch._inductor.compile_fx.compile_fx_inner``: inductor's compile of one partitioned graph. Verified on
    torch 2.5.1, 2.13.0, 2.14.1, 2.15.0 (imported; compiled on 2.13.0)."""
    from torch._inductor.compile_fx import compile_fx_inner as inner

    return inner(graph, example_inputs, **kwargs)


def dynamo_reset() -> None:
    """``torch._dynamo.reset()``: forget compiled frames (another budget's graphs must not be reused). Verified on
    torch 2.5.1, 2.13.0, 2.14.1, 2.15.0."""
    import torch._dynamo

    torch._dynamo.reset()


# ------------------------------------------------------------------------------- selective checkpointing (SAC)


def set_sac_respects_saved_tensors_hooks(forward_context: Any, respect: bool | None) -> bool:
    """Tell a selective-checkpoint forward context (``torch.utils.checkpoint._CachingTorchDispatchMode``) whether
    the tensors it saves go through the saved-tensor hooks active around the checkpoint (``save_on_cpu``, hf_ckpt's
    offload and outside-block hooks): its ``respect_saved_tensors_hooks`` attribute, which ``checkpoint`` sets only
    on a context it returned unwrapped (hf_ckpt wraps it with its in-place guard). False where the context has no
    such attribute (torch <= 2.13, which always bypasses the hooks); True when it was set. Verified on torch 2.5.1,
    2.13.0 (no attribute), 2.14.1 and 2.15.0 (set)."""
    if not hasattr(forward_context, "respect_saved_tensors_hooks"):
        return False
    forward_context.respect_saved_tensors_hooks = respect
    return True
