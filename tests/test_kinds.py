"""Kind-specific semantics on every backend: reentrancy, read/write, semaphore, fairness."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

import aiodlock
from aiodlock.backends import Capability
from aiodlock.testing import History
from tests.conftest import Target, settle, wait_until


async def test_reentrant_lock_same_task_reenters_without_new_token(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    async with locks.lock("job", reentrant=True) as outer:
        async with locks.lock("job", reentrant=True) as inner:
            assert inner is outer
            assert await other.lock("job").try_acquire() is None
        # Still held after the inner block ends.
        assert await other.lock("job").try_acquire() is None
    lease = await other.lock("job").try_acquire()
    assert lease is not None
    assert lease.fencing_token > outer.fencing_token
    await lease.release()


async def test_reentrant_lock_excludes_other_tasks_of_same_client(
    locks: aiodlock.LockClient,
) -> None:
    async with locks.lock("job", reentrant=True):
        attempt = asyncio.create_task(locks.lock("job", reentrant=True).acquire(timeout=0.2))
        with pytest.raises(aiodlock.LockTimeoutError):
            await attempt


async def test_non_reentrant_reentry_is_an_error_not_a_deadlock(
    locks: aiodlock.LockClient,
) -> None:
    async with locks.lock("job"):
        with pytest.raises(RuntimeError, match="reentrant=True"):
            async with locks.lock("job"):
                pass


@pytest.mark.requires(Capability.SHARED)
async def test_readers_share_writers_exclude(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    r1 = await locks.read_lock("catalog").acquire()
    r2 = await other.read_lock("catalog").acquire(timeout=1)  # readers share
    assert r2.fencing_token > r1.fencing_token
    assert await other.write_lock("catalog").try_acquire() is None
    writer = asyncio.create_task(other.write_lock("catalog").acquire(timeout=5))
    await r1.release()
    await asyncio.sleep(0.05)
    assert not writer.done()  # one reader is still in
    await r2.release()
    w = await writer  # woken when the last reader leaves
    assert await locks.read_lock("catalog").try_acquire() is None
    reader = asyncio.create_task(locks.read_lock("catalog").acquire(timeout=5))
    await asyncio.sleep(0.05)
    assert not reader.done()
    await w.release()
    r3 = await reader
    await r3.release()


@pytest.mark.requires(Capability.SHARED)
async def test_writer_release_wakes_every_reader(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, target: Target
) -> None:
    w = await locks.write_lock("doc").acquire()
    readers = [
        asyncio.create_task((locks if i % 2 else other).read_lock("doc").acquire(timeout=5))
        for i in range(6)
    ]
    await asyncio.sleep(0.05)
    await w.release()
    leases = await asyncio.gather(*readers)
    assert all(lease.held for lease in leases)  # all six at once: shared
    for lease in leases:
        await lease.release()
    await settle(locks, other)
    assert await target.leftovers() == []


@pytest.mark.requires(Capability.SHARED, Capability.COUNTING)
async def test_lock_families_are_independent(locks: aiodlock.LockClient) -> None:
    async with locks.lock("x"), locks.write_lock("x"), locks.semaphore("x", limit=1):
        pass


@pytest.mark.requires(Capability.COUNTING)
async def test_semaphore_limit(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, target: Target
) -> None:
    history = History()

    async def user(client: aiodlock.LockClient, i: int) -> None:
        async with client.semaphore("quota", limit=3, timeout=10) as lease:
            with history.hold(f"u{i}", lease.fencing_token):
                await asyncio.sleep(0.02)

    async with asyncio.TaskGroup() as tg:
        for i in range(12):
            tg.create_task(user(locks if i % 2 else other, i))
    history.check(max_holders=3)
    assert history.max_concurrency() == 3
    await settle(locks, other)
    assert await target.leftovers() == []


@pytest.mark.requires(Capability.COUNTING)
async def test_semaphore_permit_of_crashed_holder_comes_back(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    lease = await locks.semaphore("pool", limit=1, ttl=0.4).acquire()
    locks._stop_keeper(lease)  # crashed: never renewed, never released
    again = await other.semaphore("pool", limit=1).acquire(timeout=3)
    assert again.fencing_token > lease.fencing_token
    await again.release()


@pytest.mark.requires(Capability.FAIR)
async def test_fair_lock_hands_over_in_arrival_order(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, target: Target
) -> None:
    holder = await locks.lock("queue", fair=True).acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with (locks if i % 2 else other).lock("queue", fair=True, timeout=10):
            order.append(i)
            await asyncio.sleep(0.005)

    tasks = []
    for i in range(6):
        lock_client = locks if i % 2 else other
        before = lock_client.statistics()
        tasks.append(asyncio.create_task(waiter(i)))
        # Wait until this waiter has queued (its first refused attempt) before the next one.
        queued = _waiting_from(before) + 1
        await wait_until(partial(_has_waiters, lock_client, queued))
    await holder.release()
    await asyncio.gather(*tasks)
    assert order == list(range(6))
    await settle(locks, other)
    assert await target.leftovers() == []


def _has_waiters(client: aiodlock.LockClient, count: int) -> bool:
    return _waiting(client) >= count


def _waiting(client: aiodlock.LockClient) -> int:
    return int(client.statistics().backend.get("waiters", 0))


def _waiting_from(stats: aiodlock.ClientStatistics) -> int:
    return int(stats.backend.get("waiters", 0))


@pytest.mark.requires(Capability.FAIR)
async def test_cancelled_fair_waiter_does_not_block_the_queue(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, target: Target
) -> None:
    holder = await locks.lock("q", fair=True).acquire()
    first = asyncio.create_task(other.lock("q", fair=True).acquire())
    await wait_until(lambda: _waiting(other) >= 1)
    second = asyncio.create_task(locks.lock("q", fair=True).acquire(timeout=5))
    await wait_until(lambda: _waiting(locks) >= 1)
    first.cancel()  # the head of the queue leaves
    with pytest.raises(asyncio.CancelledError):
        await first
    await settle(other)
    await holder.release()
    lease = await second  # must not wait for the departed head's heartbeat deadline
    await lease.release()
    await settle(locks, other)
    assert await target.leftovers() == []


async def test_run_exclusive_returns_result_and_guards(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    async def job(x: int) -> int:
        assert await other.lock("nightly").try_acquire() is None
        return x * 2

    assert await locks.run_exclusive("nightly", job, 21) == 42


@pytest.mark.requires(Capability.COUNTING)
async def test_statistics_and_repr(locks: aiodlock.LockClient) -> None:
    lock = locks.semaphore("s", limit=2)
    async with lock:
        stats = lock.statistics()
        assert (stats.held, stats.acquired, stats.kind) == (1, 1, "semaphore")
        assert "held=1" in repr(lock) and "limit=2" in repr(lock)
