"""The ``hf-ckpt`` parser and entry point, with the list of its commands."""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import NoReturn, Sequence

from hf_ckpt.cli.errors import CommandError

PROG = "hf-ckpt"

#: Every ``hf-ckpt`` command, in the order ``--help`` lists them: the module that defines its ``NAME``, ``HELP``,
#: ``add_arguments(parser)`` and ``run(args) -> int``. Adding a command is adding its module here. Modules are
#: imported when the parser is built; each keeps torch and transformers out of its top-level imports.
COMMANDS: tuple[str, ...] = (
    "hf_ckpt.cli.bench",
    "hf_ckpt.cli.plan",
    "hf_ckpt.cli.verify",
    "hf_ckpt.cli.estimate",
)


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, raised instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{message} (see {self.prog} --help)", prog=self.prog)


def _command_modules(names: Sequence[str]) -> list[ModuleType]:
    modules = [importlib.import_module(name) for name in names]
    for module in modules:
        missing = [attr for attr in ("NAME", "HELP", "add_arguments", "run") if not hasattr(module, attr)]
        if missing:
            raise TypeError(f"hf-ckpt command module {module.__name__} lacks {', '.join(missing)}")
    return modules


def build_parser(commands: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    """The ``hf-ckpt`` parser with one subcommand per module in ``commands``."""
    parser = _Parser(prog=PROG, description="Measurable activation checkpointing for Hugging Face Transformers.")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in _command_modules(commands):
        sub = subcommands.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run, _prog=sub.prog)
    return parser


def main(argv: Sequence[str] | None = None, *, commands: Sequence[str] = COMMANDS) -> int:
    """Run ``hf-ckpt`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    Args:
        argv: The arguments after the program name.
        commands: The command modules to offer (default :data:`COMMANDS`; tests pass their own).
    """
    parser = build_parser(commands)
    prog = PROG
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        if getattr(args, "_run", None) is None:
            parser.print_help(sys.stderr)
            return 2
        prog = args._prog
        return int(args._run(args))
    except CommandError as error:
        print(f"{error.prog or prog}: error: {error}", file=sys.stderr)
        return error.exit_code
    except SystemExit as stop:  # --help, --version
        return stop.code if isinstance(stop.code, int) else 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
