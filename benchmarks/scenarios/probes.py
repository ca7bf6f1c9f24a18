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
    MySQL: ``Threads_connected``; PostgreSQL: client backends in ``pg_stat_activity``.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._client: Any = None

    async def open(self) -> None:
        e = self.endpoint
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
    PTTL + 0.5 ms, ± half the round trip + 0.5 ms.
    """
    import redis.asyncio as aioredis

    client = aioredis.Redis(host=endpoint.host, port=endpoint.port)
    try:
        await client.ping()
        sent = time.perf_counter()
        pttl = int(await client.pttl(key))
        received = time.perf_counter()
    finally:
        await client.aclose()
    if pttl < 0:
        raise RuntimeError(f"key {key!r} has no expiry to wait for (PTTL {pttl})")
    return (sent + received) / 2 + pttl / 1000.0 + 0.0005, (received - sent) / 2 + 0.0005
