"""``hf-ckpt plan``: the cheapest checkpointing plan for a model and a memory budget, printed and saved as JSON.

Builds the workload as ``hf-ckpt bench`` does, runs :func:`hf_ckpt.plan` and prints the plan. ``--json PATH``
writes it where a training script loads it (``hf_ckpt.enable(model, plan="plan.json")``, or
``gradient_checkpointing_kwargs={"plan": "plan.json"}`` with the stock ``Trainer``). Exit status: 0 with a plan,
1 when no plan fits the budget, 2 for bad arguments (all checked before the model is built).
"""

from __future__ import annotations

import argparse
import os

import hf_ckpt
from hf_ckpt.runtime.util.units import BUDGET_FORMS, parse_budget, precision_label
from hf_ckpt.cli.arguments import add_workload_arguments, build_workload_from, output_file, workload_line
from hf_ckpt.cli.errors import CommandError
from hf_ckpt.strategies import ALL_STRATEGIES, FINER_CHOICES

NAME = "plan"
HELP = "the cheapest per-block checkpointing plan that fits an activation-memory budget"

#: The per-block strategies a plan may assign (``hf_ckpt.plan``'s ``strategies``; a test keeps them equal).
PLAN_STRATEGIES = ALL_STRATEGIES
#: The finer options ``hf_ckpt.plan`` also takes when asked: op-level policies, graph partitions, and the cheap
#: modules between the blocks recomputed (:data:`hf_ckpt.strategies.FINER_CHOICES`).
FINER_STRATEGIES = FINER_CHOICES


def budget(text: str) -> float | int:
    """``--budget``: :func:`hf_ckpt.runtime.util.units.parse_budget` on the text (``0.5``, ``50%``, ``40GiB``)."""
    try:
        return parse_budget(text)
    except ValueError as error:
        message = str(error)
        if _number(text) > 1:  # someone who meant bytes
            message += f"; a bare number is a fraction, bytes need a unit: {text.strip()}B, 512MiB, 40GiB"
        raise argparse.ArgumentTypeError(message) from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def plan_strategies(text: str) -> list[str]:
    """``--strategies``: a non-empty comma-separated subset of :data:`PLAN_STRATEGIES` and
    :data:`FINER_STRATEGIES`, each at most once."""
    accepted = (*PLAN_STRATEGIES, *FINER_STRATEGIES)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in accepted]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(accepted)}; got {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a strategy is given more than once in {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``hf-ckpt plan``'s options."""
    parser.add_argument(
        "--budget",
        type=budget,
        required=True,
        help=f"activation memory to fit: {BUDGET_FORMS}; fractions are of what no checkpointing retains".replace(
            "%", "%%"
        ),
    )
    parser.add_argument(
        "--strategies",
        type=plan_strategies,
        default=list(PLAN_STRATEGIES),
        help=f"strategies the plan may use, comma-separated (default {','.join(PLAN_STRATEGIES)}); add "
        f"{', '.join(FINER_STRATEGIES)} for op-level policies, graph partitions per block and the cheap modules "
        "between the blocks recomputed (docs/guides/budget.md)",
    )
    parser.add_argument("--json", metavar="PATH", type=output_file, help="also write the plan as JSON to PATH")
    parser.add_argument(
        "--config",
        metavar="CONFIG",
        type=config_path,
        help="plan from shapes alone for this config.json (or a folder holding one), with --batch and --seq: "
        "nothing is allocated, so the model need not fit this machine (see hf-ckpt estimate); --device "
        "defaults to cuda then",
    )
    add_workload_arguments(parser)


def config_path(text: str) -> str:
    """``--config``: an existing config.json, or a folder holding one."""
    path = os.path.join(text, "config.json") if os.path.isdir(text) else text
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"no config.json at {text!r}")
    return path



def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt plan``; returns the exit status."""
    if args.config is not None:
        return _run_from_config(args)
    work = build_workload_from(args)
    try:
        made = hf_ckpt.plan(work.model, work.batch, args.budget, strategies=args.strategies, loss_fn=work.loss_fn)
    except ValueError as error:  # the arguments were checked while parsing: what is left is "no plan fits"
        raise CommandError(str(error), exit_code=1) from None
    info = work.info
    print(workload_line(info))
    print(made)
    if args.json is not None:
        made.save(args.json)
        print(f"plan written to {args.json}")
    return 0


def _run_from_config(args: argparse.Namespace) -> int:
    """``--config``: the plan from the estimate of ``args.config`` at ``--batch`` x ``--seq``."""
    if args.model is not None:
        raise CommandError("give --model (profile a real step) or --config (plan from shapes), not both")
    if args.strategies != list(PLAN_STRATEGIES):
        raise CommandError(
            f"--strategies cannot be combined with --config: a plan from shapes chooses among "
            f"{', '.join(PLAN_STRATEGIES)}; leave --strategies out, or profile a real step with --model"
        )
    device = "cuda" if args.device is None else str(args.device).split(":")[0]
    try:
        made = hf_ckpt.plan(args.config, batch_size=args.batch, seq_len=args.seq, budget=args.budget,
                    dtype=args.dtype, autocast=args.autocast, device=device)
    except ValueError as error:
        raise CommandError(str(error), exit_code=1) from None
    print(f"config: {args.config}; batch {args.batch} x seq {args.seq}, {precision_label(args.dtype, args.autocast)} "
          f"on {device} (estimated)")
    print(made)
    if args.json is not None:
        made.save(args.json)
        print(f"plan written to {args.json}")
    return 0
