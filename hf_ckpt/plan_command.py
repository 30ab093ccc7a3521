"""``hf-ckpt plan``: the cheapest checkpointing plan for a model and a memory budget, printed and saved as JSON.

Builds the workload as ``hf-ckpt bench`` does, runs :func:`hf_ckpt.plan` and prints the plan. ``--json PATH``
writes it where a training script loads it (``hf_ckpt.enable(model, plan="plan.json")``, or
``gradient_checkpointing_kwargs={"plan": "plan.json"}`` with the stock ``Trainer``). Exit status: 0 with a plan,
1 when no plan fits the budget, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os

from .cli import CommandError
from .measure.arguments import add_workload_arguments, build_workload_from


def _budget(text: str) -> float | int:
    """``0.5`` (a fraction of the no-checkpointing activation memory), ``50%``, or bytes: ``2000000``, ``64MiB``."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
    spelled = text.strip().lower()
    try:
        if spelled.endswith("%"):
            return float(spelled[:-1]) / 100
        for unit, size in units.items():
            if spelled.endswith(unit):
                return int(float(spelled[: -len(unit)]) * size)
        return int(spelled) if spelled.isdigit() else float(spelled)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction (0.5), a percentage (50%) or a size in bytes (64MiB, 2000000); got {text!r}"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``hf-ckpt plan``'s options."""
    parser.add_argument(
        "--budget",
        type=_budget,
        required=True,
        help="activation memory to fit: a fraction of what no checkpointing retains (0.5 or 50%%) or a size (64MiB)",
    )
    parser.add_argument(
        "--strategies",
        default="none,selective,full",
        help="strategies the plan may use, comma-separated (default %(default)s)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the plan as JSON to PATH")
    add_workload_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt plan``; returns the exit status."""
    from .planner import plan

    if args.json is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise CommandError(f"--json: the folder of {args.json!r} does not exist")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    work = build_workload_from(args)
    try:
        made = plan(work.model, work.batch, args.budget, strategies=strategies, loss_fn=work.loss_fn)
    except TypeError as error:
        raise CommandError(str(error)) from None
    except ValueError as error:
        message = str(error)
        raise CommandError(message, exit_code=1 if message.startswith("no plan fits") else 2) from None
    info = work.info
    print(
        f"model: {info['class']} ({info['source']}), {info['layers']} layers, hidden {info['hidden']}; "
        f"batch {info['batch']} x seq {info['seq']}, {info['dtype']} on {info['device']}"
    )
    print(made)
    if args.json is not None:
        made.save(args.json)
        print(f"plan written to {args.json}")
    return 0
