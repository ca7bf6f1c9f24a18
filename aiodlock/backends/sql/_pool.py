"""The connection pool of one SQL client: sessions that hold nothing, lent one at a time.

A grant pins its connection until the release, so a pinned connection is never lent: the idle
list only ever holds sessions that hold nothing. At ``max_connections`` a checkout waits for
a connection to come back or close (one wakeup per event, up to ``connect_timeout``). A
connection in doubt (an abandoned reply) goes to the janitor to be cleaned, and a session
closed mid-query is ended on the server by it (:mod:`._janitor`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

from .. import BackendError
from ._connection import Connection
from ._dialect import Dialect
from ._life import Life
from ._settings import Settings

__all__ = ["Pool"]

C = TypeVar("C", bound=Connection)

PING_AFTER_IDLE: Final = 2.0
"""Seconds idle after which a pooled connection is checked before use."""


class Pool(Generic[C]):
    """Lock-free connections of one client (see the module docstring).

    Example::

        conn = await pool.checkout()   # idle, or new; waits at max_connections
        pool.checkin(conn)             # back to the idle list (or closed)
    """

    __slots__ = (
        "_dialect",
        "_life",
        "_opening",
        "_room",
        "conns",
        "idle",
        "limits",
        "on_abandoned",
        "on_doubtful",
        "pinned",
    )

    def __init__(
        self,
        dialect: Dialect[C, Any],
        life: Life,
        limits: Settings,
    ) -> None:
        self._dialect = dialect
        self._life = life
        self.limits = limits
        """Its ``max_connections``, ``max_idle`` and ``connect_timeout`` bound the pool."""
        self.conns: set[C] = set()
        self.pinned: set[C] = set()
        """Shared sessions (:mod:`._shared`): closed with the pool, outside its limit."""
        self.idle: collections.deque[C] = collections.deque()
        self._opening = 0
        self._room: collections.deque[asyncio.Future[None]] = collections.deque()
        self.on_doubtful: Callable[[C], None] | None = None
        """Takes a connection in doubt (the janitor cleans it); None: close it."""
        self.on_abandoned: Callable[[int], None] | None = None
        """Takes the server id of a session closed mid-query (the janitor ends it)."""

    @property
    def waiting(self) -> int:
        """Checkouts waiting for a connection at ``max_connections``."""
        return len(self._room)

    async def checkout(self, *, patient: bool = False) -> C:
        """A connection that holds no lock: a recent idle one, or a new one.

        At ``max_connections``, waits (up to ``connect_timeout``; ``patient``: until the
        caller's own deadline cancels it, as a lock's waiter does) for one to come back idle
        or to close.
        """
        deadline: float | None = None
        while True:
            conn = await self._take_idle()
            if conn is not None:
                return conn
            if self._room_left():
                break
            if deadline is None and not patient:
                deadline = asyncio.get_running_loop().time() + self.limits.connect_timeout
            await self._wait_for_room(deadline)
        self._opening += 1
        try:
            conn = await self._dialect.connect()
        except BaseException:
            self._wake_room()
            raise
        finally:
            self._opening -= 1
        self.conns.add(conn)
        return conn

    async def try_checkout(self) -> C | None:
        """:meth:`checkout` without waiting for room: None while every connection is busy
        (for background work that may simply come back later)."""
        conn = await self._take_idle()
        if conn is not None:
            return conn
        if not self._room_left():
            return None
        return await self.checkout()

    async def open_pinned(self) -> C:
        """A new connection for a shared session: the pool closes it with the others, but it
        is never lent, and it does not count against ``max_connections``."""
        conn = await self._dialect.connect()
        if not self._life.open:
            conn.close()
            self._life.require_open()
        self.conns.add(conn)
        self.pinned.add(conn)
        return conn

    def stale(self, conn: C, idle_for: float) -> bool:
        """Whether the server may end ``conn``'s session any moment, idle this long."""
        return self._dialect.stale(conn, idle_for)

    def _room_left(self) -> bool:
        lent = len(self.conns) - len(self.pinned) + self._opening
        return lent < self.limits.max_connections

    async def _take_idle(self) -> C | None:
        dialect = self._dialect
        loop = asyncio.get_running_loop()
        while self.idle:
            conn = self.idle.pop()  # the most recently used: warm, least likely timed out
            idle_for = loop.time() - conn.idle_since
            if conn.closed or dialect.stale(conn, idle_for):
                self.discard(conn)
                continue
            if idle_for > PING_AFTER_IDLE:
                try:
                    await dialect.ping(conn)
                except dialect.driver_errors:
                    self.discard(conn)
                    continue
                except BaseException:
                    self.give_up(conn)
                    raise
            return conn
        return None

    def checkin(self, conn: C) -> None:
        """Keep a lock-free connection for reuse (or close it if there is no room)."""
        if self._dialect.doubtful(conn):
            self.give_up(conn)
            return
        if not self._life.open or conn.closed or self.limits.max_idle == 0:
            self.discard(conn)
            return
        conn.lease_event = None
        conn.idle_since = asyncio.get_running_loop().time()
        self.idle.append(conn)
        while len(self.idle) > self.limits.max_idle:
            self.discard(self.idle.popleft())
        self._wake_room()

    def discard(self, conn: C) -> None:
        """Close ``conn`` for good (the server frees what its session held)."""
        if conn in self.conns:
            self.conns.discard(conn)
            self.pinned.discard(conn)
            with contextlib.suppress(ValueError):
                self.idle.remove(conn)
            session = self._dialect.abandoned_session(conn)
            if session is not None and self.on_abandoned is not None:
                self.on_abandoned(session)
            self._wake_room()
        conn.close()

    def give_up(self, conn: C) -> None:
        """A connection whose state is unknown: the janitor cleans it, or it is closed."""
        doubtful = self._dialect.doubtful(conn)
        if conn.closed or not doubtful or not self._life.open or self.on_doubtful is None:
            self.discard(conn)
            return
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self.on_doubtful(conn)

    def close(self) -> list[C]:
        """The client is closing: every connection, taken out of the pool for closing."""
        conns = list(self.conns)
        self.conns.clear()
        self.pinned.clear()
        self.idle.clear()
        for future in self._room:
            if not future.done():
                future.set_result(None)
        return conns

    async def _wait_for_room(self, deadline: float | None) -> None:
        """Wait until a connection is checked in or closed (one wakeup per event)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room.append(future)
        try:
            async with asyncio.timeout_at(deadline):
                await future
        except TimeoutError:
            limits = self.limits
            raise BackendError(
                f"{self._life.where}: all max_connections={limits.max_connections} "
                f"connections stayed busy for {limits.connect_timeout:g} s"
            ) from None
        except BaseException:
            if future.done() and not future.cancelled():
                self._wake_room()  # pass the wakeup we were given on
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._room.remove(future)
        self._life.require_open()

    def _wake_room(self) -> None:
        while self._room:
            future = self._room.popleft()
            if not future.done():
                future.set_result(None)
                return
