"""Semaphores (``Capability.COUNTING``): the limit holds, a mismatched limit is refused, a
crashed holder's permit comes back."""

# ruff: noqa: PT018 - test code, held to the rules of tests/ (pyproject.toml)

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import aiodlock
from aiodlock.backends import Capability

from .. import History, abandon
from ._fixtures import Target
from ._needs import requires

__all__ = [
    "test_semaphore_limit",
    "test_semaphore_limit_mismatch_is_refused",
    "test_semaphore_permit_of_crashed_holder_comes_back",
    "test_statistics_and_repr",
]


@requires(Capability.COUNTING)
@pytest.mark.asyncio
async def test_semaphore_limit(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, aiodlock_target: Target
) -> None:
    history = History()
    inside = 0
    full = asyncio.Event()  # three holders at once, seen by the holders themselves

    async def user(client: aiodlock.LockClient, i: int) -> None:
        nonlocal inside
        async with client.semaphore("quota", limit=3, timeout=10) as lease:
            with history.hold(f"u{i}", lease.fencing_token):
                inside += 1
                if inside == 3:
                    full.set()
                # The first holders stay until a third joins them (however slowly the grants
                # come on a loaded machine); a semaphore that admits fewer times out here.
                await asyncio.wait_for(full.wait(), 10)
                await asyncio.sleep(0.02)
                inside -= 1

    async with asyncio.TaskGroup() as tg:
        for i in range(12):
            tg.create_task(user(locks if i % 2 else other, i))
    history.check(max_holders=3)
    assert history.max_concurrency() == 3
    await aiodlock_target.assert_no_leftovers(locks, other)


@requires(Capability.COUNTING)
@pytest.mark.asyncio
async def test_semaphore_limit_mismatch_is_refused(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, aiodlock_target: Target
) -> None:
    """Clients using different limits for one semaphore would over-grant: while a permit of
    limit 2 is held, the service refuses limit 3 (or 1) from acquire() with a clear error —
    a programming error, not a BackendError — leaving nothing behind and the holder's count
    intact; once every permit is released, limit 3 is accepted."""
    holder = await locks.semaphore("pool", limit=2).acquire()
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "acquire": lambda: other.semaphore("pool", limit=3).acquire(timeout=5),
        "try_acquire": lambda: other.semaphore("pool", limit=3).try_acquire(),
        "same client": lambda: locks.semaphore("pool", limit=1).acquire(timeout=5),
    }
    for what, attempt in attempts.items():
        with pytest.raises(aiodlock.LimitMismatchError) as info:
            await attempt()
        assert isinstance(info.value, ValueError), what
        assert not isinstance(info.value, aiodlock.BackendError), what
        assert "semaphore 'pool' is in use with limit 2" in str(info.value), what
    assert (info.value.in_use, info.value.requested) == (2, 1)
    with pytest.raises(aiodlock.LimitMismatchError, match="limit 2; this one asks for limit 3"):
        async with other.semaphore("pool", limit=3, timeout=5):
            pytest.fail("a permit was granted with a mismatched limit")
    # The holder is unaffected, and the refusals took no permit: exactly one more fits.
    assert holder.held and not holder.lost.is_set()
    second = await other.semaphore("pool", limit=2).acquire(timeout=5)
    assert await other.semaphore("pool", limit=2).try_acquire() is None
    await holder.release()
    await second.release()
    await aiodlock_target.assert_no_leftovers(locks, other)
    # Every permit is gone: a new limit is fine again.
    leases = [await c.semaphore("pool", limit=3).acquire(timeout=5) for c in (locks, other, locks)]
    assert await other.semaphore("pool", limit=3).try_acquire() is None
    for lease in leases:
        await lease.release()
    await aiodlock_target.assert_no_leftovers(locks, other)


@requires(Capability.COUNTING)
@pytest.mark.asyncio
async def test_semaphore_permit_of_crashed_holder_comes_back(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    lease = await locks.semaphore("pool", limit=1, ttl=0.4).acquire()
    abandon(locks, lease)  # crashed: never renewed, never released
    again = await other.semaphore("pool", limit=1).acquire(timeout=3)
    assert again.fencing_token > lease.fencing_token
    await again.release()


@requires(Capability.COUNTING)
@pytest.mark.asyncio
async def test_statistics_and_repr(locks: aiodlock.LockClient) -> None:
    lock = locks.semaphore("s", limit=2)
    async with lock:
        stats = lock.statistics()
        assert (stats.held, stats.acquired, stats.kind) == (1, 1, "semaphore")
        assert "held=1" in repr(lock) and "limit=2" in repr(lock)
