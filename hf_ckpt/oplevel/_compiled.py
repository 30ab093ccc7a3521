"""The reference op-level trade-off: ``torch.compile`` with ``activation_memory_budget``, for ``compile:F`` benches.

torch's min-cut partitioner decides, per compiled graph, which forward values the backward graph keeps and which
it recomputes; ``torch._functorch.config.activation_memory_budget = F`` asks it for at most ``F`` of the memory
its default choice keeps (1.0: the default; 0: recompute everything it may). :class:`CompiledReference` compiles
the model's ``__call__`` with inductor (CPU or GPU) under that setting, as ``nn.Module.compile`` does, and
switches the compiled call on and off.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Mapping

import torch
from torch import nn


def compile_unavailable() -> str | None:
    """Why ``torch.compile`` with an activation memory budget cannot run here, or None when it can."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        import torch._functorch.config as functorch_config
    except ImportError as error:  # pragma: no cover - every torch with torch.compile has it
        return f"torch._functorch.config cannot be imported ({error})"
    if not hasattr(functorch_config, "activation_memory_budget"):
        return "this torch's partitioner has no activation_memory_budget (torch >= 2.4 has it)"
    if not hasattr(nn.Module, "compile"):
        return "this torch's nn.Module cannot hold a compiled call (nn.Module.compile, torch >= 2.2)"
    return None


class CompiledReference:
    """``torch.compile(model, backend="inductor")`` with ``activation_memory_budget=budget`` during partitioning."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self._compiled: "weakref.WeakKeyDictionary[nn.Module, Callable[..., Any]]" = weakref.WeakKeyDictionary()

    def _backend(self, graph: Any, example_inputs: Any) -> Any:
        import torch._functorch.config as functorch_config
        from torch._inductor.compile_fx import compile_fx

        with functorch_config.patch(activation_memory_budget=self.budget):
            return compile_fx(graph, example_inputs)

    def prepare(self, model: nn.Module, batch: Mapping[str, Any], step: Callable[[], Any]) -> None:
        """Compile for ``model`` and run ``step`` once so that compilation is not measured."""
        reason = compile_unavailable()
        if reason is not None:
            raise RuntimeError(f"compile:{self.budget:g} cannot run: {reason}")
        # One backend object per budget: dynamo guards on the backend, so budgets do not share compiled code.
        self._compiled[model] = torch.compile(model._call_impl, backend=self._backend)
        self.apply(model)
        try:
            step()
        except Exception as error:
            raise RuntimeError(
                f"compile:{self.budget:g} cannot run on this machine: torch.compile with inductor failed "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). On a CPU inductor "
                "needs a C++ compiler (g++ or clang++); leave compile:F out of --strategies."
            ) from error
        finally:
            self.remove(model)

    def apply(self, model: nn.Module) -> None:
        if model not in self._compiled:
            raise RuntimeError(f"compile:{self.budget:g} was applied before it was prepared on a batch")
        model._compiled_call_impl = self._compiled[model]

    def remove(self, model: nn.Module) -> None:
        model._compiled_call_impl = None
