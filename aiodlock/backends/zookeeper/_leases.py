"""When a held lease ends without a release: ttl passed unrenewed, node deleted, session over.

The queue engine's :class:`~aiodlock.backends.queue.Leases` does the ending (once: loss
signal set, reaper cancelled, counted and logged); this adds ZooKeeper's part: our mutex
holder stops holding here first, and the node of a lease lost in a live session is doomed —
deleted by the janitor when the connection allows.

Example::

    leases.schedule_reaper(entry, ttl)  # lost unless renewed within ttl
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..queue import Leases as EngineLeases
from ._cleanup import Cleanup
from ._context import ZKContext
from ._local import LocalMutex
from ._state import Entry

__all__ = ["Leases"]

logger = logging.getLogger("aiodlock.zookeeper")


class Leases:
    """Ends held leases: the reaper of each one's ttl, and every other way to lose it."""

    __slots__ = ("_cleanup", "_ctx", "_engine", "schedule_reaper", "watch_grace")

    def __init__(self, ctx: ZKContext, local: LocalMutex, cleanup: Cleanup) -> None:
        self._ctx = ctx
        self._cleanup = cleanup
        self._engine: EngineLeases[Entry] = EngineLeases(
            logger, name=_lock_node, on_lost=local.unhold, on_reaped=self._doom
        )
        self.schedule_reaper = self._engine.schedule_reaper
        self.watch_grace = self._engine.watch_grace  # the session guard's grace window

    @property
    def losses(self) -> int:
        return self._engine.losses

    def mark_lost(self, entry: Entry, reason: str, *, doom: bool = True) -> None:
        """The lease is over: renew says False from now on; our node goes when it can
        (``doom``; not when the node is known gone, or went with its session)."""
        if self._engine.mark_lost(entry, reason) and doom:
            self._doom(entry)

    def mark_held_lost(self, entries: Iterable[Entry], reason: str, *, doom: bool) -> None:
        """:meth:`mark_lost` for every held lease of ``entries``."""
        for entry in self._engine.mark_all_lost(entries, reason):
            if doom:
                self._doom(entry)

    def session_ended(self, reason: str) -> None:
        """Every held lease is lost, and every node of ours went with the session."""
        self.mark_held_lost(self._ctx.entries.values(), reason, doom=False)
        self._ctx.doomed.clear()

    def _doom(self, entry: Entry) -> None:
        transport = self._ctx.transport
        if transport is not None and entry.session_id == transport.session_id:
            self._ctx.doomed[entry.key] = entry
            self._cleanup.kick_janitor()


def _lock_node(entry: Entry) -> str:
    return f"lock node {entry.directory}"
