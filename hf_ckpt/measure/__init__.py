"""``hf_ckpt.measure``: the measured memory, compute and time trade-off of activation checkpointing.

* :func:`measure_step` / :class:`StepMeasurement`: one training step of a model as it is: the activation memory
  retained at the end of forward and the peak (tensor storages tracked by :class:`StorageTracker`), the FLOPs
  (``FlopCounterMode``, recompute included) and the blocks that were recomputed (counted, not read from flags).
* :func:`run_benchmark` / :class:`BenchmarkReport`: several strategies (``none``, ``full``, ``every_n:2``,
  ``upstream:full``, ...) on the same model and batch, with step times as medians over interleaved rounds.
* ``hf-ckpt bench`` (:mod:`hf_ckpt.cli`) runs it all from the command line.
"""

from .bench import BenchmarkReport, StrategyResult, run_benchmark
from .flops import count_flops
from .memory import StorageTracker
from .report import Check, checks, format_checks, format_table, plot_tradeoff, to_dict
from .step import StepMeasurement, measure_step, training_step
from .strategies import Strategy, available_strategies, parse_strategies, parse_strategy, register_strategy
from .timing import interleaved_step_times
from .workload import Workload, build_workload

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
