"""The command line: ``python -m aiodlock COMMAND``, also installed as the ``aiodlock`` script.

This package owns the argument parser and :data:`COMMANDS`. Each command is one module of it
(see :class:`Command`), an application of aiodlock's public API like any other; adding a
command is adding its module to :data:`COMMANDS`. The commands — ``demo`` (the oversell demo),
``inspect``, ``break`` and ``run`` (a program run while holding a lock) — their output and exit
statuses: docs/operations.md. Errors go to stderr as one line, never a traceback.

Example::

    python -m aiodlock demo
    python -m aiodlock demo --url redis://127.0.0.1:6379/0 --buyers 500 --processes 4
    python -m aiodlock inspect redis://127.0.0.1:6379/0 --namespace shop 'order:*'
    python -m aiodlock break redis://127.0.0.1:6379/0 order:42 --namespace shop --yes
    python -m aiodlock run redis://127.0.0.1:6379/0 nightly --timeout 0 -- ./job.sh
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Final, Protocol

import aiodlock

from . import breaking, demo, inspect, running

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


class Command(Protocol):
    """What a command module defines, at module level."""

    @property
    def NAME(self) -> str:
        """The command word: ``python -m aiodlock NAME``."""
        ...

    @property
    def HELP(self) -> str:
        """One line for the list of commands in ``--help``."""
        ...

    @property
    def DESCRIPTION(self) -> str:
        """The text above the command's own options in ``NAME --help``."""
        ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the command's options to its subparser."""
        ...

    def run(self, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
        """Run the command for the parsed ``args``; return the exit status.

        ``parser`` is the command's subparser, for ``parser.error()`` (exit status 2).
        """
        ...


COMMANDS: Final[tuple[Command, ...]] = (demo, inspect, breaking, running)
"""The commands, in the order ``--help`` lists them: one module each."""


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The ``aiodlock`` argument parser, one subparser per command."""
    parser = argparse.ArgumentParser(
        prog=prog or _prog(),
        description="aiodlock: asyncio-native distributed locks.",
        epilog="Run '%(prog)s COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {aiodlock.__version__}")
    commands = parser.add_subparsers(
        title="commands",
        dest="command",
        metavar="COMMAND",
        required=True,
        parser_class=_IntermixedParser,
    )
    for command in COMMANDS:
        subparser = commands.add_parser(
            command.NAME, help=command.HELP, description=command.DESCRIPTION
        )
        command.add_arguments(subparser)
        subparser.set_defaults(handler=command.run, command_parser=subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the command, return its exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.handler(args, args.command_parser)
    return status


class _IntermixedParser(argparse.ArgumentParser):
    """A command's parser: options and positionals in any order (``inspect URL -n NS PATTERN``).

    Plain argparse stops filling positionals at the first option, so an optional positional
    after an option would be "unrecognized"; ``parse_known_intermixed_args`` (which itself calls
    ``parse_known_args``, hence the guard) takes them in any order.
    """

    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _prog() -> str:
    # `python -m aiodlock` shows up as "__main__.py" in argv[0]; say what the user typed.
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m aiodlock" if name in ("__main__.py", "") else name
