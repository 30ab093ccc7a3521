"""The one exception a command raises for a user error: :class:`CommandError`."""

from __future__ import annotations


class CommandError(Exception):
    """A user-facing error: printed as one line, ``hf-ckpt <command>: error: <message>``, exit status ``exit_code``.

    Args:
        message: What is wrong, naming the argument or the file.
        exit_code: The exit status (2 for bad arguments, the default; 1 when the input was fine but the answer is
            "no", e.g. no plan fits the budget).
        prog: The program name to print (default: the running command's).
    """

    def __init__(self, message: str, exit_code: int = 2, *, prog: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.prog = prog
