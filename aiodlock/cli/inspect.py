"""The ``inspect`` command: every lock held now, as a table or as JSON.

``python -m aiodlock inspect URL [--namespace NS] [PATTERN] [--json]`` lists the locks of one
namespace whose names match the glob ``PATTERN`` (default ``*``): name, kind, fencing token
(the newest handed out), waiters where the backend can tell (``-`` where it cannot), and each
holder with its remaining lease (``session`` for a lease that lives as long as its holder's
session: ZooKeeper, MySQL, PostgreSQL). It uses :meth:`aiodlock.LockClient.inspect`, like any
application could.

Example::

    $ python -m aiodlock inspect redis://127.0.0.1:6379/0 --namespace shop 'order:*'
    NAME      KIND   TOKEN             WAITERS  HOLDER                    LEASE
    order:42  mutex  1764000000000123  -        5b0c1f0e9f6d4e1c8a8f9b3d  27.9s

With ``--json``: a list of ``{"name", "kind", "fencing_token", "waiters", "holders":
[{"owner", "expires_in"}]}`` (``expires_in`` in seconds, ``null`` for a session lease).
Exit status 0 (also when nothing is held), 1 when the service fails, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final, TextIO

import aiodlock
from aiodlock.backends import LockInfo

from ._operator import EXIT_OK, add_target, open_client, run_reporting

__all__ = ["DESCRIPTION", "HELP", "NAME", "add_arguments", "as_json", "render_table", "run"]

NAME: Final = "inspect"
HELP: Final = "list the locks held now (name, kind, holders, lease, fencing token, waiters)"
DESCRIPTION: Final = (
    "List the locks of one namespace held now: name, kind, newest fencing token, waiters "
    "(where the backend can tell) and each holder with its remaining lease."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``URL [--namespace NS] [PATTERN] [--json]``."""
    add_target(parser)
    parser.add_argument(
        "pattern",
        metavar="PATTERN",
        nargs="?",
        default="*",
        help="a glob over lock names: *, ?, [...] (default: every lock)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Inspect, print, return the exit status."""
    locks = open_client(args, parser)

    async def show(locks: aiodlock.LockClient) -> int:
        infos = await locks.inspect(args.pattern)
        if args.json:
            print(json.dumps(as_json(infos), indent=2))
        else:
            render_table(infos, sys.stdout, namespace=locks.namespace, pattern=args.pattern)
        return EXIT_OK

    return run_reporting(parser, locks, show)


def as_json(infos: list[LockInfo]) -> list[dict[str, Any]]:
    """``infos`` as JSON-ready values (the ``--json`` output)."""
    return [
        {
            "name": info.name,
            "kind": info.kind.value,
            "fencing_token": info.fencing_token,
            "waiters": info.waiters,
            "holders": [{"owner": h.owner, "expires_in": h.expires_in} for h in info.holders],
        }
        for info in infos
    ]


def render_table(infos: list[LockInfo], out: TextIO, *, namespace: str, pattern: str) -> None:
    """One line per holder, aligned columns; a sentence when nothing is held."""
    if not infos:
        print(f"no locks held in namespace {namespace!r} matching {pattern!r}", file=out)
        return
    rows = [("NAME", "KIND", "TOKEN", "WAITERS", "HOLDER", "LEASE")]
    for info in infos:
        token = "-" if info.fencing_token is None else str(info.fencing_token)
        waiters = "-" if info.waiters is None else str(info.waiters)
        for i, holder in enumerate(info.holders or ()):
            lease = "session" if holder.expires_in is None else f"{holder.expires_in:.1f}s"
            first = i == 0
            rows.append(
                (
                    info.name if first else "",
                    info.kind.value if first else "",
                    token if first else "",
                    waiters if first else "",
                    holder.owner,
                    lease,
                )
            )
        if not info.holders:
            rows.append((info.name, info.kind.value, token, waiters, "-", "-"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out
        )
