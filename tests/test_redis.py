"""Redis-only behaviour: what waiting costs, and surviving the server's faults."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

import aiodlock
from tests.conftest import wait_until
from tests.servers import RedisServer


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def connections_named(raw: aioredis.Redis, prefix: str) -> int:
    clients = await raw.client_list()
    return sum(1 for c in clients if str(c.get("name", "")).startswith(prefix))


async def test_thousand_waiters_share_three_connections(
    redis_url: str, raw: aioredis.Redis
) -> None:
    async with aiodlock.connect(redis_url, namespace="thousand") as locks:
        holder = await locks.lock("hot").acquire()
        served = 0

        async def waiter() -> None:
            nonlocal served
            async with locks.lock("hot", timeout=30):
                served += 1

        waiters = [asyncio.create_task(waiter()) for _ in range(1000)]
        await wait_until(lambda: locks.statistics().backend["waiters"] >= 1000)
        assert 2 <= await connections_named(raw, "aiodlock") <= 3  # commands + pub/sub
        await holder.release()
        await asyncio.gather(*waiters)  # each release wakes the next waiter
        assert served == 1000
        assert locks.statistics().backend["subscribed_channels"] == 0
    assert await raw.pubsub_numsub("{thousand:hot}:signal") == [(b"{thousand:hot}:signal", 0)]


async def test_renew_never_resurrects(redis_url: str, raw: aioredis.Redis) -> None:
    async with aiodlock.connect(redis_url, namespace="resurrect", ttl=0.3) as locks:
        lease = await locks.lock("k").acquire()
        await raw.delete("{resurrect:k}")
        await asyncio.wait_for(lease.lost.wait(), 2)
        assert await raw.exists("{resurrect:k}") == 0


async def test_waiter_is_woken_after_pubsub_connection_is_killed(
    redis_url: str, raw: aioredis.Redis
) -> None:
    async with (
        aiodlock.connect(redis_url, namespace="killsub") as locks,
        aiodlock.connect(redis_url, namespace="killsub") as other,
    ):
        holder = await locks.lock("k", ttl=30).acquire()
        waiting = asyncio.create_task(other.lock("k", ttl=30).acquire(timeout=10))
        await wait_until(lambda: other.statistics().backend["waiters"] >= 1)
        await raw.client_kill_filter(_type="pubsub")
        await asyncio.sleep(0.3)  # let the subscriber notice and re-subscribe
        await holder.release()
        lease = await waiting  # well before the 30 s lease: a wakeup, not an expiry
        await lease.release()


async def test_unreachable_server_is_a_backend_error_without_the_password() -> None:
    server = RedisServer()
    port = server.port  # a free port nobody listens on
    with pytest.raises(aiodlock.BackendError) as info:
        async with aiodlock.connect(f"redis://:hunter2@127.0.0.1:{port}/0", connect_timeout=1):
            pass
    assert "hunter2" not in str(info.value)
    assert "127.0.0.1" in str(info.value)
    server.close()


async def test_holder_survives_server_restart_as_a_loss_not_a_hang(
    redis_url: str,
) -> None:
    """A restarted server forgets every lock: holders must hear about it, not hang."""
    server = RedisServer().start()
    try:
        async with aiodlock.connect(server.url, namespace="restart", ttl=0.6) as locks:
            with pytest.raises(aiodlock.LockLostError):
                async with locks.lock("k"):
                    await asyncio.to_thread(server.restart)
                    await asyncio.sleep(5)
    finally:
        server.close()
