"""``max_seq``: the longest sequence (at a given batch) for which some plan's training step fits the device, and the
host where the plan offloads.

**Plans**, from the plainest: every block checkpointed (``full``); and the head in chunks (``+head``); and every
block's MLP in chunks (``+mlp``); and the checkpointed block inputs offloaded to pinned host memory (``+offload``,
only with ``host_memory``). Each is a row of :func:`~hf_ckpt.estimation.estimate` (``full``, ``full+head:<c>``,
``full+head:<c>+mlp:<m>`` and, with ``offload_activations``, that ``+offload``: the blocks' checkpointed inputs in
host memory but for the two that the overlapped offload holds in flight on the device, one copied back while the one
before it is recomputed).

**Method.** The estimate traces the model on fake tensors at one sequence length (20 to 60 s for an 8B config on one
CPU core), so the search does not trace at every step: each plan's device and host bytes are traced at three
lengths (``FIT_LENGTHS`` times the chunk, all chunked), fitted exactly by a quadratic in the length (linear terms:
hidden states, checkpointed inputs, the flash kernel's log-sum-exp; quadratic: an attention that materialises its
scores), the fit is searched for the longest length (a multiple of ``granularity``) whose bytes fit, and that length
is traced. Extrapolated that far, a fit through short lengths can be off by a few GiB, so the answer is refined on
traced values: the line through the last two traced lengths (a secant) gives the next length, which is traced, until
a traced length fits and the line puts the next step up over a budget (at most :data:`_VERIFY_TRIES` traces at long
lengths); the answer is the longest traced length that fits. The other plans' lengths are the fit's, for
comparison (plain ``full`` among them).

**What binds** at the next step up (``seq_len + granularity``): ``host memory`` where the offloaded inputs exceed it,
else, where the attention keeps its scores (eager attention; on the CPU, its math path), ``attention's own memory``
where the fit's quadratic term grows the device bytes more than the linear terms do, else ``device memory`` (the
fused CUDA kernels keep no scores).

**Copies.** With the offloaded plan on CUDA, each block's checkpointed input is copied to the host during the
forward while the next block computes, and back during the backward while the block after it is recomputed: the copy
of one input (bytes over ``pcie_bandwidth``, default :data:`PCIE_BANDWIDTH`) is compared with one block's forward
(its recompute FLOPs over ``device_flops``, default :data:`DEVICE_FLOPS`): where the copy is longer, it does not hide
behind compute and the result says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hf_ckpt.runtime.util.units import format_bytes, parse_size
from hf_ckpt.estimation import _arguments as arguments
from hf_ckpt.estimation._estimate import OFFLOAD_SUFFIX, estimate, mlp_row_name

#: Bytes per second of a pinned host<->device copy: PCIe 4.0 x16 is 32 GB/s raw per direction, about 25 GB/s
#: effective for large pinned copies.
PCIE_BANDWIDTH = 25e9
#: FLOPs per second a block's forward is assumed to run at: about 40 % of an H100 SXM's 989 dense bf16 TFLOP/s.
DEVICE_FLOPS = 4e14
#: The traced lengths, in multiples of the larger chunk (every traced length runs both chunked heads and MLPs).
FIT_LENGTHS = (4, 8, 16)
#: Head and MLP chunks (tokens) when none is given: small against the lengths searched (a 128k-vocabulary head
#: holds about 2 GiB of logits at 2048 tokens; an 8B model's MLP about 0.5 GiB of intermediates at 4096).
HEAD_CHUNK, MLP_CHUNK = 2048, 4096
_VERIFY_TRIES = 4  # traces at long lengths, at most
_LONGEST = 1 << 26  # the search's ceiling: 64M tokens per sequence


@dataclass(frozen=True)
class PlanFit:
    """One plan's bytes as a function of the sequence length ``s``: ``a + b*s + c*s**2`` (device) and ``host_b * s``
    (host, the offloaded inputs), fitted from three traced lengths."""

    name: str
    device: tuple[float, float, float]
    host: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def device_bytes(self, seq_len: int) -> float:
        a, b, c = self.device
        return a + b * seq_len + c * seq_len * seq_len

    def host_bytes(self, seq_len: int) -> float:
        a, b, c = self.host
        return a + b * seq_len + c * seq_len * seq_len


@dataclass(frozen=True)
class MaxSeq:
    """The longest sequence that fits, and how.

    Attributes:
        seq_len: The longest length (a multiple of ``granularity``) at which the best plan's step fits, verified by a
            trace at that length; 0 where none fits even at ``granularity`` tokens.
        plan: The plan reaching it: ``full``, ``full+head:<c>``, ``full+head:<c>+mlp:<m>`` or that ``+offload``.
        binds: What stops the next step up (``seq_len + granularity``): ``device memory``, ``host memory`` or
            ``attention's own memory``.
        device_bytes: The plan's predicted device peak at ``seq_len`` (traced).
        host_bytes: Host bytes of its offloaded inputs at ``seq_len`` (0 without offload).
        lengths: The longest length of each plan: ``plan``'s traced (``seq_len``), the others' from the fit (``full``
            is the plain-checkpointing comparison).
        refused: Plans that cannot run on this model, with the reason.
        copy_seconds, compute_seconds: With offload: one block input's copy at ``pcie_bandwidth`` and one block's
            forward at ``device_flops``, at ``seq_len``.
        traced_lengths: The lengths traced (the fit's three, then the verifications).
        batch_size, device_memory, host_memory, pcie_bandwidth, device_flops, granularity: as given.
    """

    seq_len: int
    plan: str | None
    binds: str
    device_bytes: int
    host_bytes: int
    lengths: dict[str, int]
    refused: dict[str, str]
    batch_size: int
    device_memory: int
    host_memory: int | None
    granularity: int
    traced_lengths: tuple[int, ...] = ()
    copy_seconds: float | None = None
    compute_seconds: float | None = None
    pcie_bandwidth: float = PCIE_BANDWIDTH
    device_flops: float = DEVICE_FLOPS
    notes: tuple[str, ...] = field(default=())

    @property
    def copies_hidden(self) -> bool | None:
        """Whether each offloaded input's copy takes no longer than a block's forward (None without offload)."""
        if self.copy_seconds is None or self.compute_seconds is None:
            return None
        return self.copy_seconds <= self.compute_seconds

    def __str__(self) -> str:
        host = f", host memory {format_bytes(self.host_memory)}" if self.host_memory is not None else ""
        lines = [f"longest sequence at batch {self.batch_size}, device memory {format_bytes(self.device_memory)}"
                 f"{host}:"]
        if not self.seq_len:
            lines.append(f"  nothing fits, even at {self.granularity} tokens ({self.binds} binds)")
        else:
            lines.append(f"  {self.seq_len:,} tokens with {self.plan} (device {format_bytes(self.device_bytes)}"
                         + (f", host {format_bytes(self.host_bytes)}" if self.host_bytes else "") + ")")
            lines.append(f"  at {self.seq_len + self.granularity:,} tokens {self.binds} binds")
        for name, length in self.lengths.items():
            how = "traced" if name == self.plan else "fitted"
            lines.append(f"  {name:<32} {length:>12,} tokens ({how})")
        for name, why in self.refused.items():
            lines.append(f"  {name:<32} refused: {why}")
        if self.copies_hidden is not None:
            lines.append("  " + copies_line(self.copy_seconds, self.compute_seconds, self.pcie_bandwidth,
                                            self.device_flops))
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


def copy_and_compute_seconds(made: Any, pcie_bandwidth: float = PCIE_BANDWIDTH,
                             device_flops: float = DEVICE_FLOPS) -> tuple[float, float]:
    """(seconds of the largest block input's copy at ``pcie_bandwidth``, seconds of the shortest block forward at
    ``device_flops``) in estimate ``made``: an offload's copies hide behind compute where the first is the smaller."""
    inputs, flops = made.block_bytes.get("full", ()), made.block_recompute_flops.get("full", ())
    return max(inputs, default=0) / pcie_bandwidth, min(flops, default=0) / device_flops


def copies_line(copy: float, compute: float, pcie_bandwidth: float, device_flops: float) -> str:
    """How one offloaded input's copy compares with a block's forward, in words."""
    verdict = "hidden behind compute" if copy <= compute else "NOT hidden behind compute: the step waits"
    return (f"offload copies: {copy:.3f} s per block input at {pcie_bandwidth / 1e9:g} GB/s vs {compute:.3f} s per "
            f"block forward at {device_flops / 1e12:g} TFLOP/s: {verdict}")


def _quadratic(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """``(a, b, c)`` of the quadratic through three ``(s, y)`` points (Lagrange)."""
    (x0, y0), (x1, y1), (x2, y2) = points
    d0, d1, d2 = (x0 - x1) * (x0 - x2), (x1 - x0) * (x1 - x2), (x2 - x0) * (x2 - x1)
    c = y0 / d0 + y1 / d1 + y2 / d2
    b = -(y0 * (x1 + x2) / d0 + y1 * (x0 + x2) / d1 + y2 * (x0 + x1) / d2)
    a = y0 * x1 * x2 / d0 + y1 * x0 * x2 / d1 + y2 * x0 * x1 / d2
    return a, b, c


def _figures(made: Any, names: dict[str, str], host_memory: int | None) -> dict[str, tuple[int, int]]:
    """(device bytes, host bytes) of each plan in one estimate: its rows, and with ``host_memory`` the last one's
    offloaded row (``<row>+offload``)."""
    figures = {plan: (made.peak_bytes[row], 0) for plan, row in names.items() if row in made.peak_bytes}
    if host_memory is not None and names:
        last = list(names)[-1]
        offloaded = names[last] + OFFLOAD_SUFFIX
        if last in figures and offloaded in made.activation_host_bytes:
            figures[last + OFFLOAD_SUFFIX] = (made.peak_bytes[offloaded], made.activation_host_bytes[offloaded])
    return figures


def _fits(fit: PlanFit, seq_len: int, device_memory: int, host_memory: int | None) -> bool:
    return (fit.device_bytes(seq_len) <= device_memory
            and (host_memory is None or fit.host_bytes(seq_len) <= host_memory))


def _longest(fit: PlanFit, device_memory: int, host_memory: int | None, granularity: int) -> int:
    """The longest multiple of ``granularity`` the fit says fits (binary search; 0: none)."""
    low, high = 0, _LONGEST // granularity
    while low < high:
        middle = (low + high + 1) // 2
        if _fits(fit, middle * granularity, device_memory, host_memory):
            low = middle
        else:
            high = middle - 1
    return low * granularity


def _within(figures: tuple[int, int], device_memory: int, host_memory: int | None) -> bool:
    return figures[0] <= device_memory and (host_memory is None or figures[1] <= host_memory)


def _line(first: tuple[int, tuple[int, int]], second: tuple[int, tuple[int, int]], which: int, at: int) -> float:
    (s0, f0), (s1, f1) = first, second
    slope = (f1[which] - f0[which]) / (s1 - s0) if s1 != s0 else 0.0
    return f1[which] + slope * (at - s1)


def _secant(first: tuple[int, tuple[int, int]], second: tuple[int, tuple[int, int]], device_memory: int,
            host_memory: int | None, granularity: int) -> int:
    """The longest multiple of ``granularity`` the line through two traced ``(length, (device, host))`` points
    keeps within the budgets."""
    low, high = 0, _LONGEST // granularity
    while low < high:
        middle = (low + high + 1) // 2
        at = middle * granularity
        if _line(first, second, 0, at) <= device_memory and (
                host_memory is None or _line(first, second, 1, at) <= host_memory):
            low = middle
        else:
            high = middle - 1
    return low * granularity


def _crossing(first: tuple[int, tuple[int, int]], second: tuple[int, tuple[int, int]], at: int, device_memory: int,
              host_memory: int | None) -> str | None:
    """Which budget the line through two traced points exceeds at ``at`` (host first), or None."""
    if host_memory is not None and _line(first, second, 1, at) > host_memory:
        return "host memory"
    return "device memory" if _line(first, second, 0, at) > device_memory else None


def _binds(fit: PlanFit, seq_len: int, granularity: int, host_memory: int | None,
           scores_kept: bool = True) -> str:
    """What stops ``seq_len + granularity``; attention's own memory only where the attention keeps its scores
    (``scores_kept``: eager attention, the CPU's math path; the fused CUDA kernels keep none, whatever the fit's
    quadratic term says far from the lengths it was traced at)."""
    up = seq_len + granularity
    if host_memory is not None and fit.host_bytes(up) > host_memory:
        return "host memory"
    if not scores_kept:
        return "device memory"
    _a, b, c = fit.device
    quadratic = c * ((up * up) - seq_len * seq_len)
    return "attention's own memory" if quadratic > b * granularity else "device memory"


def _refine(traced: Any, best: str, seq_len: int, last: tuple[int, tuple[int, int]],
            device_memory: int, host_memory: int | None, granularity: int, traced_lengths: list[int]) -> tuple:
    """The longest traced length of ``best`` that fits, from the fit's ``seq_len``: each traced length's figures,
    then the line through the last two traced points (a secant) gives the next, until a traced length fits and the
    line puts the next step up over a budget. Returns (the length, its estimate, its figures, the points traced)."""
    points, start = [last], seq_len
    answer, made, figures = 0, None, {}
    for _ in range(_VERIFY_TRIES):
        if not seq_len or any(seq_len == length for length, _f in points[1:]):
            break
        now, now_figures = traced(seq_len)
        traced_lengths.append(seq_len)
        points.append((seq_len, now_figures[best]))
        fits_now = _within(now_figures[best], device_memory, host_memory)
        if fits_now and seq_len > answer:
            answer, made, figures = seq_len, now, now_figures
        following = _secant(points[-2], points[-1], device_memory, host_memory, granularity)
        if fits_now and following <= seq_len:
            break
        seq_len = following if fits_now or following < seq_len else seq_len - granularity
    if start and not answer:
        raise ValueError(f"max_seq: no traced length of {best} fits (traced {', '.join(map(str, traced_lengths))}); "
                         "give a coarser granularity")
    return answer, made, figures, points


def max_seq(
    model_or_config: Any,
    *,
    device_memory: int | str,
    batch_size: int = 1,
    host_memory: int | str | None = None,
    head_chunk_size: int | None = None,
    mlp_chunk_size: int | None = None,
    pcie_bandwidth: float = PCIE_BANDWIDTH,
    device_flops: float = DEVICE_FLOPS,
    granularity: int = 1024,
    **estimate_options: Any,
) -> MaxSeq:
    """The longest sequence at ``batch_size`` for which some plan's step fits ``device_memory`` (and, offloading,
    ``host_memory``), the plan, and what binds at the next step up (see the module's docstring for the method).

    Args:
        model_or_config: As for :func:`~hf_ckpt.estimation.estimate` (a config, a ``config.json``, a meta model).
        device_memory: Memory of one device: bytes, or a size string (``"80GiB"``).
        batch_size: Sequences per step.
        host_memory: Host memory for offloaded checkpointed inputs (bytes or a size string); None: plans that
            offload are not considered.
        head_chunk_size: The chunk (tokens) of the chunked head; default :data:`HEAD_CHUNK`.
        mlp_chunk_size: The chunk (tokens) of the chunked MLP; default :data:`MLP_CHUNK`.
        pcie_bandwidth: Bytes per second of a host<->device copy (default :data:`PCIE_BANDWIDTH`, PCIe 4.0 x16).
        device_flops: FLOPs per second of a block's forward (default :data:`DEVICE_FLOPS`).
        granularity: The lengths searched are multiples of this many tokens.
        **estimate_options: Passed to :func:`~hf_ckpt.estimation.estimate` (``dtype``, ``optimizer``,
            ``peft_config``, ``device``, ...).

    Raises:
        ValueError: an argument is invalid (the message names it and what it accepts).
    """
    device_bytes = _size("device_memory", device_memory)
    host_bytes = None if host_memory is None else _size("host_memory", host_memory)
    batch_size = arguments.check_positive_int("batch_size", batch_size)
    head = arguments.check_positive_int("head_chunk_size", HEAD_CHUNK if head_chunk_size is None else head_chunk_size)
    mlp = arguments.check_positive_int("mlp_chunk_size", MLP_CHUNK if mlp_chunk_size is None else mlp_chunk_size)
    granularity = arguments.check_positive_int("granularity", granularity)
    for name, value in (("pcie_bandwidth", pcie_bandwidth), ("device_flops", device_flops)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number (per second); got {value!r}")
    for name in ("seq_len", "strategies", "head_chunk_size", "mlp_chunk_size", "offload_activations"):
        if name in estimate_options:
            raise ValueError(f"max_seq chooses {name} itself; drop it")
    names = {"full": "full", f"full+head:{head}": f"full+head:{head}", mlp_row_name(mlp, head): mlp_row_name(mlp, head)}

    def traced(seq_len: int) -> tuple[Any, dict[str, tuple[int, int]]]:
        made = estimate(model_or_config, batch_size=batch_size, seq_len=seq_len, strategies=("full",),
                        head_chunk_size=head, mlp_chunk_size=mlp, offload_activations=host_bytes is not None,
                        **estimate_options)
        return made, _figures(made, names, host_bytes)

    unit = max(head, mlp)
    lengths = [-(-unit * k // batch_size) for k in FIT_LENGTHS]
    made_at = [traced(s) for s in lengths]
    refused = {name: why for name, why in made_at[0][0].unusable.items() if name in names or name == mlp_row_name(mlp)}
    fits = {plan: PlanFit(plan, _quadratic([(s, f[plan][0]) for s, (_m, f) in zip(lengths, made_at)]),
                          _quadratic([(s, f[plan][1]) for s, (_m, f) in zip(lengths, made_at)]))
            for plan in made_at[0][1] if all(plan in f for _m, f in made_at)}
    longest = {plan: _longest(fit, device_bytes, host_bytes, granularity) for plan, fit in fits.items()}
    best = max(longest, key=lambda plan: longest[plan])  # the plainest plan among equals (dict order)
    seq_len, traced_lengths = longest[best], list(lengths)
    answer, made, figures, points = _refine(traced, best, seq_len, (lengths[-1], made_at[-1][1][best]),
                                            device_bytes, host_bytes, granularity, traced_lengths)
    seq_len = answer
    # a modelled attention is a fused CUDA kernel: it keeps no scores (eager attention and the CPU's are traced)
    binds = _binds(fits[best], seq_len, granularity, host_bytes,
                   scores_kept=not (made or made_at[-1][0]).attention.get("modelled"))
    if len(points) > 1 and binds != "attention's own memory":
        binds = _crossing(points[-2], points[-1], seq_len + granularity, device_bytes, host_bytes) or binds
    copy = compute = None
    if best.endswith(OFFLOAD_SUFFIX) and made is not None and made.device == "cuda":
        copy, compute = copy_and_compute_seconds(made, pcie_bandwidth, device_flops)
    return MaxSeq(
        seq_len=seq_len, plan=best if seq_len else None, binds=binds,
        device_bytes=int(figures.get(best, (0, 0))[0]), host_bytes=int(figures.get(best, (0, 0))[1]),
        lengths={**longest, best: seq_len}, refused=refused, batch_size=batch_size, device_memory=device_bytes, host_memory=host_bytes,
        granularity=granularity, traced_lengths=tuple(traced_lengths), copy_seconds=copy, compute_seconds=compute,
        pcie_bandwidth=float(pcie_bandwidth), device_flops=float(device_flops),
        notes=(f"method: each plan traced at {', '.join(map(str, lengths))} tokens and fitted by a quadratic in the "
               f"length; {best} then traced at {', '.join(f'{n:,}' for n in traced_lengths[len(lengths):])} tokens "
               "(the longest that fits is the answer; the other plans' lengths are the fit's)",
               "plans: full checkpointing; + the head in chunks; + every block's MLP in chunks; + checkpointed "
               "block inputs offloaded to the host (with host memory given)"),
    )


def _size(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be bytes (a positive int) or a size such as '80GiB'; got {value!r}")
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    raise ValueError(f"{name} must be bytes (a positive int) or a size such as '80GiB'; got {value!r}")
