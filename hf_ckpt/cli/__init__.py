"""The ``hf-ckpt`` command: ``hf-ckpt bench``, ``hf-ckpt plan``, ``hf-ckpt verify``.

One module per command (:mod:`hf_ckpt.cli.bench`, :mod:`hf_ckpt.cli.plan`, :mod:`hf_ckpt.cli.verify`), each with
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``, listed once in
:data:`hf_ckpt.cli._main.COMMANDS`. Parsing imports neither torch nor transformers: ``--help`` and argument errors
return at once; a command imports what it needs inside ``run``.

Bad input raises :class:`CommandError` (or argparse rejects it): one line on stderr,
``hf-ckpt <command>: error: <message>``, exit status 2, no traceback.
"""

from hf_ckpt.cli._main import COMMANDS, PROG, build_parser, main
from hf_ckpt.cli.errors import CommandError

__all__ = ["COMMANDS", "CommandError", "PROG", "build_parser", "main"]
