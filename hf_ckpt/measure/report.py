"""Reading a :class:`~hf_ckpt.measure.bench.BenchmarkReport`: the table, the checks, the JSON and the plot."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from hf_ckpt.runtime.util.units import format_bytes, format_flops
from hf_ckpt.measure.bench import BenchmarkReport
from hf_ckpt.measure.labels import place_labels
from hf_ckpt.measure.settings import BASELINE, EVERY_BLOCK, EVERY_BLOCK_SELECTIVE
from hf_ckpt.measure.timing import median

MIB = 2**20

#: Full checkpointing keeps at most this fraction of the activation memory of no checkpointing.
MAX_FULL_RETAINED_FRACTION = 0.15
#: One extra forward of every block on top of forward + backward (1 + 2 + 1) / (1 + 2) = 1.33 is the ceiling.
MAX_FULL_FLOPS_RATIO = 1.34
#: hf_ckpt may cost at most this fraction of step time over transformers' own checkpointing at the same setting,
#: judged by the :data:`CONFIDENCE` interval of the median per-round ratio (:func:`overhead_interval`).
MAX_OVERHEAD_VS_UPSTREAM = 0.02
#: The confidence of the interval a timing check is judged by.
CONFIDENCE = 0.95
#: A timing check's verdicts: within the limit, over it, or neither with confidence.
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
#: Selective recompute on every block saves at least this fraction of the activation memory...
MIN_SELECTIVE_SAVING = 0.30
#: ...for at most this many extra FLOPs (matmuls and attention are kept, not recomputed).
MAX_SELECTIVE_FLOPS_RATIO = 1.02
#: A plan's predicted activation bytes are within this fraction of the measured.
MAX_PLAN_PREDICTION_ERROR = 0.10


@dataclass(frozen=True)
class Check:
    """One criterion, its measured value and whether it held.

    Attributes:
        name / measured / limit: What is checked, the measured figure and the limit, as printed.
        passed: False when the check failed. A timing check that is inconclusive (its interval straddles the limit:
            too noisy a machine to tell) is no failure: ``passed`` is True and ``verdict`` says ``"inconclusive"``.
        verdict: ``"pass"``, ``"fail"`` or ``"inconclusive"`` (only timing checks can be); follows ``passed`` when
            not given.
        interval: A timing check's :data:`CONFIDENCE` interval of the overhead, ``(low, high)`` as fractions.
    """

    name: str
    measured: str
    limit: str
    passed: bool
    verdict: str = ""
    interval: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not self.verdict:
            object.__setattr__(self, "verdict", PASS if self.passed else FAIL)
        elif self.verdict not in (PASS, FAIL, INCONCLUSIVE):
            raise ValueError(f"verdict must be one of {PASS!r}, {FAIL!r}, {INCONCLUSIVE!r}; got {self.verdict!r}")
        elif self.passed != (self.verdict != FAIL):
            raise ValueError(f"passed={self.passed} contradicts verdict={self.verdict!r}")

    @property
    def label(self) -> str:
        """How the verdict prints: ``PASS``, ``FAIL`` or ``INCONCLUSIVE (noisy machine)``."""
        return "INCONCLUSIVE (noisy machine)" if self.verdict == INCONCLUSIVE else self.verdict.upper()


@dataclass(frozen=True)
class OverheadInterval:
    """How much slower one setting's step is than a reference's, from rounds that ran both (:func:`overhead_interval`).

    Attributes:
        median: The median over rounds of (this round's step / the reference's step of the same round), less 1.
        low / high: The confidence interval of that median, less 1.
        confidence: The interval's coverage (at least :data:`CONFIDENCE` with 6 rounds or more; with fewer no
            interval reaches it, and the rounds' whole range is given with its smaller coverage).
        rounds: How many paired rounds.
    """

    median: float
    low: float
    high: float
    confidence: float
    rounds: int

    def describe(self) -> str:
        """``+0.4% (95% CI -0.6% to +1.3%, 25 rounds)``; with too few rounds for 95%, the coverage reached."""
        level = (f"{CONFIDENCE:.0%} CI" if self.confidence >= CONFIDENCE
                 else f"{self.confidence:.0%} CI: too few rounds for {CONFIDENCE:.0%}")
        return f"{self.median:+.1%} ({level}, {self.low:+.1%} to {self.high:+.1%}, {self.rounds} rounds)"


def _binomial_tail(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def overhead_interval(ours: Sequence[float], reference: Sequence[float], *,
                      confidence: float = CONFIDENCE) -> OverheadInterval:
    """The overhead of ``ours`` over ``reference`` (step times of the same rounds, in order) with its interval.

    Each round ran one step of both, so their ratio cancels what the round's conditions did to both (the rounds
    interleave the settings, :mod:`hf_ckpt.measure.timing`). The interval is the distribution-free one for the
    median of the per-round ratios (the sign test's): with the ratios sorted, ``[r(k), r(n + 1 - k)]`` for the
    largest ``k`` whose coverage ``1 - 2 P(X <= k - 1)``, X ~ Binomial(n, 1/2), is at least ``confidence``. It
    assumes only that rounds are independent: no normality, and a round a neighbour's job slowed moves it by one
    rank at most, however slow. 25 rounds give ``[r(8), r(18)]`` (95.7%).

    Raises:
        ValueError: the two lists differ in length or are empty, a time is not positive, or ``confidence`` is not in
            (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence!r}")
    if len(ours) != len(reference) or not ours:
        raise ValueError(f"ours and reference must be step times of the same rounds, at least one; got "
                         f"{len(ours)} and {len(reference)}")
    if any(not time > 0 for time in [*ours, *reference]):
        raise ValueError("step times must be positive seconds")
    ratios = sorted(mine / theirs for mine, theirs in zip(ours, reference))
    n = len(ratios)
    k = 1
    while k < (n + 1) // 2 and 1 - 2 * _binomial_tail(k, n) >= confidence:
        k += 1
    coverage = 1 - 2 * _binomial_tail(k - 1, n)
    return OverheadInterval(median(ratios) - 1, ratios[k - 1] - 1, ratios[n - k] - 1, coverage, n)


def overhead_verdict(interval: OverheadInterval, limit: float) -> str:
    """:data:`PASS` when the whole interval is within ``limit``, :data:`FAIL` only when the whole interval exceeds it,
    else :data:`INCONCLUSIVE`: the rounds cannot tell (too noisy a machine, or too few rounds for a
    :data:`CONFIDENCE` interval)."""
    if interval.confidence < CONFIDENCE:
        return INCONCLUSIVE
    if interval.high <= limit:
        return PASS
    if interval.low > limit:
        return FAIL
    return INCONCLUSIVE


def checks(report: BenchmarkReport) -> list[Check]:
    """The criteria that apply to the settings in ``report``.

    * every setting: the blocks that ran twice are exactly those its flags selected;
    * ``full``: retains at most 15% of ``none``'s activation memory, and costs at most 1.34x its FLOPs;
    * ``every_n:N``: retains strictly more than ``full`` and strictly less than ``none``;
    * ``upstream:X`` next to ``X``: hf_ckpt's step is at most 2% slower than transformers' own, judged by the 95%
      interval of the median per-round ratio (:func:`overhead_interval`, :func:`overhead_verdict`): it fails only
      when the whole interval is over 2%, and is inconclusive (not a failure) when the interval straddles it.
    """
    found: list[Check] = []
    for result in report.results:
        measured = result.measurement.recomputed_blocks
        found.append(
            Check(
                f"{result.setting}: recomputed blocks == selected blocks",
                _blocks(measured),
                _blocks(result.selected_blocks),
                measured == result.selected_blocks,
            )
        )
    if EVERY_BLOCK in report:
        fraction = report.retained_fraction(EVERY_BLOCK)
        found.append(
            Check(
                "full: retained activation memory <= 15% of none",
                f"{fraction:.1%}",
                f"<= {MAX_FULL_RETAINED_FRACTION:.0%}",
                fraction <= MAX_FULL_RETAINED_FRACTION,
            )
        )
        ratio = report.flops_ratio("full")
        found.append(
            Check(
                "full: FLOPs <= 1.34x none",
                f"{ratio:.3f}x",
                f"<= {MAX_FULL_FLOPS_RATIO}x",
                ratio <= MAX_FULL_FLOPS_RATIO,
            )
        )
        full = report["full"].measurement.retained_bytes
        none = report.baseline.measurement.retained_bytes
        for result in report.results:
            if result.setting.startswith("every_n:") and result.setting != "every_n:1":
                retained = result.measurement.retained_bytes
                found.append(
                    Check(
                        f"{result.setting}: full < retained < none",
                        format_bytes(retained),
                        f"({format_bytes(full)}, {format_bytes(none)})",
                        full < retained < none,
                    )
                )
    found.extend(_selective_checks(report))
    found.extend(_plan_checks(report))
    found.extend(_timing_checks(report))
    return found


def _timing_checks(report: BenchmarkReport) -> list[Check]:
    """``X`` against ``upstream:X``: pass, fail or inconclusive by the interval of the paired rounds."""
    found = []
    for result in report.results:
        ours = result.setting.removeprefix("upstream:")
        if result.setting.startswith("upstream:") and ours in report:
            interval = overhead_interval(report[ours].step_times_s, result.step_times_s)
            verdict = overhead_verdict(interval, MAX_OVERHEAD_VS_UPSTREAM)
            found.append(
                Check(
                    f"{ours}: hf_ckpt step time vs {result.setting} (median of per-round ratios)",
                    interval.describe(),
                    f"<= +{MAX_OVERHEAD_VS_UPSTREAM:.0%}",
                    verdict != FAIL,
                    verdict,
                    (interval.low, interval.high),
                )
            )
    return found


def _selective_checks(report: BenchmarkReport) -> list[Check]:
    if EVERY_BLOCK_SELECTIVE not in report:
        return []
    saving = 1 - report.retained_fraction(EVERY_BLOCK_SELECTIVE)
    ratio = report.flops_ratio("selective")
    return [
        Check("selective: saves >= 30% of none's activation memory", f"{saving:.1%}",
              f">= {MIN_SELECTIVE_SAVING:.0%}", saving >= MIN_SELECTIVE_SAVING),
        Check("selective: FLOPs <= 1.02x none", f"{ratio:.3f}x", f"<= {MAX_SELECTIVE_FLOPS_RATIO}x",
              ratio <= MAX_SELECTIVE_FLOPS_RATIO),
    ]


def _every_n_costs(report: BenchmarkReport) -> dict[str, tuple[int, int]]:
    """(retained bytes, FLOPs) of the every_n_layers settings measured in the report (``full`` is every_n:1)."""
    return {
        result.setting: (result.measurement.retained_bytes, result.measurement.flops)
        for result in report.results
        if result.setting in (EVERY_BLOCK, BASELINE) or result.setting.startswith("every_n:")
    }


def _plan_checks(report: BenchmarkReport) -> list[Check]:
    plans = [result for result in report.results if result.setting.startswith("plan:")]
    if not plans:
        return []
    costs = _every_n_costs(report)
    none_flops = report.baseline.measurement.flops
    found, strictly_cheaper = [], []
    for result in plans:
        measured = result.measurement.retained_bytes
        budget = result.details["budget_bytes"]
        predicted = result.details["predicted_bytes"]
        found.append(Check(f"{result.setting}: retained <= budget", format_bytes(measured),
                           f"<= {format_bytes(budget)}", measured <= budget))
        error = abs(predicted - measured) / measured
        found.append(Check(f"{result.setting}: predicted bytes within 10% of measured", f"{error:.1%}",
                           f"<= {MAX_PLAN_PREDICTION_ERROR:.0%}", error <= MAX_PLAN_PREDICTION_ERROR))
        fitting = {name: flops for name, (retained, flops) in costs.items() if retained <= budget}
        if not fitting:
            continue
        cheapest = min(fitting, key=fitting.get)
        overhead, reference = result.measurement.flops - none_flops, fitting[cheapest] - none_flops
        found.append(Check(f"{result.setting}: recompute FLOPs <= cheapest fitting every_n ({cheapest})",
                           format_flops(overhead), f"<= {format_flops(reference)}", overhead <= reference))
        strictly_cheaper.append(overhead < reference)
    if strictly_cheaper:
        found.append(Check("plans: strictly cheaper than every_n for at least one budget",
                           f"{sum(strictly_cheaper)} of {len(strictly_cheaper)}", ">= 1", any(strictly_cheaper)))
    return found


def _blocks(blocks: list[int]) -> str:
    if not blocks:
        return "-"
    if len(blocks) > 2 and blocks == list(range(blocks[0], blocks[-1] + 1)):
        return f"{blocks[0]}-{blocks[-1]}"
    return ",".join(str(block) for block in blocks)


def rows(report: BenchmarkReport) -> list[dict[str, Any]]:
    """One dict per setting with every figure of the table (the JSON's ``settings``)."""
    table = []
    for result in report.results:
        measurement = result.measurement
        table.append(
            {
                "setting": result.setting,
                "description": result.description,
                "recomputed_blocks": measurement.recomputed_blocks,
                "selected_blocks": result.selected_blocks,
                "retained_bytes": measurement.retained_bytes,
                "retained_fraction": report.retained_fraction(result.setting),
                "peak_bytes": measurement.peak_bytes,
                "retained_bytes_by_device": measurement.retained_bytes_by_device,
                "peak_bytes_by_device": measurement.peak_bytes_by_device,
                "allocator_retained_bytes": measurement.allocator_retained_bytes,
                "allocator_peak_bytes": measurement.allocator_peak_bytes,
                "flops": measurement.flops,
                "flops_ratio": report.flops_ratio(result.setting),
                "step_time_s": result.step_time_s,
                "step_times_s": result.step_times_s,
                "speed_ratio": report.speed_ratio(result.setting),
                "loss": measurement.loss,
                "details": result.details,
            }
        )
    return table


def to_dict(report: BenchmarkReport) -> dict[str, Any]:
    """Everything in the report as plain JSON-ready data."""
    return {
        "info": report.info,
        "repeat": report.repeat,
        "warmup": report.warmup,
        "clock": report.clock,
        "settings": rows(report),
        "checks": [asdict(check) for check in checks(report)],
    }


def format_table(report: BenchmarkReport) -> str:
    """The trade-off table, one row per setting, as fixed-width text (Markdown-compatible)."""
    with_device = any(result.measurement.allocator_peak_bytes is not None for result in report.results)
    header = ["setting", "retained", "% of none", "peak"]
    if with_device:
        header.append("device peak")
    header += ["FLOPs ratio", "step ms", "speed", "recomputed blocks"]
    lines = []
    for row, result in zip(rows(report), report.results):
        cells = [
            row["setting"],
            format_bytes(row["retained_bytes"]),
            f"{row['retained_fraction']:.1%}",
            format_bytes(row["peak_bytes"]),
        ]
        if with_device:
            cells.append(format_bytes(row["allocator_peak_bytes"]))
        cells += [
            f"{row['flops_ratio']:.3f}x",
            f"{row['step_time_s'] * 1000:.1f}",
            f"{row['speed_ratio']:.2f}x",
            _blocks(row["recomputed_blocks"]),
        ]
        lines.append(cells)
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def render(cells: list[str]) -> str:
        last = len(cells) - 1  # names left-aligned, figures right-aligned
        padded = [
            cell.ljust(width) if i in (0, last) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([render(header), rule, *(render(line) for line in lines)])


def format_checks(report: BenchmarkReport) -> str:
    """The checks, one per line: PASS/FAIL/INCONCLUSIVE (noisy machine), the criterion, the measured value and the
    limit."""
    return "\n".join(
        f"{check.label}  {check.name}: {check.measured} (limit {check.limit})" for check in checks(report)
    )


def plot_tradeoff(report: BenchmarkReport, path: str) -> None:
    """Write a PNG: retained activation memory against step time, one point per setting, the Pareto front drawn.

    Needs matplotlib (``pip install hf_ckpt[bench]``); uses the Agg canvas directly, so no GUI and no global
    pyplot state is touched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = [
        (result.step_time_s * 1000, result.measurement.retained_bytes / MIB, result.setting)
        for result in report.results
    ]
    front = pareto_front([(x, y) for x, y, _ in points])
    figure = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for x, y, name in points:
        reference = name.startswith("upstream:")  # transformers' own: a hollow marker
        axes.scatter(
            [x], [y], zorder=3, s=40, marker="o",
            facecolors="none" if reference else "tab:blue", edgecolors="tab:gray" if reference else "tab:blue",
        )
    axes.step([x for x, _ in front], [y for _, y in front], where="post", color="tab:red", label="Pareto front")
    axes.set_xlabel(f"step time (ms, median, {'process CPU time' if report.clock == 'cpu' else 'wall time'})")
    axes.set_ylabel("activation memory retained after forward (MiB)")
    model = report.info.get("model", {})
    title = f"{model.get('class', 'model')}: batch {model.get('batch', '?')} x seq {model.get('seq', '?')}"
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend()
    _annotate(axes, figure, points)  # last: the placement needs the final layout
    figure.savefig(path, format="png")


def _annotate(axes: Any, figure: Any, points: list[tuple[float, float, str]]) -> None:
    """Label each point, placed by :func:`~hf_ckpt.measure.labels.place_labels` so that no two labels overlap."""
    fontsize = 8.0
    axes.margins(0.15)  # room for labels beside the outermost points
    figure.tight_layout()
    to_points = 72.0 / figure.dpi
    anchors = [tuple(axes.transData.transform((x, y)) * to_points) for x, y, _ in points]
    renderer = figure.canvas.get_renderer()
    sizes = []
    for _, _, name in points:  # the rendered size of each label, in points
        text = axes.text(0, 0, name, fontsize=fontsize)
        extent = text.get_window_extent(renderer)
        sizes.append((extent.width * to_points, extent.height * to_points))
        text.remove()
    for (x, y, name), (dx, dy) in zip(points, place_labels(anchors, sizes)):
        far = abs(dy) > 2 * fontsize
        axes.annotate(
            name, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize, ha="left", va="bottom",
            arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5} if far else None,
        )


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both coordinates (lower is better), sorted by the first."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front
