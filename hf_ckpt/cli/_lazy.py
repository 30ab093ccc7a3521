"""How the commands' parsers name the code that imports torch: by dotted path, loaded when it runs.

``hf-ckpt --help`` and argument errors must not import torch or transformers (seconds), so a command's parser
module (``NAME``, ``HELP``, ``add_arguments``) names its runner and its heavy argument converters as
``"module:function"`` strings: :func:`runner` and :func:`converter` load them when the command runs or the option
is given. This is the CLI's one late binding; nothing else in it imports inside a function.
"""

from __future__ import annotations

import argparse
from importlib import import_module
from typing import Any, Callable


def load(path: str) -> Any:
    """The object at ``"package.module:name"`` (``name`` may be dotted: ``Class.method``), its module imported now."""
    module, _, name = path.partition(":")
    value = import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def runner(path: str) -> Callable[[argparse.Namespace], int]:
    """A command's ``run(args) -> int`` that loads the function at ``path`` when called."""

    def run(args: argparse.Namespace) -> int:
        return int(load(path)(args))

    run.__doc__ = f"Run the command ({path}); returns the exit status."
    return run


def converter(path: str) -> Callable[[str], Any]:
    """An argparse ``type`` that loads the function at ``path`` when the option is given, and turns its
    ``ValueError`` into a one-line argument error."""

    def convert(text: str) -> Any:
        try:
            return load(path)(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = path.rpartition(":")[2]
    return convert
