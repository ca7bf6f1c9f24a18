"""The command line: ``python -m aiodlock COMMAND``, also installed as the ``aiodlock`` script.

Commands:

``demo``
    The oversell demo: concurrent buyers with and without a lock, on ``memory://`` or on Redis
    (``--url redis://HOST:PORT/DB --processes N``). Exits 0 when the locked run is exact.

Example::

    python -m aiodlock demo
    python -m aiodlock demo --url redis://127.0.0.1:6379/0 --buyers 500 --processes 4
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import __version__, _demo

__all__ = ["build_parser", "main"]


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The ``aiodlock`` argument parser, one subparser per command."""
    parser = argparse.ArgumentParser(
        prog=prog or _prog(),
        description="aiodlock: asyncio-native distributed locks.",
        epilog="Run '%(prog)s COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        title="commands", dest="command", metavar="COMMAND", required=True
    )
    demo = commands.add_parser(
        "demo",
        help="the oversell demo: concurrent buyers without and with a lock",
        description=_demo.DESCRIPTION,
    )
    _demo.add_arguments(demo)
    demo.set_defaults(handler=_demo.run, command_parser=demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the command, return its exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.handler(args, args.command_parser)
    return status


def _prog() -> str:
    # `python -m aiodlock` shows up as "__main__.py" in argv[0]; say what the user typed.
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m aiodlock" if name in ("__main__.py", "") else name


if __name__ == "__main__":
    sys.exit(main())
