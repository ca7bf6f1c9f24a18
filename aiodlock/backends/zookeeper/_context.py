"""What every part of the ZooKeeper backend shares: settings, session, tasks and tables.

One :class:`ZKContext` per backend. The parts (queue nodes, watches, leases, the session
guard, the handover of a cancelled turn) each own their own state and reach the shared
tables — entries by ``(directory, owner)``, their waiters, the doomed and leaving nodes —
and the transport through it.

Example::

    transport = ctx.require_open()
    ctx.spawn(cleanup(), "aiodlock-zk-janitor")
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Final

from .. import BackendError, LockSpec, Tasks
from ._layout import lock_directory, node_data
from ._settings import Settings
from ._state import Entry, ZKWaiter
from ._transport import ZKTransport

__all__ = ["GRACE_FRACTION", "ZKContext"]

GRACE_FRACTION: Final = 0.5
"""suspended_grace, by default: this fraction of the granted session timeout."""
_MIN_PING_TIMEOUT: Final = 0.05  # the shortest heartbeat


class ZKContext:
    """The backend's shared state (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.state = "new"  # opening, open, closing, closed
        self.transport: ZKTransport | None = None
        self.tasks: Tasks | None = None  # the client's share, from open()
        self.own: set[asyncio.Task[None]] = set()  # of them, ours: not the transport's
        self.grace = settings.session_ttl * GRACE_FRACTION  # see SessionGuard.new_session
        self.entries: dict[tuple[str, str], Entry] = {}
        self.waiters: dict[tuple[str, str], ZKWaiter] = {}
        self.doomed: dict[tuple[str, str], Entry] = {}  # nodes to delete when we can
        self.leaving: dict[str, set[str]] = {}  # per directory: our nodes being deleted (unheld)

    def describe(self) -> str:
        """The URL without credentials."""
        return self.settings.url.redacted()

    @property
    def request_timeout(self) -> float:
        return self.settings.request_timeout

    @property
    def heartbeat(self) -> float:
        """How often the session is pinged; also how long a renewal may take."""
        return max(self.grace / 3, _MIN_PING_TIMEOUT)

    def require_open(self) -> ZKTransport:
        if self.state != "open" or self.transport is None:
            raise BackendError(f"{self.describe()} backend is not open")
        return self.transport

    def directory(self, spec: LockSpec) -> str:
        return lock_directory(self.settings.root, spec.namespace, spec.name, spec.kind)

    def data_of(self, entry: Entry) -> bytes:
        """A contender node's data: who made it, for operators (``inspect`` reads the owner
        and the client's identity). Written by the create itself: no request of its own."""
        return node_data(entry.owner, self.settings.identity)

    def remove_entry(self, entry: Entry) -> None:
        """Take ``entry`` out of the table (nothing if it is not there)."""
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run a task of the backend's own (cancelled first when it closes)."""
        task = self.spawn_io(coro, name)
        self.own.add(task)
        task.add_done_callback(self.own.discard)
        return task

    def spawn_io(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run a task of the transport's (repair and read loops: cancelled last)."""
        tasks = self.tasks
        if tasks is None or tasks.closed:
            coro.close()
            raise BackendError(f"{self.describe()} backend is closed")
        return tasks.spawn(coro, name)
