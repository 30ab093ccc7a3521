"""What hf_ckpt runs in a training step, against transformers' own checkpointing at the same setting.

    PYTHONPATH=. python benchmarks/hot_path.py                         # the bench's default tiny Llama
    PYTHONPATH=. python benchmarks/hot_path.py --settings full --steps 5 --slowdown 0.05

For each hf_ckpt setting and its upstream twin (``full`` and ``upstream:full``, ``every_n:2`` and
``upstream:every_n:2``) it enables the setting once, as a training loop does, and runs ``--steps`` training steps.
For the first step and for the steps after it, it prints:

* the calls of hf_ckpt code per step, by function (from ``cProfile``; hf_ckpt's bench harness, ``hf_ckpt.measure``,
  which runs the step for both settings alike, is left out), and the time they took (``tottime``, their own);
* the hooks on the model's modules (forward pre-hooks, forward hooks) after that step;
* the process CPU time of the later steps, without the profiler (single thread), as a median (steps of one setting
  after the other, not interleaved: ``hf-ckpt bench`` pairs them, this only puts the figures above in scale).

The claim it checks: after the first step (which measures what was recomputed, then removes its probe) an hf_ckpt
setting runs no hf_ckpt code per step but the few hooks it needs (``use_cache`` off in training forwards,
checkpointing off under ``no_grad``, the distributed guard's check that the record and the number of modules are
unchanged: one walk over the modules), independent of the batch.

``--slowdown F`` adds a deliberate busy-wait of F times upstream's step to every hf_ckpt step (a forward pre-hook
on the model that waits while an hf_ckpt setting is on), the demonstration that ``hf-ckpt bench --check`` reports
such a cost as FAIL: with it, the script then runs the bench itself (:func:`hf_ckpt.measure.run_benchmark`, the
pairs interleaved, process CPU time) and prints its timing checks.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from pathlib import Path

import torch

PACKAGE = str(Path(__file__).resolve().parents[1] / "hf_ckpt")
HARNESS = str(Path(PACKAGE) / "measure")


def _hf_ckpt_calls(profile: cProfile.Profile, steps: int) -> tuple[dict[str, float], float]:
    """``{function: calls per step}`` and the seconds per step of hf_ckpt runtime code in ``profile``."""
    stats = pstats.Stats(profile).stats  # {(file, line, name): (primitive calls, calls, tottime, cumtime, callers)}
    calls, seconds = {}, 0.0
    for (filename, line, name), (_, count, tottime, _, _) in stats.items():
        if filename.startswith(PACKAGE) and not filename.startswith(HARNESS):
            calls[f"{Path(filename).relative_to(Path(PACKAGE).parent)}:{line}({name})"] = count / steps
            seconds += tottime
    return calls, seconds / steps


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _slowdown_hook(seconds: float):
    def busy(module: torch.nn.Module, args: object) -> None:
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    return busy


def _profile_setting(model, batch, loss_fn, setting, steps: int) -> dict[str, object]:
    from hf_ckpt.meters.step import training_step

    setting.apply(model)
    try:
        first = cProfile.Profile()
        model.zero_grad(set_to_none=True)
        first.enable()
        training_step(model, batch, loss_fn)
        first.disable()
        first_hooks = _hooks(model)
        later = cProfile.Profile()
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            later.enable()
            training_step(model, batch, loss_fn)
            later.disable()
        later_hooks = _hooks(model)
        times = []
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            start = time.process_time()
            training_step(model, batch, loss_fn)
            times.append(time.process_time() - start)
    finally:
        setting.remove(model)
        model.zero_grad(set_to_none=True)
    return {
        "first": _hf_ckpt_calls(first, 1),
        "later": _hf_ckpt_calls(later, steps),
        "first_hooks": first_hooks,
        "later_hooks": later_hooks,
        "step_s": statistics.median(times),
    }


def _print(name: str, figures: dict[str, object], top: int) -> None:
    first_calls, first_s = figures["first"]
    later_calls, later_s = figures["later"]
    print(f"{name}: step {figures['step_s'] * 1000:.1f} ms (median of the later steps, CPU time, no profiler; not "
          "paired with the other setting's: the bench's figure is)")
    print(f"  first step : {sum(first_calls.values()):7.0f} hf_ckpt calls, {first_s * 1e3:7.3f} ms in hf_ckpt code, "
          f"{figures['first_hooks']} module hooks after it")
    print(f"  later steps: {sum(later_calls.values()):7.0f} hf_ckpt calls, {later_s * 1e3:7.3f} ms in hf_ckpt code, "
          f"{figures['later_hooks']} module hooks, per step")
    for function, count in sorted(later_calls.items(), key=lambda item: -item[1])[:top]:
        print(f"      {count:6.1f}  {function}")


def _verdict(model, batch, loss_fn, pairs, slowdown: float, repeat: int) -> None:
    """Run the bench's own timing and checks (:func:`~hf_ckpt.measure.run_benchmark`, process CPU time) with every
    hf_ckpt step slowed down; print the timing checks as ``hf-ckpt bench`` does."""
    from hf_ckpt.runtime.state import get_state
    from hf_ckpt.measure import report as reporting
    from hf_ckpt.measure import run_benchmark
    from hf_ckpt.meters.step import training_step

    reference = {}  # upstream's step by every_n_layers: the busy-wait is slowdown x the step it is added to
    for ours, theirs in pairs:
        theirs.apply(model)
        times = []
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            start = time.process_time()
            training_step(model, batch, loss_fn)
            times.append(time.process_time() - start)
        theirs.remove(model)
        reference[1 if ours.name == "full" else int(ours.name.split(":")[1])] = statistics.median(times)

    def slow(module: torch.nn.Module, args: object) -> None:
        state = get_state(module)
        if state is not None and module.training and torch.is_grad_enabled():  # an hf_ckpt setting is on
            _slowdown_hook(slowdown * reference[state.config.every_n_layers])(module, args)

    handle = model.register_forward_pre_hook(slow)
    try:
        report = run_benchmark(model, batch, [name for pair in pairs for name in (pair[0].name, pair[1].name)],
                               repeat=repeat, loss_fn=loss_fn, clock="cpu")
    finally:
        handle.remove()
    print(f"hf_ckpt's steps slowed down by {slowdown:.0%}, {repeat} interleaved rounds, as hf-ckpt bench times them:")
    for check in reporting.checks(report):
        if check.interval is not None:
            print(f"{check.label}  {check.name}: {check.measured} (limit {check.limit})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model type or directory (default: the bench's)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--settings", default="full,every_n:2", help="hf_ckpt settings, each next to upstream's")
    parser.add_argument("--steps", type=int, default=5, help="steps after the first (default %(default)s)")
    parser.add_argument("--top", type=int, default=12, help="functions listed per setting (default %(default)s)")
    parser.add_argument("--slowdown", type=float, default=0.0,
                        help="busy-wait this fraction of upstream's step in every hf_ckpt step, then time and judge "
                        "the pairs as the bench does (default: 0, no verdict)")
    parser.add_argument("--repeat", type=int, default=25, help="timed rounds of the verdict (default %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from hf_ckpt.measure.settings import parse_setting
    from hf_ckpt.measure.workload import build_workload

    work = build_workload(args.model, layers=args.layers, hidden=args.hidden)
    model, batch, loss_fn = work.model, work.batch, work.loss_fn
    pairs = [(parse_setting(name), parse_setting(f"upstream:{name}")) for name in args.settings.split(",")]
    print(f"{work.info['class']}, {work.info['layers']} layers, hidden {work.info['hidden']}, "
          f"batch {work.info['batch']} x seq {work.info['seq']}, one thread")
    for ours, theirs in pairs:
        for setting in (theirs, ours):
            _print(setting.name, _profile_setting(model, batch, loss_fn, setting, args.steps), args.top)
    if args.slowdown:
        _verdict(model, batch, loss_fn, pairs, args.slowdown, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
