"""The ``hf-ckpt`` command: ``hf-ckpt bench``, ``hf-ckpt plan``, ``hf-ckpt verify``, ``hf-ckpt estimate``.

One module per command (:mod:`hf_ckpt.cli.bench`, :mod:`hf_ckpt.cli.plan`, :mod:`hf_ckpt.cli.verify`,
:mod:`hf_ckpt.cli.estimate`), each with ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``,
listed once in :data:`hf_ckpt.cli._main.COMMANDS`; the workload options three of them share, and the workload they
describe, are :mod:`hf_ckpt.cli.arguments`. Parsing imports neither torch nor transformers: ``--help`` and argument
errors return at once. A command imports the lab's packages (``hf_ckpt``, :mod:`hf_ckpt.measure`,
:mod:`hf_ckpt.estimation`) at its top; they load a module only when ``run`` (or an option that needs torch, such as
``--device``, when given) first uses it.

Bad input raises :class:`CommandError` (or argparse rejects it): one line on stderr,
``hf-ckpt <command>: error: <message>``, exit status 2, no traceback.
"""

from hf_ckpt.cli._main import COMMANDS, PROG, build_parser, main
from hf_ckpt.cli.errors import CommandError

__all__ = ["COMMANDS", "CommandError", "PROG", "build_parser", "main"]
