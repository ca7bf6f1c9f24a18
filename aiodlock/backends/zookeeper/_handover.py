"""The local handover of a cancelled turn: its queue node passes to the next task of ours.

While our tasks take turns for a lock (the core's TurnObserver: ``turns_began`` and
``turns_ended``), a turn cancelled while its node queues keeps the node, its place and its
armed watch for the next task, which takes them over in its first attempt; the node is
deleted once no task of ours wants the lock. A node taken over later names its holder in
its data (``retag``). docs/zookeeper.md, "Queueing: local turns and fair", has the costs and
guarantees.

Example::

    entry = handover.take_kept(directory, owner, spec) or Entry(directory, owner, spec)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from .. import BackendError, Kind, LockSpec
from ._context import ZKContext
from ._errors import NoNodeError
from ._leaving import Leaving
from ._state import Entry, ZKWaiter, at_server
from ._watches import Watches

__all__ = ["Handover"]

_RETAG_DELAY: Final = 0.1
"""A node taken over names its holder once held this long (see Handover.retag_later)."""


class Handover:
    """Per directory our tasks take turns for: the entry a cancelled turn kept."""

    __slots__ = ("_ctx", "_leaving", "_turning", "_watches", "handed", "kept")

    def __init__(self, ctx: ZKContext, watches: Watches, leaving: Leaving) -> None:
        self._ctx = ctx
        self._watches = watches
        self._leaving = leaving
        self._turning: set[str] = set()
        self.kept: dict[str, Entry] = {}
        self.handed = 0  # how often a task took a kept node over

    def turns_began(self, spec: LockSpec) -> None:
        """The core's TurnObserver: our tasks take turns for ``spec``'s lock from now on,
        so a cancelled turn may keep its node for the next one (see :meth:`_keep`)."""
        self._turning.add(self._ctx.directory(spec))

    def turns_ended(self, spec: LockSpec) -> None:
        """No task of ours wants ``spec``'s lock any more: a node kept for the next turn goes
        (in the background: an attempt made meanwhile queues as if it were gone already)."""
        directory = self._ctx.directory(spec)
        self._turning.discard(directory)
        kept = self.kept.pop(directory, None)
        if kept is not None:
            self._drop_kept(kept)

    def keep(self, entry: Entry) -> bool:
        """Keep the node of a cancelled, queued turn for the next task of ours; True if kept.

        The next task to take its turn (the core hands it on at once) takes the entry over in
        its first :meth:`try_acquire`, with its node, its place in the queue and its armed
        wakeup (see :meth:`_keep_waiter`): a cancellation then costs no request, where
        deleting the node and queueing a new one behind everybody else cost three round
        trips and the place — under a storm of cancelled attempts, nearly every grant.

        Safe because nothing changes at the server: a node handed on is, to ZooKeeper, one
        contender that waits longer; a node is never granted twice (only one never granted
        is kept), so its czxid stays a valid fencing token (see the module docstring). Kept
        only while our tasks take turns for the lock, and only if no other entry of ours
        queues in the directory: the next entry we make takes it over, so no entry of ours
        ever waits behind a kept node that nobody will take; when the turns end it is deleted.
        """
        directory = entry.directory
        if (
            self._ctx.state != "open"
            or directory not in self._turning
            or directory in self.kept
            or not entry.list_on_create  # a fair waiter keeps its own place in arrival order
            or entry.kind is Kind.READ
            or entry.held
            or entry.gone
            or entry.lost is not None
            or entry.abandoning is not None
            or not at_server(entry)
            or self._ctx.entries.get(entry.key) is not entry
            or any(
                self._queues_beside(entry, other)
                for other in self._ctx.entries.values()
                if other.directory == directory
            )
        ):
            return False
        self._ctx.remove_entry(entry)
        self.kept[directory] = entry
        return True

    @staticmethod
    def _queues_beside(entry: Entry, other: Entry) -> bool:
        """Whether ``other``, an entry of ours in ``entry``'s directory, waits in its queue."""
        return other is not entry and not other.held and other.abandoning is None

    def keep_waiter(self, waiter: ZKWaiter, key: tuple[str, str]) -> None:
        """``waiter`` leaves: if its node was kept, the wakeup goes with it, still armed on the
        node waited for (what it banks meanwhile is kept too); else it is disarmed."""
        kept = self.kept.get(key[0])
        if kept is not None and kept.owner == key[1] and kept.kept is None:
            kept.kept = waiter
        else:
            self._watches.disarm(waiter)

    def take_kept(self, directory: str, owner: str, spec: LockSpec) -> Entry | None:
        """The entry a cancelled turn kept in ``directory``, now ``owner``'s; None if none
        fits (a fair lock or a reader queues on its own; another limit drops it)."""
        kept = self.kept.get(directory)
        if kept is None or spec.fair or kept.kind is not spec.kind:
            return None  # (a reader queues behind a kept writer, which the next turn takes)
        del self.kept[directory]
        if kept.limit != spec.limit:
            self._drop_kept(kept)  # ahead of ours, it would refuse our limit
            return None
        kept.owner = owner
        self.handed += 1
        return kept

    def _drop_kept(self, entry: Entry) -> None:
        """Delete a kept node nobody takes over, in the background (see _abandon)."""
        if entry.kept is not None:
            self._watches.disarm(entry.kept)
            entry.kept = None
        self._leaving.abandon(entry)

    def retag_later(self, entry: Entry) -> None:
        """Name the holder in its node's data if it still holds (see :meth:`_retag`)."""
        if self._ctx.state == "open" and entry.holding and entry.tagged != entry.owner:
            self._ctx.spawn(self._retag(entry), "aiodlock-zk-retag")

    async def _retag(self, entry: Entry) -> None:
        """A node taken over names its first owner in its data: name the holder's, for
        operators (``inspect``). In the background, and only once the holder has held for
        ``_RETAG_DELAY``: the grant waits for nothing, and the touch (a request, and a
        wakeup and a request of the successor watching the node) is saved on the short
        holds of a storm of cancelled turns — where it cost a third of the throughput."""
        if entry.tagged == entry.owner or not entry.holding:
            return
        entry.tagged = entry.owner
        with contextlib.suppress(NoNodeError, BackendError):  # released, or lost: no one asks
            transport = self._ctx.require_open()
            await transport.set(
                entry.path, self._ctx.data_of(entry), timeout=self._ctx.request_timeout
            )

    def granted(self, entry: Entry) -> None:
        """``entry`` was granted: a wakeup it kept has nothing to wake, and a node taken over
        names its holder once it has held for ``_RETAG_DELAY``."""
        if entry.kept is not None:  # granted before its next waiter came
            self._watches.disarm(entry.kept)
            entry.kept = None
        if entry.tagged != entry.owner:
            asyncio.get_running_loop().call_later(_RETAG_DELAY, self.retag_later, entry)
