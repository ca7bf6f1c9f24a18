"""The ``inspect`` command: every lock held now, as a table or as JSON.

``python -m aiodlock inspect URL [--namespace NS | --all-namespaces] [PATTERN] [--json]``
lists the locks of one namespace (or of every namespace in use) whose names match the glob
``PATTERN`` (default ``*``), through :meth:`aiodlock.LockClient.inspect`: name, kind, newest
fencing token, waiters (``-`` where the backend cannot tell), each holder's owner id, its
remaining lease (``session`` on session backends) and its client's ``identity`` (``host:pid``
unless the application chose one). The JSON form and the exit statuses: docs/operations.md.

Example::

    $ python -m aiodlock inspect redis://127.0.0.1:6379/0 --namespace shop 'order:*'
    NAME      KIND   TOKEN             WAITERS  HOLDER                    LEASE  IDENTITY
    order:42  mutex  1764000000000123  -        5b0c1f0e9f6d4e1c8a8f9b3d  27.9s  web-1:4242
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final, TextIO

import aiodlock
from aiodlock import LockInfo
from aiodlock.backends import NamespaceLister

from ._operator import EXIT_OK, add_target, open_client, run_reporting

__all__ = ["DESCRIPTION", "HELP", "NAME", "add_arguments", "as_json", "render_table", "run"]

NAME: Final = "inspect"
HELP: Final = "list the locks held now (name, kind, holders, lease, fencing token, waiters)"
DESCRIPTION: Final = (
    "List the locks of one namespace (or of all, --all-namespaces) held now: name, kind, "
    "newest fencing token, waiters (where the backend can tell) and each holder with its "
    "remaining lease and its client's identity (host:pid unless the application set one)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``URL [--namespace NS | --all-namespaces] [PATTERN] [--json]``."""
    add_target(parser)
    parser.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        help="every namespace with locks in use (a NAMESPACE column; 'namespace' in --json)",
    )
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
    if args.all_namespaces and args.namespace is not None:
        parser.error("--all-namespaces and --namespace exclude each other")
    locks = open_client(args, parser)

    async def show(locks: aiodlock.LockClient) -> int:
        if args.all_namespaces:
            found = [
                (ns, infos)
                for ns in await locks.namespaces()
                if (infos := await locks.inspect(args.pattern, namespace=ns))
            ]
        else:
            found = [(locks.namespace, await locks.inspect(args.pattern))]
        if args.json:
            print(json.dumps(as_json(found), indent=2))
        elif args.all_namespaces:
            render_table(found, sys.stdout, pattern=args.pattern, with_namespace=True)
        else:
            render_table(found, sys.stdout, pattern=args.pattern)
            if not found[0][1]:
                await _hint_other_namespaces(locks, sys.stdout)
        return EXIT_OK

    return run_reporting(parser, locks, show)


async def _hint_other_namespaces(locks: aiodlock.LockClient, out: TextIO) -> None:
    """Nothing in this namespace: name the ones in use, as the default namespace 'aiodlock'
    hides an application's locks kept in its own."""
    if not isinstance(locks.backend, NamespaceLister):
        return
    others = [ns for ns in await locks.namespaces() if ns != locks.namespace]
    if others:
        shown = ", ".join(repr(ns) for ns in others[:10]) + (", ..." if len(others) > 10 else "")
        print(f"namespaces in use: {shown} (--namespace NS, or --all-namespaces)", file=out)


def as_json(found: list[tuple[str, list[LockInfo]]]) -> list[dict[str, Any]]:
    """The locks ``found`` per namespace as JSON-ready values (the ``--json`` output)."""
    return [
        {
            "namespace": namespace,
            "name": info.name,
            "kind": info.kind.value,
            "fencing_token": info.fencing_token,
            "waiters": info.waiters,
            "holders": [
                {"owner": h.owner, "expires_in": h.expires_in, "identity": h.identity}
                for h in info.holders
            ],
        }
        for namespace, infos in found
        for info in infos
    ]


def render_table(
    found: list[tuple[str, list[LockInfo]]],
    out: TextIO,
    *,
    pattern: str,
    with_namespace: bool = False,
) -> None:
    """One line per holder, aligned columns; a sentence when nothing is held. The identity
    comes last: it is free text and may hold spaces."""
    if not any(infos for _, infos in found):
        where = "any namespace" if with_namespace else f"namespace {found[0][0]!r}"
        print(f"no locks held in {where} matching {pattern!r}", file=out)
        return
    header = ("NAME", "KIND", "TOKEN", "WAITERS", "HOLDER", "LEASE", "IDENTITY")
    rows = [(("NAMESPACE",) if with_namespace else ()) + header]
    for namespace, infos in found:
        for info in infos:
            token = "-" if info.fencing_token is None else str(info.fencing_token)
            waiters = "-" if info.waiters is None else str(info.waiters)
            lock = (info.name, info.kind.value, token, waiters)
            holders = [
                (
                    holder.owner,
                    "session" if holder.expires_in is None else f"{holder.expires_in:.1f}s",
                    "-" if holder.identity is None else holder.identity,
                )
                for holder in info.holders
            ] or [("-", "-", "-")]
            for i, holder in enumerate(holders):
                first = i == 0
                column: tuple[str, ...] = ((namespace if first else ""),) if with_namespace else ()
                rows.append(column + (lock if first else ("",) * 4) + holder)
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out
        )
