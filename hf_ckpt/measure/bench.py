"""The benchmark: every setting on the same model and batch, measured the same way.

For each setting (:class:`~hf_ckpt.measure.settings.Setting`) :func:`run_benchmark` switches it on, runs :func:`~hf_ckpt.meters.step.measure_step`
(memory, recompute, FLOPs) and switches it off again; then it times plain training steps of all settings,
interleaved round-robin, and keeps the median. ``none`` is always measured: every ratio is relative to it.

The timed steps are steps of a training run after its first: an hf_ckpt setting measures what its first training
step recomputed (a probe that then removes itself). So a setting is switched on once, and between its rounds it is
*parked* (:func:`_park`: its record and hooks taken off, the model's attributes as before it) and put back exactly,
the same record, hooks and caches, rather than enabled afresh each round, which would time a first step every
round. A setting whose record holds more than attributes and hooks (blocks whose ``forward`` hf_ckpt wraps, a
plan's recomputed modules between the blocks) is enabled afresh each round instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from hf_ckpt.runtime.util.version import VERSION
from hf_ckpt.runtime.apply import checkpointed_layers, remove
from hf_ckpt.runtime.state import AttributeSnapshot, CheckpointState, clear_state, get_state, set_state
from hf_ckpt.runtime.target import target_model
from hf_ckpt.measure.settings import Setting, parse_setting
from hf_ckpt.meters.step import LossFn, StepMeasurement, measure_step, model_device, training_step
from hf_ckpt.measure.timing import CLOCKS, interleaved_step_times, median, synchronizer

BASELINE = "none"


@dataclass(frozen=True)
class SettingResult:
    """One setting's measurements.

    Attributes:
        setting: The setting's canonical name (``"every_n:2"``).
        description: What it runs.
        selected_blocks: The blocks its flags select for recompute (``hf_ckpt.checkpointed_layers``).
        measurement: The measured step (memory, FLOPs, recomputed blocks).
        step_times_s: The timed steps, in seconds, one per round.
        details: What the setting itself reported (a plan's predicted bytes and per-block strategies).
    """

    setting: str
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
        results: One :class:`SettingResult` per setting, ``none`` first.
        info: What ran: the workload and the environment (free-form, for the report and the JSON).
        repeat / warmup: Timed and untimed rounds.
        clock: What the step times measure: ``"wall"`` or ``"cpu"`` (process CPU time).
    """

    results: list[SettingResult]
    info: dict[str, Any] = field(default_factory=dict)
    repeat: int = 0
    warmup: int = 0
    clock: str = "wall"

    def __getitem__(self, setting: str) -> SettingResult:
        for result in self.results:
            if result.setting == setting:
                return result
        raise KeyError(f"no setting {setting!r} in this report; it has: {', '.join(self.names)}")

    def __contains__(self, setting: object) -> bool:
        return any(result.setting == setting for result in self.results)

    @property
    def names(self) -> list[str]:
        return [result.setting for result in self.results]

    @property
    def baseline(self) -> SettingResult:
        return self[BASELINE]

    def retained_fraction(self, setting: str) -> float:
        """Activation memory retained at the end of forward, as a fraction of no checkpointing."""
        return self[setting].measurement.retained_bytes / max(self.baseline.measurement.retained_bytes, 1)

    def flops_ratio(self, setting: str) -> float:
        """FLOPs of the step relative to no checkpointing (1.33 is one extra forward of everything)."""
        return self[setting].measurement.flops / max(self.baseline.measurement.flops, 1)

    def speed_ratio(self, setting: str) -> float:
        """Speed relative to no checkpointing: ``time(none) / time(setting)`` (below 1 is slower)."""
        return self.baseline.step_time_s / self[setting].step_time_s


def _setting(spec: Setting | str) -> Setting:
    return spec if isinstance(spec, Setting) else parse_setting(spec)


def run_benchmark(
    model: nn.Module,
    batch: Mapping[str, Any],
    settings: Sequence[Setting | str] = (),
    *,
    repeat: int = 5,
    warmup: int = 1,
    loss_fn: LossFn | None = None,
    on_step: Callable[[str], None] | None = None,
    info: Mapping[str, Any] | None = None,
    clock: str = "wall",
) -> BenchmarkReport:
    """Measure every setting on ``model`` and ``batch``.

    Args:
        model: A ``PreTrainedModel`` on its device, checkpointing off; left with checkpointing off.
        batch: Keyword arguments for the model, on its device, with labels (or pass ``loss_fn``).
        settings: :class:`~hf_ckpt.measure.settings.Setting` objects or their names (``"every_n:2"``);
            ``none`` is added first when missing.
        repeat: Timed rounds; each round runs one step of every setting.
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
    chosen = [_setting(spec) for spec in settings]
    if BASELINE not in [setting.name for setting in chosen]:
        chosen.insert(0, parse_setting(BASELINE))
    else:
        chosen.sort(key=lambda setting: setting.name != BASELINE)
    by_name = {setting.name: setting for setting in chosen}
    notify = on_step or (lambda label: None)

    for setting in chosen:
        if setting.prepare is not None:
            setting.prepare(model, batch)

    switch = _Switch(model, by_name)
    measured: dict[str, tuple[list[int], StepMeasurement]] = {}
    for setting in chosen:
        setting.apply(model)
        try:
            selected = checkpointed_layers(model)
            measured[setting.name] = (selected, _own_figures(measure_step(model, batch, loss_fn=loss_fn), setting.details))
        finally:
            switch.off(setting.name)
        model.zero_grad(set_to_none=True)
        notify(f"measured {setting.name}")

    times = interleaved_step_times(
        list(by_name),
        lambda name: training_step(model, batch, loss_fn),
        repeat=repeat,
        warmup=warmup,
        before=switch.on,
        after=switch.off,
        synchronize=synchronizer(model_device(model)),
        on_step=lambda: notify("timing"),
        clock=CLOCKS[clock],
    )
    model.zero_grad(set_to_none=True)
    results = [
        SettingResult(
            setting=setting.name,
            description=setting.description,
            selected_blocks=measured[setting.name][0],
            measurement=measured[setting.name][1],
            step_times_s=times[setting.name],
            details=dict(setting.details),
        )
        for setting in chosen
    ]
    return BenchmarkReport(results=results, info=dict(info or {}), repeat=repeat, warmup=warmup, clock=clock)


@dataclass(frozen=True)
class _Parked:
    """An hf_ckpt setting taken off a model by :func:`_park`: its record, and the attributes it had set."""

    state: CheckpointState
    attributes: AttributeSnapshot


class _Switch:
    """Switches the bench's settings on and off between rounds: a setting whose ``remove`` is ``hf_ckpt.disable``'s
    (every hf_ckpt setting) is parked and put back (:func:`_park`), the others applied and removed (upstream's, the
    compile reference, one registered with side effects of its own)."""

    def __init__(self, model: nn.Module, settings: Mapping[str, Setting]) -> None:
        self.model = model
        self.settings = settings
        self.parked: dict[str, _Parked] = {}

    def on(self, name: str) -> None:
        self.model.zero_grad(set_to_none=True)
        parked = self.parked.pop(name, None)
        if parked is None:
            self.settings[name].apply(self.model)
        else:
            _unpark(self.model, parked)

    def off(self, name: str) -> None:
        parked = _park(self.model) if self.settings[name].remove is remove else None
        if parked is None:
            self.settings[name].remove(self.model)
        else:
            self.parked[name] = parked


def _park(model: nn.Module) -> _Parked | None:
    """Take the hf_ckpt setting on ``model`` off, so that :func:`_unpark` puts that very setting back: the model is
    left as before the setting (attributes restored, hooks removed, no record), as ``hf_ckpt.disable`` leaves it.

    None, and nothing changed, when there is nothing to put back exactly: no hf_ckpt setting, one whose first
    step has not been measured yet, or one whose record holds actions that cannot be redone (``state.undo``)."""
    target = target_model(model)
    state = get_state(target)
    if state is None or state.measured is None or state.undo:
        return None
    attributes = AttributeSnapshot.take(target)
    clear_state(target)  # its hooks removed; nothing else to undo
    state.before.restore()
    return _Parked(state, attributes)


def _unpark(model: nn.Module, parked: _Parked) -> None:
    """Put back a setting :func:`_park` took off, as it was: its attributes, its hooks (caches and all), its record."""
    target = target_model(model)
    parked.attributes.restore()
    parked.state.hooks.install()
    set_state(target, parked.state)


def _own_figures(measurement: StepMeasurement, details: Mapping[str, Any]) -> StepMeasurement:
    """The figures a setting measured itself, in place of the eager step's.

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


def steps_of(settings: int, *, repeat: int, warmup: int) -> int:
    """How many steps :func:`run_benchmark` calls ``on_step`` for (the length of a progress bar)."""
    return settings + settings * (repeat + warmup)


def environment() -> dict[str, Any]:
    """Versions and machine, for the report."""
    import platform

    import transformers

    return {
        "hf_ckpt": VERSION,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_threads": torch.get_num_threads(),
    }
