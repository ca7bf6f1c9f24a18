"""The ``break`` command: force-release a lock, whoever holds it.

``python -m aiodlock break URL NAME [--namespace NS] [--kind KIND] [--yes]`` drops every
holder of one lock and moves its fencing token on, through
:meth:`aiodlock.LockClient.break_lock`; it asks for confirmation on a terminal unless ``--yes``,
and refuses to run off one without it. What it takes per backend, and the exit statuses (1
also when the lock was not held, as ``pkill`` does): docs/operations.md.

Example::

    $ python -m aiodlock break redis://127.0.0.1:6379/0 order:42 --namespace shop --yes
    broke mutex 'order:42' in namespace 'shop': 1 holder dropped
"""

from __future__ import annotations

import argparse
import sys
from typing import Final

import aiodlock
from aiodlock import Kind

from ._operator import EXIT_FAILED, EXIT_OK, EXIT_USAGE, add_target, open_client, run_reporting

__all__ = ["DESCRIPTION", "HELP", "NAME", "add_arguments", "run"]

NAME: Final = "break"
HELP: Final = "force-release a lock (its holder loses it; the fencing token moves on)"
DESCRIPTION: Final = (
    "Force-release one lock, whoever holds it: every holder is dropped (its guarded code is "
    "cancelled with LockLostError) and the fencing token moves on, so the broken holder's "
    "fenced writes are refused. Asks for confirmation unless --yes is given."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``URL NAME [--namespace NS] [--kind KIND] [--yes]``."""
    add_target(parser)
    parser.add_argument("name", metavar="NAME", help="the lock's name")
    parser.add_argument(
        "--kind",
        choices=[kind.value for kind in Kind],
        default=Kind.MUTEX.value,
        help="mutex (locks.lock, the default), read or write (either breaks the whole "
        "reader/writer lock), semaphore (every permit)",
    )
    parser.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Confirm, break, report; return the exit status."""
    locks = open_client(args, parser)
    what = f"{args.kind} {args.name!r} in namespace {locks.namespace!r}"
    if not args.yes:
        if not sys.stdin.isatty():
            print(
                f"{parser.prog}: error: refusing to break {what} without --yes "
                "(stdin is not a terminal to confirm on)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        try:
            # The question goes to stderr, as every message does: stdout is the result.
            print(
                f"Break {what} on {locks.backend.describe()}? Its holders lose it. [y/N] ",
                end="",
                file=sys.stderr,
                flush=True,
            )
            answer = sys.stdin.readline()
        except KeyboardInterrupt:  # Ctrl-C at the question: no, without a traceback
            print(file=sys.stderr)
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print(f"{parser.prog}: not broken", file=sys.stderr)
            return EXIT_FAILED

    async def do_break(locks: aiodlock.LockClient) -> int:
        dropped = await locks.break_lock(args.name, kind=args.kind)
        if dropped == 0:
            print(f"{parser.prog}: {what} was not held: nothing to break", file=sys.stderr)
            return EXIT_FAILED
        plural = "holder" if dropped == 1 else "holders"
        print(f"broke {what}: {dropped} {plural} dropped")
        return EXIT_OK

    return run_reporting(parser, locks, do_break)
