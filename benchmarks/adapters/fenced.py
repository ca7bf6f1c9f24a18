"""What a fencing token costs on each server: the fewest commands a lock that hands every grant
a token can send, with no library around them. Beside the raw floor (no token) and the
``asyncio.Lock`` ceiling (no server), these say how much of a gap to either one no fencing lock
can close on this machine.

- :class:`FencedFloor` (uncontended): the raw floor's acquire with the token taken in the same
  round trip, then the raw floor's release. Redis: one script, ``SET NX PX`` and the next token
  (``max(counter + 1, server clock in µs)``: a counter lost with a flush or a restart comes back
  above every token it gave), then compare-and-delete. MySQL: ``INSERT INTO <InnoDB table> ...
  SELECT ... WHERE GET_LOCK(name, 0) = 1 ON DUPLICATE KEY UPDATE token =
  LAST_INSERT_ID(token + 1)`` (a new row starts from the server clock in µs), then
  ``RELEASE_LOCK``. PostgreSQL: ``pg_try_advisory_lock`` and an ``INSERT ... ON CONFLICT DO
  UPDATE SET token = GREATEST(token + 1, clock) RETURNING token`` in one statement, then
  ``pg_advisory_unlock``.
- :class:`FencedLocalLock` (contended, one process): ``asyncio.Lock`` plus one fencing write
  per grant, nothing else. Redis: ``INCR``; MySQL: the same upsert on its own; ZooKeeper:
  ``setData`` of one node (the write's zxid is the token).

Redis commands go as the raw floor sends them (hiredis-packed, on one kept connection);
MySQL through aiomysql, PostgreSQL through asyncpg, ZooKeeper through aiozk, as there.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from .base import AsyncAdapter, Endpoint
from .raw import (
    COMPARE_AND_DELETE,
    NotFreeError,
    execute,
    mysql_connection,
    postgres_connection,
    postgres_key,
    redis_client,
)

__all__ = ["FencedFloor", "FencedLocalLock"]

_TABLE = "bench_fence"

_REDIS_TAKE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token = math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, clock)
redis.call('SET', KEYS[2], string.format('%.0f', token))
return token
"""

_MYSQL_DDL = (
    f"CREATE TABLE IF NOT EXISTS {_TABLE} (lock_key VARCHAR(64) NOT NULL PRIMARY KEY, "
    "token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
)
_MYSQL_SEED = "UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))"
_MYSQL_BUMP = (
    f"INSERT INTO {_TABLE} (lock_key, token) VALUES (%s, LAST_INSERT_ID({_MYSQL_SEED})) "
    "ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)"
)
_MYSQL_TAKE = (
    f"INSERT INTO {_TABLE} (lock_key, token) SELECT %s, LAST_INSERT_ID({_MYSQL_SEED}) "
    "FROM DUAL WHERE GET_LOCK(%s, 0) = 1 ON DUPLICATE KEY UPDATE token = "
    "LAST_INSERT_ID(token + 1)"
)

_PG_CLOCK = "(extract(epoch from clock_timestamp()) * 1000000)::bigint"
_PG_DDL = (
    f"CREATE TABLE IF NOT EXISTS {_TABLE} (lock_key bigint PRIMARY KEY, token bigint NOT NULL)"
)
_PG_TAKE = (
    "WITH got AS MATERIALIZED (SELECT pg_try_advisory_lock($1) AS ok) "
    f"INSERT INTO {_TABLE} AS f (lock_key, token) SELECT $1, {_PG_CLOCK} FROM got WHERE got.ok "
    f"ON CONFLICT (lock_key) DO UPDATE SET token = GREATEST(f.token + 1, {_PG_CLOCK}) "
    "RETURNING f.token"
)


