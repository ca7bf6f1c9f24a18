"""The raw floor: the server commands a lock needs, sent with the same client, no library.

Each one takes the lock only when it is free (the uncontended scenario); it never waits.

- Redis (redis.asyncio, set up as aiodlock sets it up: RESP2, no retries, one connection kept
  by a single-connection client, each command packed by hiredis and written straight to it,
  its reply read from it): ``SET name token NX PX ttl``, then a compare-and-delete script by
  ``EVALSHA``.
- ZooKeeper (aiozk): create an ephemeral sequential node, ``get_children`` of its parent
  (the lock check), delete the node.
- Redis Cluster and Sentinel: the same commands through redis-py's ``execute_command`` (as
  aiodlock sends them there), on ``RedisCluster`` (routed to the key's master) and on the
  master ``Sentinel`` names.
- Redlock (independent masters): the same two commands sent to every master at once, each
  step awaited until a quorum has answered (the stragglers' replies are collected before the
  next cycle): two quorum round trips.
- MySQL (aiomysql): ``SELECT GET_LOCK(name, 0)`` and ``SELECT RELEASE_LOCK(name)`` on one
  connection, through one cursor.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from .base import AsyncAdapter, Endpoint

__all__ = [
    "RawEtcd",
    "RawMySQL",
    "RawPostgres",
    "RawRedis",
    "RawRedisCluster",
    "RawRedisSentinel",
    "RawRedlock",
    "RawZooKeeper",
]

COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class NotFreeError(RuntimeError):
    """The raw floor found the lock taken: it does not wait."""


def redis_client(endpoint: Endpoint) -> Any:
    """A client set up as aiodlock sets one up: RESP2, no retries, one kept connection."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.Redis(
        host=endpoint.host, port=endpoint.port, protocol=2,
        retry=Retry(NoBackoff(), 0), single_connection_client=True,
    )  # fmt: skip


async def execute(client: Any, *command: Any) -> Any:
    """``command`` packed by hiredis, written straight to the client's kept connection, its
    reply read from it (on a Cluster or Sentinel client: through ``execute_command``)."""
    conn = getattr(client, "connection", None)
    if conn is None:
        return await client.execute_command(*command)
    from hiredis import pack_command

    await conn.send_packed_command(pack_command(command), check_health=False)
    return await conn.read_response()


async def mysql_connection(endpoint: Endpoint) -> Any:
    """An aiomysql connection (autocommit) to the endpoint's database."""
    import aiomysql

    e = endpoint
    return await aiomysql.connect(
        host=e.host, port=e.port, user=e.user, password=e.password, db=e.database,
        autocommit=True,
    )  # fmt: skip


async def postgres_connection(endpoint: Endpoint) -> Any:
    """An asyncpg connection to the endpoint's database."""
    import asyncpg

    e = endpoint
    return await asyncpg.connect(
        host=e.host, port=e.port, user=e.user, password=e.password, database=e.database
    )


def postgres_key(name: str) -> int:
    """A 63-bit advisory-lock key for ``name``. The key as aiodlock makes it would cost the
    same: one hash, no round trip."""
    return hash(name) & 0x7FFF_FFFF_FFFF_FFFF


class RawRedis(AsyncAdapter):
    backend = "redis"

    def __init__(self, endpoint: Endpoint, **_: object) -> None:
        super().__init__(endpoint)
        self._redis: Any = None
        self._sha = ""

    async def open(self) -> None:
        self._redis = redis_client(self.endpoint)
        self._sha = await self._redis.script_load(COMPARE_AND_DELETE)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name, max(1, math.ceil(ttl * 1000)))

    @asynccontextmanager
    async def _hold(self, name: str, ms: int) -> AsyncIterator[object]:
        token = secrets.token_hex(12)
        client = self._redis
        if not await execute(client, "SET", name, token, "NX", "PX", ms):
            raise NotFreeError(name)
        try:
            yield token
        finally:
            await execute(client, "EVALSHA", self._sha, 1, name, token)

    def server_key(self, name: str) -> str | None:
        return name


