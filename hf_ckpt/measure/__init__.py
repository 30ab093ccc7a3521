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


from hf_ckpt.runtime.util.lazy import lazy_exports

#: Public name -> the module that defines it. Loaded on first use (PEP 562). The measuring primitives (memory,
#: flops, step) live in :mod:`hf_ckpt.meters`, below the planners, while the bench settings here build on the
#: planner.
_EXPORTS = {
    "BenchmarkReport": ".bench",
    "SettingResult": ".bench",
    "run_benchmark": ".bench",
    "count_flops": "hf_ckpt.meters.flops",
    "StorageTracker": "hf_ckpt.meters.memory",
    "Check": ".report",
    "checks": ".report",
    "format_checks": ".report",
    "format_table": ".report",
    "plot_tradeoff": ".report",
    "to_dict": ".report",
    "StepMeasurement": "hf_ckpt.meters.step",
    "measure_step": "hf_ckpt.meters.step",
    "training_step": "hf_ckpt.meters.step",
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


#: Modules reached as attributes, loaded on first use: the CLI imports this package at its top (no torch) and calls
#: ``measure.bench.run_benchmark`` and the like when a command runs.
_SUBMODULES = ("bench", "report", "settings", "workload")

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)
