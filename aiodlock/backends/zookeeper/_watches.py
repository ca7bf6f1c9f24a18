"""The server watches our waiters and holders are registered on, and what their events mean.

Watches use ``getData`` (none is left behind when the node is already gone); a waiter is
armed on at most one; events are one-shot, and forgotten on every reconnection, when every
waiter re-checks. A held node is watched from :data:`GUARD_DELAY` after its grant on (and
re-armed after a reconnection or a change of its data): its deletion by anyone — a break, an
operator — loses its lease at once (docs/zookeeper.md, "Granting and waiting").

Example::

    await watches.arm(waiter, entry, transport)  # on entry.target, chosen by its last check
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from .. import BackendError
from ._context import ZKContext
from ._errors import ConnectionLoss, NoNodeError, NotConnected
from ._leases import Leases
from ._recipe import evaluate, watch_path
from ._session import EVENT_DELETED
from ._state import Entry, ZKWaiter
from ._transport import ZKTransport

__all__ = ["GUARD_DELAY", "Watches"]

logger = logging.getLogger("aiodlock.zookeeper")

GUARD_DELAY: Final = 0.05
"""A held node's watch is armed this long after its grant. A hold shorter than that (the
common short critical section) costs no request for it; a node deleted earlier is found at
arming time (the ``getData`` answers NoNode), so the holder is told within this delay plus a
round trip either way."""


class Watches:
    """Per watched path, the waiters and held entries registered on its watch."""

    __slots__ = ("_ctx", "_leases", "_registered")

    def __init__(self, ctx: ZKContext, leases: Leases) -> None:
        self._ctx = ctx
        self._leases = leases
        self._registered: dict[str, set[ZKWaiter | Entry]] = {}

    def __len__(self) -> int:
        """How many registrations there are (statistics: ``watches``)."""
        return sum(len(items) for items in self._registered.values())

    def clear(self) -> None:
        self._registered.clear()

    def watch_held(self, entry: Entry) -> None:
        """Register held ``entry`` on its own node's watch (its renewal arms it)."""
        if not entry.watching:
            self._registered.setdefault(entry.path, set()).add(entry)
            entry.watching = True

    def guard_held(self, entry: Entry, delay: float = GUARD_DELAY) -> None:
        """Arm the watch on held ``entry``'s own node in ``delay`` seconds, unless released
        by then (see :data:`GUARD_DELAY`), or armed already."""
        if entry.guard is None and not entry.watching and entry.holding:
            loop = asyncio.get_running_loop()
            entry.guard = loop.call_later(delay, self._guard_now, entry)

    def _guard_now(self, entry: Entry) -> None:
        entry.guard = None
        transport = self._ctx.transport
        if entry.watching or not entry.holding or self._ctx.state != "open" or transport is None:
            return
        if not transport.connected:
            return  # the reconnection re-arms every held node's watch (reset_watches)
        self.watch_held(entry)
        self._ctx.spawn(self._arm_held(entry, transport), "aiodlock-zk-guard")

    async def _arm_held(self, entry: Entry, transport: ZKTransport) -> None:
        """Set the data watch on our held node; a node already gone, or not ours, is lost."""
        try:
            _, stat = await transport.get(
                entry.path, watch=True, wait=False, timeout=self._ctx.request_timeout
            )
        except NoNodeError:
            if entry.holding:
                self._leases.mark_lost(entry, "its lock node was deleted", doom=False)
            self.unwatch_held(entry)
            return
        except BackendError as exc:  # the connection dropped: its reconnection re-arms
            logger.debug("could not watch %s: %s", entry.directory, exc)
            self.unwatch_held(entry)
            return
        if not entry.holding:
            self.unwatch_held(entry)
        elif stat.ephemeral_owner != entry.session_id:
            self._leases.mark_lost(entry, "its lock node belongs to another session", doom=False)
            self.unwatch_held(entry)

    def wake_waiters_of(self, path: str) -> None:
        """Disarm and wake the waiters watching ``path`` (a node of ours being left)."""
        for item in list(self._registered.get(path, ())):
            if isinstance(item, ZKWaiter):
                self.disarm(item)
                item.wake()

    async def arm(self, waiter: ZKWaiter, entry: Entry, transport: ZKTransport) -> None:
        """Register ``waiter`` on the watch ``entry``'s last check chose, then arm it.

        The request runs in a task of ours, as a create does: a caller cancelled while it is
        on its way leaves the watch arming, and the task that takes the node over (see _keep)
        waits for the same reply instead of asking again — under load, when a reply takes
        longer than an attempt lives, asking again would never get one.
        """
        target = entry.target
        if target is None:
            return
        if waiter.armed != target:
            self.disarm(waiter)
            self._registered.setdefault(target, set()).add(waiter)
            waiter.armed = target
            waiter.confirmed = waiter.deleted = waiter.touched = waiter.arm_error = None
            watch = self._set_watch(waiter, entry, target, transport)
            waiter.arming = self._ctx.spawn(watch, "aiodlock-zk-watch")
        task = waiter.arming
        if task is None:
            return  # armed before
        if not task.done():
            await asyncio.wait((task,))  # a cancelled caller leaves the request running
        if waiter.arming is task:
            waiter.arming = None
            error, waiter.arm_error = waiter.arm_error, None
            if error is not None:
                raise error

    async def _set_watch(
        self, waiter: ZKWaiter, entry: Entry, target: str, transport: ZKTransport
    ) -> None:
        """The request of :meth:`_arm`: what it finds goes to ``waiter`` (if it still arms
        that watch with this request)."""
        me = asyncio.current_task()
        try:
            if entry.target_children:
                names = await transport.children(
                    target, watch=True, timeout=self._ctx.request_timeout
                )
                if waiter.arming is me and self.moved(entry, names, target):
                    waiter.wake()  # changed since the check: check again at once
            else:
                await transport.get(target, watch=True, timeout=self._ctx.request_timeout)
                if waiter.arming is me and waiter.armed == target:  # (not fired meanwhile)
                    waiter.confirmed = target
        except NoNodeError:
            if waiter.arming is me:
                self.disarm(waiter)
                if not entry.target_children:
                    # Gone since our listing, as if its watch had fired (see _known_place).
                    waiter.deleted = target
                waiter.wake()  # already gone: that is the wakeup
        except (ConnectionLoss, NotConnected):
            # The connection dropped under the watch: check again, which waits for the
            # reconnection (the watch would not have survived it anyway).
            if waiter.arming is me:
                self.disarm(waiter)
                waiter.wake()
        except BackendError as exc:
            if waiter.arming is me:
                self.disarm(waiter)
                waiter.arm_error = exc

    def moved(self, entry: Entry, names: list[str], target: str) -> bool:
        """Whether a listing shows ``entry`` somewhere its last check did not leave it."""
        if entry.name not in names:
            return True
        verdict = evaluate(entry, names, self._ctx.leaving.get(entry.directory, set()))
        moved = verdict.granted or verdict.conflict is not None
        return moved or watch_path(entry, verdict) != target

    def disarm(self, waiter: ZKWaiter) -> None:
        target, waiter.armed = waiter.armed, None
        if target is not None:
            registered = self._registered.get(target)
            if registered is not None:
                registered.discard(waiter)
                if not registered:
                    del self._registered[target]

    def unwatch_held(self, entry: Entry) -> None:
        if entry.guard is not None:
            entry.guard.cancel()
            entry.guard = None
        if entry.watching and entry.name is not None:
            registered = self._registered.get(entry.path)
            if registered is not None:
                registered.discard(entry)
                if not registered:
                    del self._registered[entry.path]
        entry.watching = False

    def on_event(self, event_type: int, path: str) -> None:
        """A node watch fired: server watches are one-shot, so every registration goes."""
        registered = self._registered.pop(path, None)
        if not registered:
            return
        for item in registered:
            if isinstance(item, Entry):
                item.watching = False
                if event_type == EVENT_DELETED and item.held and item.lost is None:
                    self._leases.mark_lost(item, "its lock node was deleted", doom=False)
                else:  # its data changed (a holder naming itself): watch it again
                    self.guard_held(item, 0.0)
            else:
                item.armed = None
                if event_type == EVENT_DELETED:
                    item.deleted = path
                else:
                    item.touched = path
                item.wake()

    def reset_watches(self) -> None:
        """Server watches did not survive the connection: forget them, re-check everyone,
        and watch every held node again."""
        for registered in self._registered.values():
            for item in registered:
                if isinstance(item, Entry):
                    item.watching = False
                else:
                    item.armed = None
        self._registered.clear()
        for waiter in self._ctx.waiters.values():
            waiter.wake()
        for entry in self._ctx.entries.values():
            if entry.holding:
                self.guard_held(entry, 0.0)
