"""``hf_ckpt.measure``: the measured memory, compute and time trade-off of activation checkpointing.

* :func:`measure_step` / :class:`StepMeasurement`: one training step of a model as it is: the activation memory
  retained at the end of forward and the peak (tensor storages tracked by :class:`StorageTracker`), the FLOPs
  (``FlopCounterMode``, recompute included) and the blocks that were recomputed (counted, not read from flags).
* :func:`run_benchmark` / :class:`BenchmarkReport`: several *settings* (:class:`Setting`: ``none``, ``full``,
  ``every_n:2``, ``upstream:full``, ``plan:0.5``, ...) on the same model and batch, with step times as medians over
  interleaved rounds. A setting is a named configuration of the whole model, not a per-block strategy
  (:class:`hf_ckpt.BlockStrategy`).
* ``hf-ckpt bench`` (:mod:`hf_ckpt.cli`) runs it all from the command line.
"""

from __future__ import annotations


from hf_ckpt.runtime.lazy import lazy_exports

#: Public name -> the module that defines it. Loaded on first use (PEP 562): the planner builds on the measuring
#: primitives (memory, flops, step) while the bench settings build on the planner, so importing one primitive
#: must not import the bench.
_EXPORTS = {
    "BenchmarkReport": ".bench",
    "SettingResult": ".bench",
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
    "Setting": ".settings",
    "available_settings": ".settings",
    "parse_settings": ".settings",
    "parse_setting": ".settings",
    "register_setting": ".settings",
    "interleaved_step_times": ".timing",
    "Workload": ".workload",
    "build_workload": ".workload",
}

__all__ = [
    "BenchmarkReport",
    "Check",
    "StepMeasurement",
    "StorageTracker",
    "Setting",
    "SettingResult",
    "Workload",
    "available_settings",
    "build_workload",
    "checks",
    "count_flops",
    "format_checks",
    "format_table",
    "interleaved_step_times",
    "measure_step",
    "parse_setting",
    "parse_settings",
    "plot_tradeoff",
    "register_setting",
    "run_benchmark",
    "to_dict",
    "training_step",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
