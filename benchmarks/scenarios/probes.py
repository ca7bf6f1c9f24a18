"""Looking at the servers from the side: connection counts and a Redis key's expiry time."""

from __future__ import annotations

import socket
import time
from typing import Any

from ..adapters.base import Endpoint

__all__ = ["ConnectionCounter", "key_expiry", "zookeeper_word"]


def zookeeper_word(host: str, port: int, word: str, *, timeout: float = 2.0) -> str:
    """A ZooKeeper four-letter word's whole answer ("" if none came)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


class ConnectionCounter:
    """Client connections the server has now, its own probe connection included.

    Redis: ``INFO clients`` connected_clients; ZooKeeper: ``mntr`` zk_num_alive_connections;
    MySQL: ``Threads_connected``; PostgreSQL: client backends in ``pg_stat_activity``. Where
    one server cannot tell (a Redis Cluster, Sentinel or Redlock's masters, a ZooKeeper
    ensemble, etcd, which has no such counter): the TCP connections this process has open,
    which is the same thing here, since the scenario's clients all live in this process.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._client: Any = None
        self._own = endpoint.backend not in ("redis", "zookeeper", "mysql", "postgres")

    async def open(self) -> None:
        e = self.endpoint
        if self._own:
            return
        if e.backend == "redis":
            import redis.asyncio as aioredis

            self._client = aioredis.Redis(host=e.host, port=e.port)
        elif e.backend == "mysql":
            import aiomysql

            self._client = await aiomysql.connect(
                host=e.host, port=e.port, user=e.user, password=e.password, db=e.database,
                autocommit=True,
            )  # fmt: skip
        elif e.backend == "postgres":
            import asyncpg

            self._client = await asyncpg.connect(
                host=e.host, port=e.port, user=e.user, password=e.password, database=e.database
            )

    async def count(self) -> int:
        e = self.endpoint
        if self._own:
            import psutil  # type: ignore[import-untyped]  # no stubs in the dev environment

            established = psutil.Process().net_connections(kind="tcp")
            return sum(1 for c in established if c.status == psutil.CONN_ESTABLISHED)
        if e.backend == "redis":
            info = await self._client.info("clients")
            return int(info["connected_clients"])
        if e.backend == "mysql":
            async with self._client.cursor() as cursor:
                await cursor.execute("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
                row = await cursor.fetchone()
            return int(row[1])
        if e.backend == "postgres":
            return int(
                await self._client.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                )
            )
        if e.backend == "zookeeper":
            for line in zookeeper_word(e.host, e.port, "mntr").splitlines():
                key, _, value = line.partition("\t")
                if key == "zk_num_alive_connections":
                    return int(value)
            raise RuntimeError("ZooKeeper's mntr did not report zk_num_alive_connections")
        return 0

    async def close(self) -> None:
        if self._client is None:
            return
        if self.endpoint.backend == "redis":
            await self._client.aclose()
        elif self.endpoint.backend == "postgres":
            await self._client.close()
        else:
            self._client.close()


async def key_expiry(endpoint: Endpoint, key: str) -> tuple[float, float]:
    """When the Redis ``key`` expires on our clock, and the uncertainty, both in seconds.

    ``PTTL`` says how many whole milliseconds the key has left when the server ran it (the
    true rest is up to 1 ms more), at a moment between our send and our receive: midpoint +
    PTTL + 0.5 ms, ± half the round trip + 0.5 ms. On a Cluster the key's master answers, on
    Sentinel the master the sentinels name; on Redlock's masters the lock is free once a
    quorum of the copies expired: the quorum-th expiry of them.
    """
    import redis.asyncio as aioredis

    if endpoint.backend == "redlock":
        nodes = endpoint.nodes
        # A master the holder did not reach (it took a quorum and died) is free already.
        found = [
            await _expiry(aioredis.Redis(host=h, port=p), key, missing_ok=True) for h, p in nodes
        ]
        found.sort()
        return found[len(nodes) // 2][0], max(u for _, u in found)
    if endpoint.backend == "redis-cluster":
        host, port = endpoint.nodes[0]
        return await _expiry(aioredis.RedisCluster(host=host, port=port), key)
    if endpoint.backend == "redis-sentinel":
        from redis.asyncio.sentinel import Sentinel

        service = endpoint.database.split("/")[0]
        return await _expiry(Sentinel(endpoint.nodes).master_for(service), key)
    return await _expiry(aioredis.Redis(host=endpoint.host, port=endpoint.port), key)


async def _expiry(client: Any, key: str, *, missing_ok: bool = False) -> tuple[float, float]:
    try:
        await client.ping()
        sent = time.perf_counter()
        pttl = int(await client.pttl(key))
        received = time.perf_counter()
    finally:
        await client.aclose()
    if pttl == -2 and missing_ok:
        return sent, (received - sent) / 2 + 0.0005
    if pttl < 0:
        raise RuntimeError(f"key {key!r} has no expiry to wait for (PTTL {pttl})")
    return (sent + received) / 2 + pttl / 1000.0 + 0.0005, (received - sent) / 2 + 0.0005
