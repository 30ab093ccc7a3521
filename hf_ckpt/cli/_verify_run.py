"""``hf-ckpt verify``, run: enable checkpointing as asked, verify, print the report (the parser is
:mod:`hf_ckpt.cli.verify`)."""

from __future__ import annotations

import argparse

from hf_ckpt.core import enable
from hf_ckpt.verification import verify
from hf_ckpt.cli._workload import build_workload_from, workload_line
from hf_ckpt.cli.errors import CommandError


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
        enable(work.model, every_n_layers=args.every_n_layers, offload=args.offload, **options)
    except (ValueError, TypeError) as error:  # e.g. a model class that does not support checkpointing
        raise CommandError(str(error), exit_code=1) from None
    info = work.info
    print(workload_line(info))
    report = verify(work.model, work.batch, loss_fn=work.loss_fn, rtol=args.rtol, seed=args.seed)
    print(report)
    return 0 if report.ok else 1
