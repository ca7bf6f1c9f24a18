"""An entry leaving the queue: retired from the tables, its node deleted now or soon.

A refused node (another semaphore limit ahead) goes at once; an abandoned wait leaves in
the background, shielded from its caller's cancellation, and while its node is being
deleted our other entries queue as if it were gone already (``ctx.leaving``).

Example::

    task = leaving.abandon(entry)  # None: nothing to delete
"""

from __future__ import annotations

import asyncio
import contextlib

from .. import BackendError
from ..queue import Leases as EngineLeases
from ._cleanup import Cleanup
from ._context import ZKContext
from ._local import LocalMutex
from ._state import Entry, at_server
from ._transport import ZKTransport
from ._watches import Watches

__all__ = ["Leaving"]


class Leaving:
    """Takes entries out of the queue (see the module docstring)."""

    __slots__ = ("_cleanup", "_ctx", "_local", "_watches", "leaves")

    def __init__(
        self, ctx: ZKContext, local: LocalMutex, watches: Watches, cleanup: Cleanup
    ) -> None:
        self._ctx = ctx
        self._local = local
        self._watches = watches
        self._cleanup = cleanup
        self.leaves: set[asyncio.Task[None]] = set()  # nodes being left (settle waits)

    def retire(self, entry: Entry) -> None:
        self._local.unhold(entry)
        entry.gone = True
        entry.held = False
        entry.target = None
        EngineLeases.cancel_reaper(entry)
        self._watches.unwatch_held(entry)
        self._ctx.remove_entry(entry)
        if entry.kept is not None:
            self._watches.disarm(entry.kept)
            entry.kept = None
        self._ctx.doomed.pop(entry.key, None)

    async def refuse(self, entry: Entry, transport: ZKTransport) -> None:
        """Leave the queue at once, under the entry's lock: a refused node (another
        semaphore limit ahead) must not stay behind to hold up the contenders after it."""
        self.retire(entry)
        with contextlib.suppress(BackendError):  # kept for the janitor
            await self._cleanup.remove_nodes(entry, transport, wait=False)

    def abandon(self, entry: Entry) -> asyncio.Task[None] | None:
        """Leave the queue in the background (shielded from the caller's cancellation)."""
        if entry.gone:
            return None
        if entry.abandoning is not None:
            return entry.abandoning
        if self._ctx.state != "open":
            return None
        if not at_server(entry) and not entry.lock.locked():
            self.retire(entry)  # it only waited for its local turn: nothing to delete
            return None
        task = self._ctx.spawn(self._leave(entry), "aiodlock-zk-leave")
        entry.abandoning = task
        self.leaves.add(task)
        task.add_done_callback(self.leaves.discard)
        if entry.name is not None and not entry.held:
            self._note_leaving(entry.directory, entry.name, task)
        return task

    def _note_leaving(self, directory: str, name: str, task: asyncio.Task[None]) -> None:
        """Our node ``name`` is being deleted by ``task`` and will never hold the lock: our
        waiters that watch it move on now (see :func:`_evaluate`)."""
        leaving = self._ctx.leaving.setdefault(directory, set())
        leaving.add(name)

        def done(_: asyncio.Task[None]) -> None:
            leaving.discard(name)
            if not leaving and self._ctx.leaving.get(directory) is leaving:
                del self._ctx.leaving[directory]

        task.add_done_callback(done)
        self._watches.wake_waiters_of(f"{directory}/{name}")

    async def _leave(self, entry: Entry) -> None:
        transport = self._ctx.require_open()
        async with entry.lock:
            if entry.gone and self._ctx.doomed.get(entry.key) is not entry:
                return
            self.retire(entry)
            with contextlib.suppress(BackendError):  # kept for the janitor
                await self._cleanup.remove_nodes(entry, transport, wait=False)

    def drop_if_unwaited(self, entry: Entry) -> None:
        if not entry.gone and not entry.held and entry.key not in self._ctx.waiters:
            self.abandon(entry)