class RawRedisCluster(RawRedis):
    """:class:`RawRedis` through redis-py's ``RedisCluster`` (routed to the key's master),
    from the first seed of a ``redis+cluster://`` URL."""

    backend = "redis-cluster"

    async def open(self) -> None:
        from redis.asyncio.cluster import RedisCluster
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        host, _, port = self.endpoint.url.split("://", 1)[1].split(",")[0].rpartition(":")
        self._redis = RedisCluster(
            host=host, port=int(port), protocol=2, retry=Retry(NoBackoff(), 0)
        )
        self._sha = await self._redis.script_load(COMPARE_AND_DELETE)


class RawRedisSentinel(RawRedis):
    """:class:`RawRedis` on the master that the sentinels of a ``redis+sentinel://`` URL name."""

    backend = "redis-sentinel"

    async def open(self) -> None:
        from redis.asyncio.retry import Retry
        from redis.asyncio.sentinel import Sentinel
        from redis.backoff import NoBackoff

        service = self.endpoint.database.split("/")[0]
        sentinel = Sentinel(self.endpoint.nodes)
        self._redis = sentinel.master_for(service, protocol=2, retry=Retry(NoBackoff(), 0))
        self._sha = await self._redis.script_load(COMPARE_AND_DELETE)


class RawRedlock(AsyncAdapter):
    """``SET NX PX`` on every master of a ``redlock://`` URL at once, done when a quorum has
    said yes; the compare-and-delete likewise."""

    backend = "redlock"

    def __init__(self, endpoint: Endpoint, **_: object) -> None:
        super().__init__(endpoint)
        self._masters: list[Any] = []
        self._sha = ""
        self._stragglers: list[asyncio.Future[Any]] = []

    async def open(self) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._masters = [
            aioredis.Redis(host=host, port=port, protocol=2, retry=Retry(NoBackoff(), 0))
            for host, port in self.endpoint.nodes
        ]
        for master in self._masters:
            self._sha = await master.script_load(COMPARE_AND_DELETE)

    async def close(self) -> None:
        await asyncio.gather(*self._stragglers, return_exceptions=True)
        for master in self._masters:
            await master.aclose()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name, max(1, math.ceil(ttl * 1000)))

    async def _quorum(self, *command: object) -> int:
        """How many of the first quorum of replies were true."""
        futures = [asyncio.ensure_future(m.execute_command(*command)) for m in self._masters]
        need, yes = len(futures) // 2 + 1, 0
        for answered, reply in enumerate(asyncio.as_completed(futures), start=1):
            yes += bool(await reply)
            if answered == need:
                break
        self._stragglers += futures
        return yes

    @asynccontextmanager
    async def _hold(self, name: str, ms: int) -> AsyncIterator[object]:
        # The last cycle's third replies (long in by now), so no task outlives its cycle.
        await asyncio.gather(*self._stragglers)
        self._stragglers.clear()
        token = secrets.token_hex(12)
        if await self._quorum("SET", name, token, "NX", "PX", ms) < len(self._masters) // 2 + 1:
            raise NotFreeError(name)
        try:
            yield token
        finally:
            await self._quorum("EVALSHA", self._sha, 1, name, token)

    def server_key(self, name: str) -> str | None:
        return name


