"""The reference op-level trade-off: ``torch.compile`` with ``activation_memory_budget``, for ``compile:F`` benches.

torch's min-cut partitioner decides, per compiled graph, which forward values the backward graph keeps and which
it recomputes; functorch's ``activation_memory_budget = F`` asks it for at most ``F`` of the memory
its default choice keeps (1.0: the default; 0: recompute everything it may). :class:`CompiledReference` compiles
the model's ``__call__`` with inductor (CPU or GPU) under that setting, as ``nn.Module.compile`` does, and
switches the compiled call on and off.

A benchmark reference, not part of the runtime: ``hf-ckpt bench --settings compile:F`` and ``benchmarks/`` use it;
the inductor and dynamo internals it drives are wrapped in :mod:`hf_ckpt.runtime._torch`.

Measuring it needs other instruments than eager strategies: while a ``TorchDispatchMode`` (the storage tracker,
``FlopCounterMode``) is active, dynamo runs the model eagerly. So :meth:`CompiledReference.measure` counts

* **retained bytes** with saved-tensor hooks: the distinct storages the compiled autograd function saves for
  backward, parameters and the batch left out (on an eager model the same hooks and the storage tracker agree to
  the bytes of the loss scalar);
* **step FLOPs** statically, over the forward and backward graphs the partitioner produced, with the formulas of
  ``torch.utils.flop_counter`` applied to each node's recorded shapes. The recompute is the difference with
  ``compile:1`` (graphs counted the same way), since a decomposed attention counts differently from the fused op.

**Random ops recomputed afresh.** Inductor draws dropout masks from seeds (``prims.inductor_seeds``) that the
partitioner does not know to be random: under a budget below 1 it may recompute the seeds in backward, which then
draws *new* masks, so the gradients are not those of the forward that ran (pytorch/pytorch#190758, open as of torch
2.13). :attr:`CompiledReference.backward_random` counts the backward graphs' nodes that draw random numbers
(``Tag.nondeterministic_seeded``; an attention only where its ``dropout_p`` is not 0); any is that bug.
``keep_random=True`` marks every such node of the joint graph ``MUST_SAVE`` before the partitioner runs (inductor's
``custom_partitioner_fn``): backward then uses the forward's seeds, 8 bytes per random op of a graph, the cheapest
correct choice for inductor's dropout (``compile_seeded:F``); a random op that inductor does not draw from a seed
(an attention with dropout) keeps its outputs instead.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Mapping

import torch
from torch import nn

from hf_ckpt.runtime import _torch
from hf_ckpt.runtime.util.flop_formulas import flop_registry
from hf_ckpt.strategies.partition.graph import draws_random
from hf_ckpt.meters.flops import elementwise_elements
from hf_ckpt.meters.step import forward_loss


def compile_unavailable() -> str | None:
    """Why ``torch.compile`` with an activation memory budget cannot run here, or None when it can."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    functorch_config = _torch.functorch_config()
    if functorch_config is None:  # pragma: no cover - every torch with torch.compile has it
        return "functorch's config cannot be imported"
    if not hasattr(functorch_config, "activation_memory_budget"):
        return "this torch's partitioner has no activation_memory_budget (torch >= 2.4 has it)"
    if not hasattr(nn.Module, "compile"):
        return "this torch's nn.Module cannot hold a compiled call (nn.Module.compile, torch >= 2.2)"
    return None


def graph_flops(graph_module: Any) -> int:
    """FLOPs of an aten FX graph, from each node's recorded ``meta["val"]`` and ``torch.utils.flop_counter``."""
    registry = flop_registry()
    total = 0
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        formula = registry.get(getattr(node.target, "overloadpacket", None))
        if formula is None:
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        total += int(formula(*args, **kwargs, out_val=node.meta.get("val")))
    return total


def graph_elementwise(graph_module: Any) -> int:
    """Elementwise output elements of an aten FX graph, counted as :func:`hf_ckpt.meters.flops.count_flops`
    counts them in eager mode. The partitioned graphs are decomposed (a layer norm is several nodes), so only
    differences between graphs of the same model compare (``compile:F`` less ``compile:1``)."""
    registry = flop_registry()
    total = 0
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and _torch.is_op_overload(node.target):
            total += elementwise_elements(node.target, node.meta.get("val"), registry)
    return total


def seeded_unavailable() -> str | None:
    """Why ``keep_random=True`` cannot run with this torch, or None when it can."""
    inductor_config = _torch.inductor_config()
    if inductor_config is None or _torch.custom_partitioner_class() is None:
        return "this torch's inductor takes no custom partitioner (no inductor CustomPartitionerFn)"
    if not hasattr(inductor_config, "custom_partitioner_fn"):
        return "this torch's inductor takes no custom partitioner (no inductor config custom_partitioner_fn)"
    return None


def _saving_random_partitioner() -> Any:
    """An inductor ``custom_partitioner_fn``: the min-cut partitioner, with every node that draws random numbers
    marked ``MUST_SAVE`` (its output, a seed or a mask, is kept for backward instead of drawn again there)."""
    min_cut_rematerialization_partition = _torch.aot_partitioner().min_cut_rematerialization_partition
    from torch.utils.checkpoint import CheckpointPolicy

    class SavingRandom(_torch.custom_partitioner_class()):
        def __call__(self, gm: Any, joint_inputs: Any, **kwargs: Any) -> Any:
            for node in gm.graph.nodes:
                if draws_random(node):
                    node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)

        def uuid(self) -> Any:
            return None  # no inductor code caching

    return SavingRandom()


