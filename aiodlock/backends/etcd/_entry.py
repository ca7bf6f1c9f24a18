"""The etcd backend's state per acquisition: its entry, its waiter's wakeup, its line.

An :class:`Entry` is one owner's contender in one lock family: its key, the session (lease)
of its ttl, the transaction that may be creating it, our copy of the directory (the listing
minus the deletions our watches saw since), and the lease state the queue engine keeps
(:class:`Holding`).

Example::

    entry = Entry(directory, owner, spec, session)   # key, lease, listing: with the first try
"""

from __future__ import annotations

import asyncio

from .. import BankedWakeup, LockSpec
from ..queue import Contender, Holding, Verdict
from ._keys import value
from ._session import EtcdSession

__all__ = ["Entry", "EtcdWaiter", "Line"]


class EtcdWaiter(BankedWakeup):
    """A waiting acquisition's wakeup: banked, armed on at most one watch at a time."""

    __slots__ = ("armed", "task")

    def __init__(self) -> None:
        super().__init__()
        self.armed: tuple[bytes, int] | None = None  # (watched key, from revision)
        self.task: asyncio.Task[None] | None = None

    async def wait(self, timeout: float | None) -> None:
        await self._consume(timeout)


class Line:
    """The transactions of one client for one directory, one at a time."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class Entry(Holding):
    """One acquisition (owner) of one lock family: its key and lease state."""

    __slots__ = (
        "deleted",
        "directory",
        "error",
        "inflight",
        "key",
        "kind",
        "lease_id",
        "limit",
        "listed",
        "lock",
        "owner",
        "queue",
        "revision",
        "sent",
        "session",
        "since",
        "stale",
        "token",
        "value",
        "verdict",
    )

    def __init__(self, directory: bytes, owner: str, spec: LockSpec, session: EtcdSession) -> None:
        super().__init__()
        self.directory, self.owner = directory, owner
        self.session = session  # the lease of our ttl: our key lives on it
        self.kind, self.limit, self.value = spec.kind, spec.limit, value(spec)
        self.key = b""
        self.lease_id = 0
        self.inflight: asyncio.Task[None] | None = None  # our transaction, until seen to end
        self.sent = False  # a transaction that may have created our key was sent
        self.listed = False  # the last transaction of this entry came back with a listing
        # Our copy of the directory: its listing at ``revision``, minus the keys our watches
        # (all started at revision + 1) saw deleted since. ``stale``: list again.
        self.stale = True
        self.deleted: set[bytes] = set()
        self.since = 0  # a directory watch starts here
        self.error: BaseException | None = None
        self.queue: list[Contender[bytes]] = []
        self.revision = 0  # the listing's revision
        self.token = 0
        self.lock = asyncio.Lock()
        self.verdict: Verdict[bytes] | None = None

    @property
    def table_key(self) -> tuple[bytes, str]:
        """Where the backend's table keeps it."""
        return (self.directory, self.owner)