class RawZooKeeper(AsyncAdapter):
    backend = "zookeeper"
    root = "/bench-raw"

    def __init__(self, endpoint: Endpoint, *, session_timeout: float = 10.0) -> None:
        super().__init__(endpoint)
        self._session_timeout = session_timeout
        self._client: Any = None
        self._parents: set[str] = set()

    async def open(self) -> None:
        from aiozk import ZKClient

        self._client = ZKClient(self.endpoint.hosts, session_timeout=self._session_timeout)
        await self._client.start()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name)

    @asynccontextmanager
    async def _hold(self, name: str) -> AsyncIterator[object]:
        parent = f"{self.root}/{name}"
        if parent not in self._parents:  # once per name, outside the measured loop
            await self._client.ensure_path(parent)
            self._parents.add(parent)
        node = await self._client.create(f"{parent}/lock-", ephemeral=True, sequential=True)
        try:
            children = await self._client.get_children(parent)
            if min(children) != node.rpartition("/")[2]:
                raise NotFreeError(name)
            yield node
        finally:
            await self._client.delete(node)


class RawMySQL(AsyncAdapter):
    backend = "mysql"

    def __init__(self, endpoint: Endpoint, **_: object) -> None:
        super().__init__(endpoint)
        self._conn: Any = None
        self._cursor: Any = None

    async def open(self) -> None:
        self._conn = await mysql_connection(self.endpoint)
        self._cursor = await self._conn.cursor()

    async def close(self) -> None:
        if self._conn is not None:
            await self._cursor.close()
            self._conn.close()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name)

    @asynccontextmanager
    async def _hold(self, name: str) -> AsyncIterator[object]:
        await self._cursor.execute("SELECT GET_LOCK(%s, 0)", (name,))
        (got,) = await self._cursor.fetchone()
        if got != 1:
            raise NotFreeError(name)
        try:
            yield name
        finally:
            await self._cursor.execute("SELECT RELEASE_LOCK(%s)", (name,))
            await self._cursor.fetchone()


class RawPostgres(AsyncAdapter):
    backend = "postgres"

    def __init__(self, endpoint: Endpoint, **_: object) -> None:
        super().__init__(endpoint)
        self._conn: Any = None

    async def open(self) -> None:
        self._conn = await postgres_connection(self.endpoint)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name)

    @asynccontextmanager
    async def _hold(self, name: str) -> AsyncIterator[object]:
        key = postgres_key(name)
        if not await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
            raise NotFreeError(name)
        try:
            yield name
        finally:
            await self._conn.fetchval("SELECT pg_advisory_unlock($1)", key)


class RawEtcd(AsyncAdapter):
    """etcd (aetcd's gRPC stubs, as aiodlock uses them): one lease granted at open, then per
    cycle a transaction that puts the key on it if absent and lists the lock's keys, and a
    delete."""

    backend = "etcd"
    root = b"/bench-raw/"

    def __init__(self, endpoint: Endpoint, **_: object) -> None:
        super().__init__(endpoint)
        self._channel: Any = None
        self._kv: Any = None
        self._lease = 0

    async def open(self) -> None:
        import grpc
        from aetcd import rpc

        self._channel = grpc.aio.insecure_channel(self.endpoint.hosts)
        self._kv = rpc.KVStub(self._channel)
        reply = await rpc.LeaseStub(self._channel).LeaseGrant(rpc.LeaseGrantRequest(TTL=60))
        self._lease = reply.ID

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name)

    @asynccontextmanager
    async def _hold(self, name: str) -> AsyncIterator[object]:
        from aetcd import rpc

        directory = self.root + name.encode() + b"/"
        key = directory + secrets.token_hex(8).encode()
        listing = rpc.RequestOp(
            request_range=rpc.RangeRequest(
                key=directory, range_end=directory[:-1] + b"0", sort_order=1, sort_target=2
            )
        )
        reply = await self._kv.Txn(
            rpc.TxnRequest(
                compare=[rpc.Compare(result=0, target=2, key=key, create_revision=0)],
                success=[
                    rpc.RequestOp(request_put=rpc.PutRequest(key=key, lease=self._lease)),
                    listing,
                ],
                failure=[listing],
            )
        )
        try:
            if reply.responses[-1].response_range.kvs[0].key != key:
                raise NotFreeError(name)
            yield key
        finally:
            await self._kv.DeleteRange(rpc.DeleteRangeRequest(key=key))
