"""The ``hf-ckpt`` command: subcommands registered by name.

``hf-ckpt bench`` is built in; later commands (``plan``, ``verify``) register themselves the same way::

    from hf_ckpt.cli import register_command

    register_command("plan", help="...", add_arguments=_add_plan_arguments, run=_run_plan)

A command's ``run(args)`` returns the exit status. Bad input raises :class:`CommandError` (or argparse rejects
it): the user gets one line on stderr, ``hf-ckpt <command>: error: <message>``, and exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, NoReturn, Sequence

PROG = "hf-ckpt"


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status ``exit_code`` (2 for bad arguments)."""

    def __init__(self, message: str, exit_code: int = 2, *, prog: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.prog = prog


@dataclass(frozen=True)
class _Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


_COMMANDS: dict[str, _Command] = {}


def register_command(
    name: str,
    *,
    help: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> None:
    """Add ``hf-ckpt NAME``: ``add_arguments(parser)`` declares its options, ``run(args)`` runs it."""
    _COMMANDS[name] = _Command(help, add_arguments, run)


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, raised instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{message} (see {self.prog} --help)", prog=self.prog)


def _builtin_commands() -> None:
    from .measure.command import add_arguments, run

    if "bench" not in _COMMANDS:
        register_command(
            "bench",
            help="measure the memory, compute and time trade-off of checkpointing strategies",
            add_arguments=add_arguments,
            run=run,
        )
    if "plan" not in _COMMANDS:
        from . import plan_command

        register_command(
            "plan",
            help="the cheapest per-block checkpointing plan that fits an activation-memory budget",
            add_arguments=plan_command.add_arguments,
            run=plan_command.run,
        )
    if "estimate" not in _COMMANDS:
        from .estimate import command as estimate_command

        register_command(
            estimate_command.NAME,
            help=estimate_command.HELP,
            add_arguments=estimate_command.add_arguments,
            run=estimate_command.run,
        )


def build_parser() -> argparse.ArgumentParser:
    """The ``hf-ckpt`` parser with every registered subcommand."""
    _builtin_commands()
    parser = _Parser(prog=PROG, description="Measurable activation checkpointing for Hugging Face Transformers.")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    names = sorted(_COMMANDS, key=lambda name: name != "bench")  # the main command first, then as registered
    for name in names:
        command = _COMMANDS[name]
        sub = subcommands.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(_run=command.run, _prog=sub.prog)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hf-ckpt`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
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


if __name__ == "__main__":
    sys.exit(main())
