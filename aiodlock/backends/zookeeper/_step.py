"""One attempt to acquire: our node's place in the queue, told with as few requests as can be.

An attempt lists the directory only when no watch can tell our place (``known_place``):
a waiter whose watch is set and has not fired still waits, and one that watched the head
and saw it deleted is the head now. While a task of ours holds a turn-taking mutex, the
next one is refused without a node (``refused_here``).

Example::

    result = await step.check(entry, spec, ttl, transport)  # Grant or Busy
"""

from __future__ import annotations

import asyncio

from .. import Busy, Grant, Kind, LimitMismatchError, LockSpec
from ._context import ZKContext
from ._handover import Handover
from ._leases import Leases
from ._leaving import Leaving
from ._local import LocalMutex
from ._nodes import Nodes
from ._recipe import evaluate, watch_path
from ._state import Entry, ZKWaiter, at_server, turn_taking_mutex
from ._transport import ZKTransport
from ._watches import Watches

__all__ = ["Parts", "QueueStep"]

Parts = tuple[Nodes, Watches, LocalMutex, Leases, Leaving, Handover]
"""The parts of the backend an attempt uses."""


class QueueStep:
    """Decides one attempt of an entry of ours (see the module docstring)."""

    __slots__ = ("_ctx", "_handover", "_leases", "_leaving", "_local", "_nodes", "_watches")

    def __init__(self, ctx: ZKContext, parts: Parts) -> None:
        self._ctx = ctx
        self._nodes, self._watches, self._local, self._leases, self._leaving, self._handover = parts

    async def check(
        self, entry: Entry, spec: LockSpec, ttl: float, transport: ZKTransport
    ) -> Grant | Busy:
        """One attempt of ``entry`` (under its lock): Grant, or Busy with its watch armed if
        a waiter is there."""
        if entry.held:
            if entry.lost is None:
                return Grant(entry.czxid)
            return Busy(None)
        if self._refused_here(entry):
            return Busy(None)
        known = self._known_place(entry, transport)
        if known is None and await self._rewatch(entry, transport):
            known = self._known_place(entry, transport)
        if known is not None:
            return self._grant(entry, ttl) if known else self._busy(entry)
        names = await self._nodes.enqueue(entry, transport)
        while entry.session_id != transport.session_id:
            # The session changed while the listing was on its way: queue again.
            names = await self._nodes.enqueue(entry, transport)
        verdict = evaluate(entry, names, self._ctx.leaving.get(entry.directory, set()))
        if verdict.conflict is not None:
            await self._leaving.refuse(entry, transport)
            raise LimitMismatchError(spec.name, verdict.conflict, spec.limit)
        if verdict.granted:
            if verdict.successor and entry.kind is Kind.SEMAPHORE:
                grant = self._grant(entry, ttl)
                await self._nodes.poke(entry, transport)
                return grant
            return self._grant(entry, ttl)
        entry.target = watch_path(entry, verdict)
        entry.target_children = verdict.ahead
        entry.behind_head = verdict.behind_head
        waiter = self._ctx.waiters.get(entry.key)
        if waiter is not None:
            await self._watches.arm(waiter, entry, transport)
        return self._busy(entry)

    def _busy(self, entry: Entry) -> Busy:
        """Refuse ``entry``, which queues on: its node stays only if a waiter claims it."""
        if entry.key not in self._ctx.waiters:
            # Lock.try_acquire() will not wait: unless waiter() is entered right away
            # (the core does so in the same step), our queue node must not stay.
            asyncio.get_running_loop().call_soon(self._leaving.drop_if_unwaited, entry)
        return Busy(None)

    def _grant(self, entry: Entry, ttl: float) -> Grant:
        entry.held = True
        entry.target = None
        self._local.hold(entry)
        self._leases.schedule_reaper(entry, ttl)
        self._handover.granted(entry)
        self._watches.guard_held(entry)  # a deletion by anyone is told at once
        return Grant(entry.czxid)

    def _refused_here(self, entry: Entry) -> bool:
        """Refuse ``entry`` without a node while another acquisition of ours holds its mutex.

        The server would queue the node behind our holder's, and the create, the listing and
        the watch would all be answered during the holder's critical section: under the
        default event loop each reply wakes the loop, which rounds the rest of a ``sleep`` up
        to a whole millisecond. Refused here, the waiter is woken when our holder releases
        (or loses the lock), and its create follows the holder's delete on the same session,
        so the server applies the two in that order. Nodes of other clients created meanwhile
        are ahead of it, in their arrival order.
        """
        if not turn_taking_mutex(entry) or at_server(entry):
            return False
        if not self._local.held(entry.directory):
            return False
        if entry.key in self._ctx.waiters:
            self._local.refuse(entry.key)
        else:  # Lock.try_acquire() will not wait: nothing of it may stay (see try_acquire)
            asyncio.get_running_loop().call_soon(self._leaving.drop_if_unwaited, entry)
        return True

    def _known_place(self, entry: Entry, transport: ZKTransport) -> bool | None:
        """Our place in the queue when no listing can tell more, else None (list it).

        False: the watch on the node we wait for is set and has not fired — the server
        confirmed that node exists after our last listing, and any change since would have
        fired the watch (the core's re-check after arming asks exactly this). True: that node
        was the head, only it was ahead of us, and the server told us it was deleted — a node
        created later gets a higher sequence than ours, so we are the head now. The watch may
        be one a cancelled turn armed, which came with its node (see Handover.keep): the first
        attempt of the task that took it over then asks nothing either.

        Not for semaphores: a waiter's place there also moves when nodes ahead of the one it
        watches leave (the first waiter's permit, handed on by a touch that may have come
        before the watch was set), so it lists.
        """
        waiter = self._placed(entry, transport)
        if waiter is None:
            return None
        target = entry.target
        if waiter.armed == target and waiter.confirmed == target:
            return False
        if entry.behind_head and waiter.deleted == target:
            waiter.deleted = None
            return True
        return None

    def _placed(self, entry: Entry, transport: ZKTransport) -> ZKWaiter | None:
        """The wakeup of an entry whose last listing still tells its place if its watch
        says nothing moved (see _known_place), else None."""
        waiter = self._ctx.waiters.get(entry.key) or entry.kept
        if (
            entry.kind is Kind.SEMAPHORE
            or waiter is None
            or entry.target is None
            or entry.name is None
            or entry.creating is not None
            or entry.uncertain
            or entry.stray_session is not None
            or entry.session_id != transport.session_id
        ):
            return None
        return waiter

    async def _rewatch(self, entry: Entry, transport: ZKTransport) -> bool:
        """Finish arming the watch on the node we wait for (a cancelled turn's request, still
        on its way), or arm it again if it fired for a change of its data only (a holder that
        took its node over naming itself, see Handover.retag_later): nobody left the queue, so
        our place is what the watch finds, without a listing. True if it did either."""
        waiter = self._placed(entry, transport)
        if waiter is None:
            return False
        target = entry.target
        pending = waiter.armed == target and waiter.arming is not None
        touched = waiter.armed is None and waiter.touched == target
        if not (pending or touched):
            return False
        await self._watches.arm(waiter, entry, transport)
        return True
