"""The seam between the Redis backend and the server(s) it reaches: :class:`ConnectionSource`.

A source owns everything about *reaching* Redis (settings, the client and its pool, side
connections, time limits, error translation) and nothing about locks; another topology is
another source (:mod:`._node`, :mod:`._sentinel`, :mod:`._cluster`). See docs/redis.md.

Example::

    source = NodeSource(parse_url("redis://localhost:6379/0"), {})
    await source.open(tasks, scripts.load_all)
    with source.errors("release"):
        done = await source.call(scripts.run, scripts.MUTEX_RELEASE, keys, owner, "p")
    await source.aclose()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar, TypeVarTuple

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import AbstractConnection

    from .. import Tasks

__all__ = ["ConnectionSource", "Prepare", "disconnect_quietly"]

_log = logging.getLogger("aiodlock.redis")

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

Prepare: TypeAlias = Callable[["aioredis.Redis"], Awaitable[None]]
"""Work :meth:`ConnectionSource.open` does on a fresh client before declaring it open."""


class ConnectionSource(Protocol):
    """How a Redis backend reaches its server: commands, side connections, limits, errors.

    Messages and ``describe()`` never show the password. Every method raising an error about
    the server raises :class:`~aiodlock.BackendError`.
    """

    @property
    def connect_timeout(self) -> float:
        """Seconds allowed for connecting a connection (and for :meth:`open` as a whole)."""
        ...

    @property
    def request_timeout(self) -> float:
        """Seconds allowed for one command (enforced by :meth:`call`)."""
        ...

    @property
    def client(self) -> aioredis.Redis:
        """The command client while open; ``BackendError`` before :meth:`open` and once closed.

        Prefer :meth:`call`, which also waits for a free connection and bounds the command.
        """
        ...

    async def open(self, tasks: Tasks, prepare: Prepare | None = None) -> None:
        """Connect, check that the server answers, then run ``prepare(client)``.

        All of it within ``connect_timeout``; on any failure nothing is left open, and a
        driver error becomes ``BackendError``. A source is opened once (``RuntimeError``).
        Commands that outlive their callers (:meth:`submit`) run in tasks of ``tasks``.
        """
        ...

    async def aclose(self) -> None:
        """Refuse new commands, let those in flight finish (bounded), close the pool.

        Idempotent. Side connections handed out by :meth:`new_connection` are their
        holders' to close.
        """
        ...

    async def call(self, fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]], *args: *_Ts) -> _T:
        """``await fn(client, *args)``: one command (or a NOSCRIPT reload and its retry).

        Waits for a free command connection, then cuts ``fn`` off after ``request_timeout``
        with ``TimeoutError``. Raises ``BackendError`` if the source is not open. Driver
        errors pass through untranslated: the caller names the action (:meth:`errors`). If
        the caller is cancelled once ``fn`` has started, ``fn`` may still run to its end.
        """
        ...

    async def call_first(
        self, fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]], *args: *_Ts
    ) -> _T:
        """:meth:`call`, but served before every :meth:`call` still waiting for a connection.

        For the commands that let other clients go on: releases, renewals, and the attempts
        of a waiter that already holds a place in a fair queue.
        """
        ...

    def submit(
        self,
        fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]],
        *args: *_Ts,
        first: bool = False,
    ) -> asyncio.Future[_T]:
        """:meth:`call` (``first``: :meth:`call_first`) that returns the future of its outcome
        at once, and whose command, once started, runs to its end however the caller fares.

        Cancelling the future before the command starts withdraws it (nothing is sent);
        whoever drops the future must still look at its outcome. For a command that must be
        queued in this very loop step (a cancelled fair waiter leaving its queue), and for an
        attempt whose reply must be read even if its caller gives up, so that a release sent
        after it cannot overtake it on another connection.
        """
        ...

    def scan_iter(self, match: str) -> AsyncIterator[bytes]:
        """Every key matching the glob ``match`` (``SCAN ... MATCH``), on every server that
        holds keys (each primary of a cluster); a key may be reported more than once.

        Each page is one bounded command; driver errors become ``BackendError`` (action
        ``"inspect"``). For operators: it walks the whole keyspace, never use it on a hot path.
        """
        ...

    def errors(self, action: str) -> AbstractContextManager[None]:
        """A reusable ``with`` block turning driver errors into ``BackendError``.

        The message names ``action`` (``"acquire"``, ``"wakeup"``...) and :meth:`describe`.
        """
        ...

    def route(self, key: bytes) -> str:
        """Which server holds ``key`` now, as a name for :meth:`new_connection` (``""`` where
        one server holds every key). Side connections made for one route serve every key of
        that route; after a failover or a slot move a key may have another route."""
        ...

    def new_connection(self, purpose: str, route: str = "") -> AbstractConnection:
        """A new, not yet connected connection outside the pool, for blocking or pub/sub use,
        to the server named by ``route`` (:meth:`route`).

        Its client name is ``aiodlock:<purpose>``. The caller connects it (within
        ``connect_timeout``) and closes it (:func:`disconnect_quietly`).
        """
        ...

    def describe(self) -> str:
        """The server(s), without the password, for messages and ``repr()``."""
        ...


async def disconnect_quietly(conn: AbstractConnection) -> None:
    """Close a side connection that is being dropped anyway, ignoring how it fails."""
    try:
        await conn.disconnect(nowait=True)
    except Exception:  # closing a broken socket may fail in many ways
        _log.debug("error while closing a redis connection", exc_info=True)
