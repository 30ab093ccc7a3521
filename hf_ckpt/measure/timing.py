"""Step time: medians over interleaved repetitions.

Timing one strategy after another lets drift (a neighbour's job, thermal throttling, a warming cache) land on
one of them. :func:`interleaved_step_times` runs the strategies round-robin instead, one step of each per round,
and the median of each strategy's rounds is robust to the odd slow step. What ran just before a step also changes
its time (a larger memory footprint leaves the allocator and the caches in another state), so a fixed order, or
one only rotated, would let that land on one strategy: hf_ckpt's ``full`` always ran right after ``none`` and
``upstream:full`` right after ``full``. The rounds follow a Williams design instead (:func:`round_orders`): over
a cycle of rounds every strategy runs in every position equally often and right after every other strategy
equally often. The garbage collector is off during each
timed step (as ``timeit`` does) and catches up between steps, so no collection lands inside one step and not
another.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, Sequence

import torch


#: The clocks a benchmark can time with. ``wall`` is what a user waits for (with the device synchronized).
#: ``cpu`` is the CPU time of the process: on a CPU device run single-threaded it equals the wall time of an idle
#: machine, and it leaves out the time spent waiting while other processes had the core, so it is far steadier on
#: a shared machine (caches and memory bandwidth are still shared). Multi-threaded, it also counts the threads'
#: spin-waits; on an accelerator it misses the device work entirely: use ``wall`` there.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits for the work queued on ``device`` (a no-op on CPU)."""
    backend = getattr(torch, device.type, None)
    if device.type == "cpu" or backend is None or not hasattr(backend, "synchronize"):
        return lambda: None
    return lambda: backend.synchronize(device) if device.index is not None else backend.synchronize()


def interleaved_step_times(
    names: Sequence[str],
    run: Callable[[str], None],
    *,
    repeat: int,
    warmup: int = 1,
    before: Callable[[str], None] | None = None,
    after: Callable[[str], None] | None = None,
    synchronize: Callable[[], None] = lambda: None,
    on_step: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Time ``run(name)`` for every name, ``repeat`` rounds after ``warmup`` untimed rounds.

    Args:
        names: The strategies (or anything else) to time.
        run: Runs one step of ``name``; the only thing timed.
        repeat: Timed rounds (at least 1).
        warmup: Untimed rounds run first.
        before: Called before each ``run``, outside the timed region (switching strategy, zeroing grads).
        after: Called after each ``run``, outside the timed region.
        synchronize: Waits for queued device work; called before the clock starts and before it stops.
        on_step: Called after every step, timed or not (a progress bar).
        clock: Seconds from some origin: ``time.perf_counter`` (wall time, the default) or a CPU-time clock
            (see :data:`CLOCKS`).

    Returns:
        ``{name: [seconds of each timed round]}``.
    """
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be a positive int; got {repeat!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0; got {warmup!r}")
    times: dict[str, list[float]] = {name: [] for name in names}
    names = list(names)
    orders = round_orders(len(names))
    for round_index in range(warmup + repeat):
        for name in [names[i] for i in orders[round_index % len(orders)]]:
            if before is not None:
                before(name)
            gc.disable()  # as timeit does: no garbage collection lands inside a timed step
            try:
                synchronize()
                start = clock()
                run(name)
                synchronize()
                elapsed = clock() - start
            finally:
                gc.enable()
            if after is not None:
                after(name)
            if round_index >= warmup:
                times[name].append(elapsed)
            if on_step is not None:
                on_step()
    return times


def round_orders(n: int) -> list[list[int]]:
    """The orders of ``range(n)`` the rounds take in turn: a Williams design, ``n`` orders (``2n`` for odd ``n``) in
    which every index holds every position equally often and directly follows every other index equally often."""
    first, low, high = [0] if n else [], 1, n - 1
    while low <= high:
        first.append(low)
        low += 1
        if low <= high:
            first.append(high)
            high -= 1
    rows = [[(index + shift) % n for index in first] for shift in range(n)] or [[]]
    return rows + [row[::-1] for row in rows] if n % 2 else rows


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (seconds)."""
    return float(statistics.median(values))
