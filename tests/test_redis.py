"""Redis-only behaviour: what waiting costs, and surviving the server's faults."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

import aiodlock
from aiodlock.backends import parse_url
from tests.helpers import wait_until

if TYPE_CHECKING:
    import redis.asyncio as aioredis

pytestmark = pytest.mark.redis


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    import redis.asyncio as aioredis

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
    """1000 waiting readers are 1000 subscriptions on one pub/sub connection."""
    async with aiodlock.connect(redis_url, namespace="thousand") as locks:
        writer = await locks.write_lock("hot").acquire()
        inside = 0
        all_in = asyncio.Event()

        async def reader() -> None:
            nonlocal inside
            async with locks.read_lock("hot", timeout=30):
                inside += 1
                if inside == 1000:
                    all_in.set()
                await all_in.wait()  # every reader holds at once: shared

        readers = [asyncio.create_task(reader()) for _ in range(1000)]
        await wait_until(lambda: locks.statistics().backend["waiters"] >= 1000)
        assert 2 <= await connections_named(raw, "aiodlock") <= 3  # commands + pub/sub
        await writer.release()
        await asyncio.gather(*readers)
        assert locks.statistics().backend["subscribed_channels"] == 0
    channel = "{thousand:hot}:rw:signal"
    assert await raw.pubsub_numsub(channel) == [(channel.encode(), 0)]


async def test_local_waiters_take_turns_and_cost_one_server_waiter(redis_url: str) -> None:
    """Tasks of one client queue locally for a mutex: one of them waits at the service, a
    releasing task cannot barge in ahead of them, and they are served in arrival order."""
    async with aiodlock.connect(redis_url, namespace="turns") as locks:
        lock = locks.lock("hot")
        holder = await lock.acquire()
        order: list[int] = []

        async def worker(i: int) -> None:
            async with lock:
                order.append(i)

        workers = []
        for i in range(200):
            workers.append(asyncio.create_task(worker(i)))
            await asyncio.sleep(0)  # let it queue: arrival order is creation order
        await wait_until(lambda: lock.statistics().waiting >= 200)
        assert locks.statistics().backend["waiters"] == 1
        await holder.release()
        await asyncio.gather(*workers)
        assert order == list(range(200))


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
    from tests.servers import RedisServer

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
    from tests.servers import RedisServer

    server = RedisServer().start()
    try:
        async with aiodlock.connect(server.url, namespace="restart", ttl=0.6) as locks:
            with pytest.raises(aiodlock.LockLostError):
                async with locks.lock("k"):
                    await asyncio.to_thread(server.restart)
                    await asyncio.sleep(5)
    finally:
        server.close()


def test_password_never_shown() -> None:
    client = aiodlock.connect("redis://user:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in repr(client)
    assert "s3cret" not in repr(parse_url("redis://user:s3cret@h:1/0"))
    with pytest.raises(ValueError, match="wakeup") as info:
        aiodlock.connect("redis://user:s3cret@127.0.0.1:1/0?wakeup=carrier-pigeon")
    assert "s3cret" not in str(info.value)
    with pytest.raises(ValueError, match="unknown URL scheme") as info2:
        aiodlock.connect("bogus://user:s3cret@h")
    assert "s3cret" not in str(info2.value)
