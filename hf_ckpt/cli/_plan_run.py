"""``hf-ckpt plan``, run: profile (or estimate) and print the plan, save it when asked (the parser is
:mod:`hf_ckpt.cli.plan`)."""

from __future__ import annotations

import argparse

from hf_ckpt.runtime.units import precision_label
from hf_ckpt.planning.planner import plan
from hf_ckpt.cli._workload import build_workload_from, workload_line
from hf_ckpt.cli.errors import CommandError
from hf_ckpt.cli.plan import PLAN_STRATEGIES


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt plan``; returns the exit status."""
    if args.config is not None:
        return _run_from_config(args)
    work = build_workload_from(args)
    try:
        made = plan(work.model, work.batch, args.budget, strategies=args.strategies, loss_fn=work.loss_fn)
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
        made = plan(args.config, batch_size=args.batch, seq_len=args.seq, budget=args.budget,
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
