"""``hf_ckpt.measure``: the measured memory, compute and time trade-off of activation checkpointing.

* :func:`measure_step` / :class:`StepMeasurement`: one training step of a model as it is: the activation memory
  retained at the end of forward and the peak (tensor storages tracked by :class:`StorageTracker`), the FLOPs
  (``FlopCounterMode``, recompute included) and the blocks that were recomputed (counted, not read from flags).
* :func:`run_benchmark` / :class:`BenchmarkReport`: several strategies (``none``, ``full``, ``every_n:2``,
  ``upstream:full``, ...) on the same model and batch, with step times as medians over interleaved rounds.
* ``hf-ckpt bench`` (:mod:`hf_ckpt.cli`) runs it all from the command line.
"""

from __future__ import annotations

from .._lazy import lazy_exports

#: Public name -> the module that defines it. Loaded on first use (PEP 562): the planner builds on the measuring
#: primitives (memory, flops, step) while the bench strategies build on the planner, so importing one primitive
#: must not import the bench.
_EXPORTS = {
    "BenchmarkReport": ".bench",
    "StrategyResult": ".bench",
    "run_benchmark": ".bench",
    "count_flops": ".flops",
    "StorageTracker": ".memory",
    "Check": ".report",
    "checks": ".report",
    "format_checks": ".report",
    "format_table": ".report",
    "plot_tradeoff": ".report",
    "to_dict": ".report",
    "StepMeasurement": ".step",
    "measure_step": ".step",
    "training_step": ".step",
    "Strategy": ".strategies",
    "available_strategies": ".strategies",
    "parse_strategies": ".strategies",
    "parse_strategy": ".strategies",
    "register_strategy": ".strategies",
    "interleaved_step_times": ".timing",
    "Workload": ".workload",
    "build_workload": ".workload",
}

__all__ = [
    "BenchmarkReport",
    "Check",
    "StepMeasurement",
    "StorageTracker",
    "Strategy",
    "StrategyResult",
    "Workload",
    "available_strategies",
    "build_workload",
    "checks",
    "count_flops",
    "format_checks",
    "format_table",
    "interleaved_step_times",
    "measure_step",
    "parse_strategies",
    "parse_strategy",
    "plot_tradeoff",
    "register_strategy",
    "run_benchmark",
    "to_dict",
    "training_step",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
