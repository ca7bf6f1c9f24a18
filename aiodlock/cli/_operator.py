"""What the commands that open a client (``inspect``, ``break``, ``run``) share: the URL and
namespace options, the client they open, and how a failure is reported.

Unix conventions: output on stdout, every error on stderr as one line
``PROG: error: MESSAGE`` and never a traceback; exit status 2 for bad usage (a bad URL, an
unknown option, a missing extra), 1 when the service fails or cannot do what was asked.
Messages never show a password (the client's ``describe()`` does not).

Example (a command's ``run``)::

    locks = open_client(args, parser)
    return run_reporting(parser, show(locks, args.pattern))
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Final

import aiodlock

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "add_target", "open_client", "run_reporting"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
"""The service failed, cannot do this (``UnsupportedError``), or there was nothing to do."""
EXIT_USAGE: Final = 2


def add_target(parser: argparse.ArgumentParser) -> None:
    """The ``URL`` argument and ``--namespace``, as every operator command takes them."""
    parser.add_argument(
        "url",
        metavar="URL",
        help="the coordination service, as for aiodlock.connect(): redis://HOST:PORT/DB, "
        "zookeeper://HOST:PORT/CHROOT, mysql://USER:PASSWORD@HOST:PORT/DB, postgresql://...",
    )
    parser.add_argument(
        "--namespace",
        "-n",
        metavar="NS",
        help="the applications' namespace (default: the URL's ?namespace=, else 'aiodlock')",
    )


def open_client(args: argparse.Namespace, parser: argparse.ArgumentParser) -> aiodlock.LockClient:
    """The (not yet opened) client for ``args.url`` and ``args.namespace``.

    ``connect()`` checks the URL and its options and connects nothing, so a bad URL is a usage
    error reported in connect()'s own words (exit status 2).
    """
    options = {} if args.namespace is None else {"namespace": args.namespace}
    try:
        return aiodlock.connect(args.url, **options)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(f"URL: {exc}")


def run_reporting(
    parser: argparse.ArgumentParser,
    locks: aiodlock.LockClient,
    work: Callable[[aiodlock.LockClient], Awaitable[int]],
) -> int:
    """Open ``locks``, run ``work(locks)`` and return its exit status; a service failure or an
    unsupported operation is one line on stderr and exit status 1."""

    async def main() -> int:
        async with locks:
            return await work(locks)

    try:
        return asyncio.run(main())
    except (aiodlock.BackendError, aiodlock.UnsupportedError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
