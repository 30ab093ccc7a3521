"""Graph-level partitions of one block, run in eager mode: the ``"partition:<F>"`` plan strategy.

An op-level policy (``"oplevel:<name>"``) chooses which ops keep their outputs, but its recompute reruns the block's
forward, every op up to the last tensor backward needs, whether or not anything reads the result. torch.compile's
min-cut partitioner works on the block's dataflow graph instead: it may keep any value that cuts the graph cheaply
and recomputes only what backward reads. This module runs that partitioner on one block at a time, without
compiling anything:

1. **Trace.** AOT autograd traces the block's forward and backward into one joint graph on fake tensors. The
   block's parameters and buffers and every tensor argument are graph inputs; any other argument (``None``, a flag,
   a shape) is a constant of the trace.
2. **Partition.** ``min_cut_rematerialization_partition`` splits it into a forward and a backward graph under
   functorch's ``activation_memory_budget = F`` (1: the partitioner's default choice, which already
   recomputes cheap pointwise ops; 0: recompute all it may). Random ops (dropout) are recomputed from the RNG state
   saved when forward drew them, as checkpointing does, so their masks are neither kept nor drawn afresh.
3. **Run.** Both graphs run op by op in eager mode (the FX graphs' Python code): no inductor, no C++ compiler, the
   same kernels as the model's own forward. Gradients equal the model's own, op for op.

A trace is made per block and per call signature (tensor shapes, strides, dtypes and ``requires_grad``, the
constants, the training flag, autocast) on the first call with that signature, outside any dispatch mode that is
active (a profiler or counter sees the graphs run, not the trace); that first call runs the forward once more, with
the RNG state put back. A call that cannot be traced (an argument that is neither a tensor nor a plain constant, a
branch on tensor values) checkpoints the block in full instead, with one warning saying why.

What a partitioned block recomputes is reported to :mod:`hf_ckpt.runtime.counting` when its backward graph runs, so the
measured recompute (:func:`hf_ckpt.checkpointed_layers`, the first-step probe) covers it like any checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from hf_ckpt.runtime import _torch
from hf_ckpt.strategies.partition.boundary import output_tails, register
from hf_ckpt.runtime.util.rng import rng_state, set_rng_state
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.runtime.blocks import module_of
from hf_ckpt.runtime.counting import note_block_run
from hf_ckpt.strategies.partition.norms import has_norm_ops, norms_unavailable, recomputable_norms

#: Leaves of a block's arguments that become constants of its trace (hashable, compared by value).
_CONSTANTS = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def partition_unavailable() -> str | None:
    """Why partitioned blocks cannot run with this torch, or None when they can."""
    functorch_config = _torch.functorch_config()
    missing = [name for name, value in (("functorch.compile", _torch.aot_partitioner()),
                                        ("functorch's config", functorch_config), ("rng_prims", _torch.rng_prims()),
                                        ("_reparametrize_module", _torch.reparametrize_module())) if value is None]
    if missing:
        return f"this torch has no AOT autograd partitioner ({', '.join(missing)} cannot be imported)"
    if not hasattr(functorch_config, "activation_memory_budget"):
        return "this torch's partitioner has no activation_memory_budget (torch >= 2.4 has it)"
    return None


def check_budget(value: Any, name: str = "partition budget") -> float:
    """``value`` as a partition budget in ``[0, 1]``; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1] (the partitioner's activation_memory_budget); got {value!r}")
    return float(value)


class _Untraceable(Exception):
    """A call of a block the partitioner cannot trace; the message says why."""


# -- RNG replay: random ops are recomputed from the state saved in forward ------------------------------------------


def _device_of(args: tuple) -> torch.device:
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _run_and_save_rng_state(op: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """``rng_prims.run_and_save_rng_state`` (:func:`hf_ckpt.runtime._torch.rng_prims`) as a plain function: dispatch modes see the op only."""
    return rng_state(_device_of(args)), op(*args, **kwargs)


def _run_with_rng_state(state: torch.Tensor, op: Any, *args: Any, **kwargs: Any) -> Any:
    """``run_with_rng_state`` as a plain function: ``op`` with the saved RNG state, which is then put back."""
    device = _device_of(args)
    current = rng_state(device)
    set_rng_state(device, state)
    try:
        return op(*args, **kwargs)
    finally:
        set_rng_state(device, current)


#: Random ops that cost a pass over their output: always recomputed from the saved RNG state rather than keeping
#: their masks, as inductor recomputes them from a seed. Other random ops (attention with dropout) are recomputed
#: only where the partitioner chooses to.
_CHEAP_RANDOM = frozenset({"native_dropout", "bernoulli", "rand_like", "randn_like", "randint_like", "rand", "randn",
                           "randint", "normal", "uniform", "exponential"})


def _dropout_as_mask(input: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.native_dropout`` as the CPU kernel computes it (a boolean mask drawn by ``bernoulli_(1 - p)``, then
    ``input * mask * 1 / (1 - p)``): the same numbers, but the mask is drawn from nothing but a shape, so the
    partitioner can recompute it from the saved RNG state without keeping the dropout's input."""
    if not train or p == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    if p == 1:
        return input * 0, torch.zeros_like(input, dtype=torch.bool)
    mask = torch.bernoulli(torch.empty(input.shape, dtype=torch.bool, device=input.device), 1 - p)
    return input.mul(mask).mul(1.0 / (1 - p)), mask  # functional ops: the decomposition runs in the joint trace


#: Decompositions for traces of CPU blocks (on accelerators, dropout kernels draw their masks otherwise).
_DROPOUT_AS_MASK = {torch.ops.aten.native_dropout.default: _dropout_as_mask}


def draws_random(node: Any) -> bool:
    """Whether ``node`` draws random numbers: a seeded op, unless its ``dropout_p`` argument is 0 (attention)."""
    if node.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
        return False
    schema = _torch.op_schema(node.target)
    for position, argument in enumerate(schema.arguments if schema is not None else ()):
        if argument.name == "dropout_p":
            given = node.args[position] if position < len(node.args) else node.kwargs.get("dropout_p", 0.0)
            return given != 0
    return True


def _partition_replaying_random_ops(partition: Callable[..., Any], joint: Any, joint_inputs: Any,
                                    **kwargs: Any) -> tuple[Any, Any]:
    """``partition(joint, ...)``, with no random op drawn afresh in backward.

    Inductor recomputes random ops from a seed; eager mode would draw a new mask. Cheap random ops (dropout) are
    marked for recompute, which makes the partitioner replay them from the RNG state saved when forward drew them
    (``functionalize_rng_ops``) instead of keeping their masks. Where it chooses to recompute another random op
    (attention with dropout), it partitions again with that op marked for recompute too, and every other random op
    marked to keep its output, as it chose.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    random = {node.name for node in joint.graph.nodes if draws_random(node)}
    cheap = {node.name for node in joint.graph.nodes if node.name in random and _op_name(node) in _CHEAP_RANDOM}
    _mark(joint, {name: CheckpointPolicy.MUST_RECOMPUTE for name in cheap})
    forward_graph, backward_graph = partition(joint, joint_inputs, **kwargs)
    replayed = {node.name for node in backward_graph.graph.nodes if node.name in random - cheap}
    if not replayed:
        return forward_graph, backward_graph
    _mark(joint, {name: CheckpointPolicy.MUST_RECOMPUTE if name in replayed | cheap else CheckpointPolicy.MUST_SAVE
                  for name in random})
    return partition(joint, joint_inputs, **kwargs)


def _op_name(node: Any) -> str:
    return getattr(getattr(node.target, "overloadpacket", None), "__name__", "").removesuffix("_")


def _mark(joint: Any, policies: dict[str, Any]) -> None:
    """Set the checkpoint policy of the joint graph's nodes by name (a partition may have rebuilt the nodes)."""
    for node in joint.graph.nodes:
        if node.name in policies:
            node.meta["recompute"] = policies[node.name]
            node.meta.setdefault("ac_graph_id", 0)


def _forward_names(joint: Any) -> set[str]:
    """Names of the joint graph's forward ops: those no tangent flows into."""
    backward: set[Any] = {node for node in joint.graph.nodes if node.op == "placeholder" and "tangent" in node.name}
    for node in joint.graph.nodes:
        if any(argument in backward for argument in node.all_input_nodes):
            backward.add(node)
    return {node.name for node in joint.graph.nodes if node.op == "call_function" and node not in backward}


def _eager(graph_module: Any, on_run: Callable[[], None] | None = None) -> Callable[..., Any]:
    """An AOT "compiler" that compiles nothing: the graph's own Python code, with RNG replay as plain calls."""
    make_boxed_func = _torch.aot_partitioner().make_boxed_func
    run_and_save_rng_state, run_with_rng_state = _torch.rng_prims()

    for node in graph_module.graph.nodes:
        if node.target is run_and_save_rng_state:
            node.target = _run_and_save_rng_state
        elif node.target is run_with_rng_state:
            node.target = _run_with_rng_state
    graph_module.recompile()
    run = graph_module.forward  # not the module's __call__: global module hooks (FlopCounterMode's) stay out
    if on_run is None:
        return make_boxed_func(run)

    def reported(*args: Any) -> Any:
        on_run()
        return run(*args)

    return make_boxed_func(reported)


# -- one trace per block and call signature -------------------------------------------------------------------------


@dataclass
class _Trace:
    """A traced block call: ``run`` its forward (and, through autograd, its backward) graph; ``output`` how to
    rebuild the call's return value from the graph's tensors (tree spec, non-tensor leaves, leaf count)."""

    run: Callable[..., Any]
    output: dict[str, Any]


#: Per block, per call signature: its trace, or why it cannot be traced.
_traces: "weakref.WeakKeyDictionary[nn.Module, dict[Any, _Trace | str]]" = weakref.WeakKeyDictionary()


def _unwrap(function: Callable[..., Any]) -> tuple[Callable[..., Any], tuple, dict]:
    """(callable, leading positional arguments, keywords) of ``function``, through nested partials."""
    args: tuple = ()
    keywords: dict = {}
    while isinstance(function, functools.partial):
        args = function.args + args
        keywords = {**function.keywords, **keywords}
        function = function.func
    return function, args, keywords


def _leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return ("tensor", tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad)
    if isinstance(leaf, nn.Module):
        return ("module", id(leaf))
    if isinstance(leaf, _CONSTANTS):
        return ("constant", type(leaf).__name__, leaf)
    raise _Untraceable(f"an argument of type {type(leaf).__name__} is neither a tensor nor a plain constant")


def _autocast_key() -> tuple:
    states = []
    for device in ("cpu", "cuda"):
        try:
            states.append((device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)))
        except (TypeError, RuntimeError, AttributeError):  # older torch: no per-device autocast queries
            states.append((device, torch.is_autocast_enabled()))
    return tuple(states)


class _Weak:
    """A module among a block call's arguments, held weakly by its trace (a trace lives as long as its module)."""

    def __init__(self, module: nn.Module) -> None:
        self.ref = weakref.ref(module)


def _note_run(ref: "weakref.ref[nn.Module]") -> None:
    module = ref()
    if module is not None:
        note_block_run(module)


def _trace(module: nn.Module, core: Callable[..., Any], leaves: list, spec: Any, state: list, names: list[str],
           budget: float, norms: bool = False) -> _Trace:
    """Trace, partition and prepare one block call; the real run that compiles it is undone (RNG put back).
    ``norms``: the partitioner may recompute norms and softmaxes (:mod:`hf_ckpt.strategies.partition.norms`).

    The trace keeps no tensor of this call and only weak references to modules: it is cached per module, and must
    neither keep a batch alive nor its module.
    """
    functorch_config = _torch.functorch_config()
    aot = _torch.aot_partitioner()
    aot_function, min_cut_rematerialization_partition = aot.aot_function, aot.min_cut_rematerialization_partition
    reparametrize_module = _torch.reparametrize_module()

    tensor_positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    template = [None if isinstance(leaf, torch.Tensor) else _Weak(leaf) if isinstance(leaf, nn.Module) else leaf
                for leaf in leaves]
    owner, method = weakref.ref(module), getattr(core, "__func__", None) if getattr(core, "__self__", None) is module else None
    function = None if method is not None else core
    count = len(state)
    output: dict[str, Any] = {}
    recomputed: list[str] = []

    def flat(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        filled = [leaf.ref() if isinstance(leaf, _Weak) else leaf for leaf in template]
        for position, tensor in zip(tensor_positions, tensors[count:]):
            filled[position] = tensor
        leading, keywords, args, kwargs = _torch.tree_unflatten(filled, spec)
        block = owner()
        call = functools.partial(method, block) if method is not None else function
        with reparametrize_module(block, dict(zip(names, tensors[:count]))):
            result = call(*leading, *args, **keywords, **kwargs)
        out_leaves, output["spec"] = _torch.tree_flatten(result)
        output["constants"] = {i: leaf for i, leaf in enumerate(out_leaves) if not isinstance(leaf, torch.Tensor)}
        output["count"] = len(out_leaves)
        return tuple(leaf for leaf in out_leaves if isinstance(leaf, torch.Tensor))

    def partition(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        output["graph_outputs"], output["norms"] = kwargs.get("num_fwd_outputs"), has_norm_ops(joint)
        forward_names = _forward_names(joint)
        forward_graph, backward_graph = _partition_replaying_random_ops(
            min_cut_rematerialization_partition, joint, joint_inputs, **kwargs
        )
        recomputed.extend(
            node.name for node in backward_graph.graph.nodes
            if node.op == "call_function" and node.name in forward_names and _torch.is_op_overload(node.target)
        )
        return forward_graph, backward_graph

    def backward_compiler(graph_module: Any, example_inputs: Any) -> Callable[..., Any]:
        return _eager(graph_module, functools.partial(_note_run, owner) if recomputed else None)

    inputs = [*state, *(leaves[i] for i in tensor_positions)]
    on_cpu = all(tensor.device.type == "cpu" for tensor in inputs)
    compiled = aot_function(flat, fw_compiler=functools.partial(_forward_compiler, output, count),
                            bw_compiler=backward_compiler,
                            partition_fn=partition, decompositions=_DROPOUT_AS_MASK if on_cpu else {})
    if norms and (reason := norms_unavailable()) is not None:
        raise _Untraceable(reason)
    with functorch_config.patch(activation_memory_budget=budget), _torch.disable_current_modes(), torch.random.fork_rng(
        devices=[d for d in {t.device for t in inputs if t.device.type == "cuda"}]
    ), warnings.catch_warnings(), recomputable_norms() if norms else contextlib.nullcontext():
        warnings.simplefilter("ignore")  # torch's own notes while tracing (a non-leaf's .grad, ...): not the user's
        try:
            compiled(*inputs)
        except Exception as error:  # a data-dependent branch, an op without a fake implementation, ...
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise _Untraceable(f"tracing it failed ({type(error).__name__}: {first[:200]})") from error
    return _Trace(run=compiled, output=output)


def _forward_compiler(output: dict[str, Any], state: int, graph_module: Any, example_inputs: Any) -> Callable[..., Any]:
    """The forward graph, run eagerly; outputs it can make again from what it saves are noted when it runs."""
    outputs = output.get("graph_outputs")
    tails = output_tails(graph_module, outputs, state) if outputs is not None else {}
    run = _eager(graph_module)
    if not tails:
        return run

    def noting(args: list) -> Any:
        inputs = list(args[:state])
        results = run(args)
        for index, (graph, sources) in tails.items():
            made_from = [results[outputs + i] if kind == "saved" else inputs[i] for kind, i in sources]
            register(results[index], graph, made_from)
        return results

    return _torch.mark_boxed(noting)


def _rebuilt(trace: _Trace, tensors: tuple[torch.Tensor, ...]) -> Any:
    constants = trace.output["constants"]
    produced = iter(tensors)
    leaves = [constants[i] if i in constants else next(produced) for i in range(trace.output["count"])]
    return _torch.tree_unflatten(leaves, trace.output["spec"])


def _forward_of_call(module: nn.Module, core: Callable[..., Any]) -> Callable[..., Any] | None:
    """``module.forward`` when ``core`` is the module's ``__call__`` (a stack hands ``layer.__call__`` over, a
    ``CheckpointWrapper`` the layer itself): the trace leaves the module's hooks out; they run around the graphs
    instead."""
    calls = _torch.module_call_functions()
    called = core is module or (getattr(core, "__self__", None) is module and getattr(core, "__func__", None) in calls)
    if called and "forward" not in vars(module):
        return module.forward
    return None


def partitioned_checkpoint(function: Callable[..., Any], *args: Any, budget: float, recompute_norms: bool = False,
                           **checkpoint_kwargs: Any) -> Any:
    """Run one block call as a forward graph whose backward keeps what the min-cut partitioner chose at ``budget``
    (with ``recompute_norms``, it may recompute layer norms and softmaxes too: :mod:`hf_ckpt.strategies.partition.norms`).

    The calling convention of ``torch.utils.checkpoint.checkpoint`` (``function(*args)`` is the block call), so a
    model's ``_gradient_checkpointing_func`` may be a ``partial`` of it. ``checkpoint_kwargs`` are used only when
    the call cannot be traced and the block is checkpointed in full instead (one warning says why).
    """
    module = module_of(function)
    if not torch.is_grad_enabled() or module is None:
        return function(*args) if module is not None else _fallback(
            None, function, args, checkpoint_kwargs, "the checkpoint function cannot tell which module it runs")
    core, leading, keywords = _unwrap(function)
    traced = _forward_of_call(module, core) or core
    kwargs = {k: v for k, v in checkpoint_kwargs.items() if k not in ("use_reentrant", "preserve_rng_state",
                                                                      "determinism_check", "debug")}
    leaves, spec = _torch.tree_flatten((leading, keywords, args, kwargs))
    named = [*module.named_parameters(), *module.named_buffers()]
    names, state = [name for name, _ in named], [value for _, value in named]
    per_module = _traces.setdefault(module, {})
    try:
        key = (budget, recompute_norms, getattr(core, "__func__", core), str(spec),
               tuple(_leaf_key(leaf) for leaf in leaves), tuple(value.requires_grad for value in state),
               module.training, _autocast_key())
        trace = per_module.get(key)
        if trace is None:
            try:
                trace = per_module[key] = _trace(module, traced, leaves, spec, state, names, budget, recompute_norms)
            except _Untraceable as error:
                trace = per_module[key] = str(error)  # a call that failed to trace is not traced again
    except _Untraceable as error:
        trace = str(error)
    if isinstance(trace, str):
        return _fallback(module, function, args, checkpoint_kwargs, trace)
    def run_graphs(*_: Any, **__: Any) -> Any:
        note_block_run(module)
        tensors = [*state, *(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))]
        return _rebuilt(trace, tuple(trace.run(*tensors)))

    if traced is core:
        return run_graphs()
    # The stack handed over the module's __call__: its hooks run around the graphs, as around its forward.
    module.forward = run_graphs
    try:
        return function(*args, **kwargs)  # keywords a CheckpointWrapper hands over with the block's arguments
    finally:
        del module.forward


def traced_norm_ops(module: nn.Module) -> bool:
    """Whether a traced call of ``module`` has norms or softmaxes that ``":norms"`` would let the partitioner
    recompute (False until the module is traced)."""
    return any(isinstance(trace, _Trace) and trace.output.get("norms") for trace in _traces.get(module, {}).values())


def _fallback(module: nn.Module | None, function: Callable[..., Any], args: tuple, checkpoint_kwargs: dict,
              reason: str) -> Any:
    from torch.utils.checkpoint import checkpoint

    name = type(module).__name__ if module is not None else "a block"
    warn_once(
        f"partition: {name} is checkpointed in full instead of partitioned: {reason}.",
        key=f"partition-fallback:{name}",
    )
    options = {"use_reentrant": False, **{k: v for k, v in checkpoint_kwargs.items() if k != "context_fn"}}
    return checkpoint(function, *args, **options)
