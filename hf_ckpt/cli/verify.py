"""``hf-ckpt verify``: :func:`hf_ckpt.verify` from the command line, on the same models as ``hf-ckpt bench``.

Builds the model and batch as ``hf-ckpt bench`` does (the embedded tiny Llama by default, a transformers model
type built tiny, or a local directory), enables checkpointing with the options given, runs the verification and
prints the report. Exit status: 0 when the report is ok, 1 when it is not, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
from typing import Any

import hf_ckpt
from hf_ckpt.cli.arguments import (
    add_workload_arguments, build_workload_from, converter, non_negative_float, positive_int, workload_line,
)
from hf_ckpt.cli.errors import CommandError

NAME = "verify"
HELP = "check that checkpointing keeps gradients exact and recomputes the blocks it should"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``hf-ckpt verify``'s options."""
    model = parser.add_argument_group("model and batch (as for hf-ckpt bench)")
    add_workload_arguments(model, seed_help="seed of the weights, the batch and both steps")

    setting = parser.add_argument_group("checkpointing setting to verify (as hf_ckpt.enable takes it)")
    setting.add_argument(
        "--every-n-layers", type=positive_int, default=1, help="recompute blocks 0, n, 2n, ... (default %(default)s)"
    )
    setting.add_argument(
        "--use-reentrant", action=argparse.BooleanOptionalAction, default=False, help="reentrant checkpointing (default: off)"
    )
    setting.add_argument(
        "--preserve-rng-state",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay the forward's random numbers in the recompute (default: on; --no-preserve-rng-state shows "
        "what verify reports when dropout is not replayed)",
    )
    setting.add_argument("--offload", action="store_true", help="keep the saved inputs in pinned host memory")
    setting.add_argument(
        "--plan",
        metavar="PATH",
        type=plan_file,
        default=None,
        help="verify this plan (JSON from hf-ckpt plan --json or CheckpointPlan.save) instead of --every-n-layers; "
        "make it on the same --model and sizes",
    )
    parser.add_argument(
        "--rtol",
        type=non_negative_float,
        default=None,
        help="accepted gradient difference relative to the group's largest gradient (default 1e-3, 2e-2 for fp16/bf16)",
    )



def plan_file(text: str) -> Any:
    """``--plan``: the :class:`~hf_ckpt.CheckpointPlan` saved at the path."""
    return converter(hf_ckpt.CheckpointPlan.load)(text)  # torch loads when the option is given, not for --help


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt verify``; returns 0 when the report is ok, 1 otherwise."""
    if args.plan is not None and args.every_n_layers != 1:
        raise CommandError("give --plan or --every-n-layers, not both: a plan already chooses every block's strategy")
    work = build_workload_from(args)
    options = {"use_reentrant": args.use_reentrant}
    if args.plan is not None:
        options["plan"] = args.plan
    if not args.preserve_rng_state:
        options["preserve_rng_state"] = False
    try:
        hf_ckpt.enable(work.model, every_n_layers=args.every_n_layers, offload=args.offload, **options)
    except (ValueError, TypeError) as error:  # e.g. a model class that does not support checkpointing
        raise CommandError(str(error), exit_code=1) from None
    info = work.info
    print(workload_line(info))
    report = hf_ckpt.verify(work.model, work.batch, loss_fn=work.loss_fn, rtol=args.rtol, seed=args.seed)
    print(report)
    return 0 if report.ok else 1