class _Server(ABC):
    """One connection to one server, and the fencing commands on it (a server without a
    measured floor or ceiling leaves that one unimplemented)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def take(self, name: str, ms: int) -> int | None:
        """Take the free lock ``name`` and its token in one round trip (None: taken)."""
        raise NotImplementedError(f"no fenced floor on {type(self).__name__}")

    async def give_back(self, name: str) -> None:
        """Release what :meth:`take` took."""
        raise NotImplementedError(f"no fenced floor on {type(self).__name__}")

    async def bump(self, name: str) -> int:
        """One fencing write: the next token of ``name``."""
        raise NotImplementedError(f"no fenced ceiling on {type(self).__name__}")


class _Redis(_Server):
    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self._redis: Any = None
        self._take_sha = self._release_sha = ""
        self._owner = ""

    async def open(self) -> None:
        self._redis = await redis_client(self._endpoint).initialize()  # its connection, now
        self._take_sha = await self._redis.script_load(_REDIS_TAKE)
        self._release_sha = await self._redis.script_load(COMPARE_AND_DELETE)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    async def take(self, name: str, ms: int) -> int | None:
        self._owner = secrets.token_hex(12)
        token = await execute(
            self._redis, "EVALSHA", self._take_sha, 2, name, f"{name}:fence", self._owner, ms
        )
        return None if token is None else int(token)

    async def give_back(self, name: str) -> None:
        await execute(self._redis, "EVALSHA", self._release_sha, 1, name, self._owner)

    async def bump(self, name: str) -> int:
        return int(await execute(self._redis, "INCR", f"{name}:token"))


class _MySQL(_Server):
    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self._conn: Any = None
        self._cursor: Any = None

    async def open(self) -> None:
        self._conn = await mysql_connection(self._endpoint)
        self._cursor = await self._conn.cursor()
        await self._cursor.execute(_MYSQL_DDL)

    async def close(self) -> None:
        if self._conn is not None:
            await self._cursor.close()
            self._conn.close()

    async def take(self, name: str, ms: int) -> int | None:
        if not await self._cursor.execute(_MYSQL_TAKE, (name, name)):
            return None  # no row written: GET_LOCK said no
        return int(self._cursor.lastrowid)

    async def give_back(self, name: str) -> None:
        await self._cursor.execute("SELECT RELEASE_LOCK(%s)", (name,))
        await self._cursor.fetchone()

    async def bump(self, name: str) -> int:
        await self._cursor.execute(_MYSQL_BUMP, (name,))
        return int(self._cursor.lastrowid)


class _Postgres(_Server):
    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self._conn: Any = None

    async def open(self) -> None:
        self._conn = await postgres_connection(self._endpoint)
        await self._conn.execute(_PG_DDL)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def take(self, name: str, ms: int) -> int | None:
        token = await self._conn.fetchval(_PG_TAKE, postgres_key(name))
        return None if token is None else int(token)

    async def give_back(self, name: str) -> None:
        await self._conn.fetchval("SELECT pg_advisory_unlock($1)", postgres_key(name))


class _ZooKeeper(_Server):
    root = "/bench-fence"

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self._client: Any = None
        self._made: set[str] = set()

    async def open(self) -> None:
        from aiozk import ZKClient

        self._client = ZKClient(self._endpoint.hosts)
        await self._client.start()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def bump(self, name: str) -> int:
        from aiozk import protocol

        path = f"{self.root}/{name}"
        if path not in self._made:  # once per name: the node the writes go to
            await self._client.ensure_path(path)
            self._made.add(path)
        reply = await self._client.send(protocol.SetDataRequest(path=path, data=b"", version=-1))
        return int(reply.stat.last_modified_zxid)


_SERVERS: dict[str, type[_Server]] = {
    "redis": _Redis,
    "mysql": _MySQL,
    "postgres": _Postgres,
    "zookeeper": _ZooKeeper,
}


class _Fenced(AsyncAdapter):
    backend = "any"  # the endpoint's: Redis, MySQL, PostgreSQL or ZooKeeper
    def __init__(self, endpoint: Endpoint, **_: object) -> None:
        super().__init__(endpoint)
        self._server = _SERVERS[endpoint.family](endpoint)

    async def open(self) -> None:
        await self._server.open()

    async def close(self) -> None:
        await self._server.close()


class FencedFloor(_Fenced):
    """The raw floor plus the token, taken in the acquire's own round trip (see the module)."""

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name, max(1, math.ceil(ttl * 1000)))

    @asynccontextmanager
    async def _hold(self, name: str, ms: int) -> AsyncIterator[object]:
        token = await self._server.take(name, ms)
        if token is None:
            raise NotFreeError(name)
        try:
            yield token
        finally:
            await self._server.give_back(name)

    def server_key(self, name: str) -> str | None:
        return name if self.endpoint.family == "redis" else None


class FencedLocalLock(_Fenced):
    """``asyncio.Lock`` plus one fencing write per grant (see the module)."""

    def __init__(self, endpoint: Endpoint, **options: object) -> None:
        super().__init__(endpoint, **options)
        self._locks: dict[str, asyncio.Lock] = {}

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(self._locks.setdefault(name, asyncio.Lock()), name)

    @asynccontextmanager
    async def _hold(self, lock: asyncio.Lock, name: str) -> AsyncIterator[object]:
        async with lock:
            yield await self._server.bump(name)