class CompiledReference:
    """``torch.compile(model, backend="inductor")`` with ``activation_memory_budget=budget`` during partitioning.

    ``keep_random``: random nodes are saved for backward instead of drawn again there (see the module's notes);
    needs a budget above 0 (at 0 the partitioner returns before it reads the marks).
    """

    def __init__(self, budget: float, keep_random: bool = False) -> None:
        if keep_random and budget == 0:
            raise ValueError("keep_random needs an activation_memory_budget above 0: at 0 torch's partitioner "
                             "recomputes everything it may and ignores MUST_SAVE marks")
        self.budget = budget
        self.keep_random = keep_random
        self.graph_flops: list[int] = []
        self.graph_elementwise: list[int] = []
        #: Nodes of the compiled backward graphs that draw random numbers afresh (pytorch/pytorch#190758).
        self.backward_random = 0
        self._compiled: "weakref.WeakKeyDictionary[nn.Module, Callable[..., Any]]" = weakref.WeakKeyDictionary()

    @property
    def name(self) -> str:
        """The bench setting this is: ``compile:F`` or ``compile_seeded:F``."""
        return f"{'compile_seeded' if self.keep_random else 'compile'}:{self.budget:g}"

    def _record(self, graph: Any, is_backward: bool) -> None:
        """Count a partitioned graph's FLOPs and elementwise outputs, and a backward graph's random draws."""
        self.graph_flops.append(graph_flops(graph))
        self.graph_elementwise.append(graph_elementwise(graph))
        if is_backward:
            self.backward_random += sum(draws_random(node) for node in graph.graph.nodes)

    def _inner(self, graph: Any, example_inputs: Any, **kwargs: Any) -> Any:
        self._record(graph, bool(kwargs.get("is_backward")))
        return _torch.compile_fx_inner(graph, example_inputs, **kwargs)

    def _backend(self, graph: Any, example_inputs: Any) -> Any:
        functorch_config, inductor_config = _torch.functorch_config(), _torch.inductor_config()
        patches = {"activation_memory_budget": self.budget}
        if hasattr(functorch_config, "enable_autograd_cache"):
            patches["enable_autograd_cache"] = False  # a cache hit would skip the partitioner and our recording
        inductor_patches: dict[str, Any] = {"fx_graph_cache": False}
        if self.keep_random:
            inductor_patches["custom_partitioner_fn"] = _saving_random_partitioner()
        with functorch_config.patch(**patches), inductor_config.patch(**inductor_patches):
            return _torch.compile_fx(graph, example_inputs, inner_compile=self._inner)

    def prepare(self, model: nn.Module, batch: Mapping[str, Any], step: Callable[[], Any]) -> None:
        """Compile for ``model`` and run ``step`` once so that compilation is not measured.

        Resets dynamo first: compiled frames of another budget would otherwise be reused.
        """
        reason = compile_unavailable() or (seeded_unavailable() if self.keep_random else None)
        if reason is not None:
            raise RuntimeError(f"{self.name} cannot run: {reason}")
        _torch.dynamo_reset()
        self.graph_flops.clear()
        self.graph_elementwise.clear()
        self.backward_random = 0
        self._compiled[model] = torch.compile(_torch.call_impl(model), backend=self._backend)
        self.apply(model)
        try:
            step()
        except Exception as error:
            raise RuntimeError(
                f"{self.name} cannot run on this machine: torch.compile with inductor failed "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). On a CPU inductor "
                "needs a C++ compiler (g++ or clang++); leave compile:F and compile_seeded:F out."
            ) from error
        finally:
            self.remove(model)
        if not self.graph_flops:
            raise RuntimeError(f"{self.name}: dynamo compiled no graph for this model (it ran eagerly)")

    def apply(self, model: nn.Module) -> None:
        if model not in self._compiled:
            raise RuntimeError(f"{self.name} was applied before it was prepared on a batch")
        _torch.set_compiled_call(model, self._compiled[model])

    def remove(self, model: nn.Module) -> None:
        _torch.set_compiled_call(model, None)

    def measure(self, model: nn.Module, batch: Mapping[str, Any], loss_fn: Any = None) -> tuple[int, int]:
        """(bytes saved for backward, step FLOPs of the compiled graphs) of one step of the compiled model."""
        foreign = {
            t.untyped_storage().data_ptr()
            for t in (*model.parameters(), *model.buffers(), *(v for v in batch.values() if isinstance(v, torch.Tensor)))
        }
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in foreign:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        compiled_before = len(self.graph_flops)
        self.apply(model)
        try:
            model.train()
            model.zero_grad(set_to_none=True)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                loss = forward_loss(model, batch, loss_fn)
            loss.backward()
        finally:
            self.remove(model)
        if len(self.graph_flops) != compiled_before:
            raise RuntimeError(f"{self.name} recompiled while measured; its figures would mix graphs")
        return sum(saved.values()), sum(self.graph_flops)
