"""The queue engine's verdict for one of our entries, from one listing of its directory.

The Curator recipe itself is the shared engine's (:mod:`aiodlock.backends.queue`); this is
ZooKeeper's side of it: contenders read from node names, ``chained`` semaphores (a permit
granted with a successor touches its node, see :meth:`.Nodes.poke`), and the path a waiter
watches — a node, or the directory's children (docs/zookeeper.md, "Granting and waiting").

Example::

    verdict = evaluate(entry, names, leaving=frozenset())
    verdict.granted or watch_path(entry, verdict)
"""

from __future__ import annotations

from collections.abc import Set

from ..queue import Verdict, evaluate as engine_evaluate
from ._layout import contenders
from ._state import Entry

__all__ = ["Verdict", "evaluate", "watch_path"]


def evaluate(entry: Entry, names: list[str], leaving: Set[str] = frozenset()) -> Verdict[str]:
    """Is ``entry`` granted given the directory's children, and if not, what to watch.

    ``leaving``: nodes of ours whose acquisitions gave up and are being deleted. They will
    never hold the lock, so our other entries queue as if they were gone already, instead of
    waiting a deletion, its watch event and a listing for each (a storm of cancellations
    makes long chains of them).
    """
    assert entry.name is not None
    return engine_evaluate(contenders(names), entry.name, leaving=leaving, chained=True)


def watch_path(entry: Entry, verdict: Verdict[str]) -> str | None:
    """The path a waiter of ``entry`` watches: the node the verdict names, or the directory
    (a children watch) when every contender ahead counts."""
    if verdict.ahead:
        return entry.directory
    if verdict.watch is None:
        return None
    return f"{entry.directory}/{verdict.watch}"
