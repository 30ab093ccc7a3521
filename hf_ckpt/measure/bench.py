"""The benchmark: every strategy on the same model and batch, measured the same way.

For each strategy :func:`run_benchmark` switches the setting on, runs :func:`~hf_ckpt.measure.step.measure_step`
(memory, recompute, FLOPs) and switches it off again; then it times plain training steps of all strategies,
interleaved round-robin, and keeps the median. ``none`` is always measured: every ratio is relative to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..core import checkpointed_layers
from .step import LossFn, StepMeasurement, measure_step, model_device, training_step
from .strategies import Strategy, parse_strategy
from .timing import CLOCKS, interleaved_step_times, median, synchronizer

BASELINE = "none"


@dataclass(frozen=True)
class StrategyResult:
    """One strategy's measurements.

    Attributes:
        strategy: The strategy's canonical name (``"every_n:2"``).
        description: What it runs.
        selected_blocks: The blocks its flags select for recompute (``hf_ckpt.checkpointed_layers``).
        measurement: The measured step (memory, FLOPs, recomputed blocks).
        step_times_s: The timed steps, in seconds, one per round.
        details: What the strategy itself reported (a plan's predicted bytes and per-block strategies).
    """

    strategy: str
    description: str
    selected_blocks: list[int]
    measurement: StepMeasurement
    step_times_s: list[float]
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        """The median step time in seconds."""
        return median(self.step_times_s)


@dataclass
class BenchmarkReport:
    """The results of :func:`run_benchmark`, with the ratios people quote.

    Attributes:
        results: One :class:`StrategyResult` per strategy, ``none`` first.
        info: What ran: the workload and the environment (free-form, for the report and the JSON).
        repeat / warmup: Timed and untimed rounds.
        clock: What the step times measure: ``"wall"`` or ``"cpu"`` (process CPU time).
    """

    results: list[StrategyResult]
    info: dict[str, Any] = field(default_factory=dict)
    repeat: int = 0
    warmup: int = 0
    clock: str = "wall"

    def __getitem__(self, strategy: str) -> StrategyResult:
        for result in self.results:
            if result.strategy == strategy:
                return result
        raise KeyError(f"no strategy {strategy!r} in this report; it has: {', '.join(self.names)}")

    def __contains__(self, strategy: object) -> bool:
        return any(result.strategy == strategy for result in self.results)

    @property
    def names(self) -> list[str]:
        return [result.strategy for result in self.results]

    @property
    def baseline(self) -> StrategyResult:
        return self[BASELINE]

    def retained_fraction(self, strategy: str) -> float:
        """Activation memory retained at the end of forward, as a fraction of no checkpointing."""
        return self[strategy].measurement.retained_bytes / max(self.baseline.measurement.retained_bytes, 1)

    def flops_ratio(self, strategy: str) -> float:
        """FLOPs of the step relative to no checkpointing (1.33 is one extra forward of everything)."""
        return self[strategy].measurement.flops / max(self.baseline.measurement.flops, 1)

    def speed_ratio(self, strategy: str) -> float:
        """Speed relative to no checkpointing: ``time(none) / time(strategy)`` (below 1 is slower)."""
        return self.baseline.step_time_s / self[strategy].step_time_s


def _strategy(spec: Strategy | str) -> Strategy:
    return spec if isinstance(spec, Strategy) else parse_strategy(spec)


def run_benchmark(
    model: nn.Module,
    batch: Mapping[str, Any],
    strategies: Sequence[Strategy | str],
    *,
    repeat: int = 5,
    warmup: int = 1,
    loss_fn: LossFn | None = None,
    on_step: Callable[[str], None] | None = None,
    info: Mapping[str, Any] | None = None,
    clock: str = "wall",
) -> BenchmarkReport:
    """Measure every strategy on ``model`` and ``batch``.

    Args:
        model: A ``PreTrainedModel`` on its device, checkpointing off; left with checkpointing off.
        batch: Keyword arguments for the model, on its device, with labels (or pass ``loss_fn``).
        strategies: :class:`~hf_ckpt.measure.strategies.Strategy` objects or their names (``"every_n:2"``);
            ``none`` is added first when missing.
        repeat: Timed rounds; each round runs one step of every strategy.
        warmup: Untimed rounds before them.
        loss_fn: Maps the model output to the loss (default ``output.loss``).
        on_step: Called with a short label after every step (a progress bar).
        info: Anything to carry into the report.
        clock: ``"wall"`` (default) or ``"cpu"``, see :data:`hf_ckpt.measure.timing.CLOCKS`.

    Returns:
        A :class:`BenchmarkReport`.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")
    chosen = [_strategy(spec) for spec in strategies]
    if BASELINE not in [strategy.name for strategy in chosen]:
        chosen.insert(0, parse_strategy(BASELINE))
    else:
        chosen.sort(key=lambda strategy: strategy.name != BASELINE)
    by_name = {strategy.name: strategy for strategy in chosen}
    notify = on_step or (lambda label: None)

    for strategy in chosen:
        if strategy.prepare is not None:
            strategy.prepare(model, batch)

    measured: dict[str, tuple[list[int], StepMeasurement]] = {}
    for strategy in chosen:
        strategy.apply(model)
        try:
            selected = checkpointed_layers(model)
            measured[strategy.name] = (selected, _own_figures(measure_step(model, batch, loss_fn=loss_fn), strategy.details))
        finally:
            strategy.remove(model)
        model.zero_grad(set_to_none=True)
        notify(f"measured {strategy.name}")

    def before(name: str) -> None:
        model.zero_grad(set_to_none=True)
        by_name[name].apply(model)

    def after(name: str) -> None:
        by_name[name].remove(model)

    times = interleaved_step_times(
        list(by_name),
        lambda name: training_step(model, batch, loss_fn),
        repeat=repeat,
        warmup=warmup,
        before=before,
        after=after,
        synchronize=synchronizer(model_device(model)),
        on_step=lambda: notify("timing"),
        clock=CLOCKS[clock],
    )
    model.zero_grad(set_to_none=True)
    results = [
        StrategyResult(
            strategy=strategy.name,
            description=strategy.description,
            selected_blocks=measured[strategy.name][0],
            measurement=measured[strategy.name][1],
            step_times_s=times[strategy.name],
            details=dict(strategy.details),
        )
        for strategy in chosen
    ]
    return BenchmarkReport(results=results, info=dict(info or {}), repeat=repeat, warmup=warmup, clock=clock)


def _own_figures(measurement: StepMeasurement, details: Mapping[str, Any]) -> StepMeasurement:
    """The figures a strategy measured itself, in place of the eager step's.

    ``compile:F``: under the bench's dispatch modes dynamo runs the model eagerly, so the measured step is not the
    compiled one; its row shows the bytes the compiled graphs save for backward and their FLOPs
    (``details["saved_bytes"]``, ``details["graph_flops"]``) and no peak (not measured: ``-``).
    """
    if "saved_bytes" not in details or "graph_flops" not in details:
        return measurement
    saved = int(details["saved_bytes"])
    return replace(
        measurement, retained_bytes=saved, retained_bytes_by_device={measurement.device: saved},
        flops=int(details["graph_flops"]), peak_bytes=None, peak_bytes_by_device={},
        allocator_retained_bytes=None, allocator_peak_bytes=None,
    )


def steps_of(strategies: int, *, repeat: int, warmup: int) -> int:
    """How many steps :func:`run_benchmark` calls ``on_step`` for (the length of a progress bar)."""
    return strategies + strategies * (repeat + warmup)


def environment() -> dict[str, Any]:
    """Versions and machine, for the report."""
    import platform

    import transformers

    from .. import __version__

    return {
        "hf_ckpt": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_threads": torch.get_num_threads(),
    }
