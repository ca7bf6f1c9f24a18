"""Fair locks (``Capability.FAIR``): FIFO handoff, and a cancelled waiter does not block the
queue."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

import aiodlock
from aiodlock.backends import Capability

from .. import settle
from ._fixtures import Target
from ._needs import requires
from ._timing import backend_waiters, has_backend_waiters, wait_until

__all__ = [
    "test_cancelled_fair_waiter_does_not_block_the_queue",
    "test_fair_lock_hands_over_in_arrival_order",
]


@requires(Capability.FAIR)
@pytest.mark.asyncio
async def test_fair_lock_hands_over_in_arrival_order(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, aiodlock_target: Target
) -> None:
    holder = await locks.lock("queue", fair=True).acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with (locks if i % 2 else other).lock("queue", fair=True, timeout=10):
            order.append(i)
            await asyncio.sleep(0.005)

    tasks = []
    for i in range(6):
        client = locks if i % 2 else other
        queued = backend_waiters(client) + 1
        tasks.append(asyncio.create_task(waiter(i)))
        # Wait until this waiter has queued (its first refused attempt) before the next one.
        await wait_until(partial(has_backend_waiters, client, queued))
    await holder.release()
    await asyncio.gather(*tasks)
    assert order == list(range(6))
    await aiodlock_target.assert_no_leftovers(locks, other)


@requires(Capability.FAIR)
@pytest.mark.asyncio
async def test_cancelled_fair_waiter_does_not_block_the_queue(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, aiodlock_target: Target
) -> None:
    holder = await locks.lock("q", fair=True).acquire()
    first = asyncio.create_task(other.lock("q", fair=True).acquire())
    await wait_until(partial(has_backend_waiters, other, 1))
    second = asyncio.create_task(locks.lock("q", fair=True).acquire(timeout=5))
    await wait_until(partial(has_backend_waiters, locks, 1))
    first.cancel()  # the head of the queue leaves
    with pytest.raises(asyncio.CancelledError):
        await first
    await settle(other)
    await holder.release()
    lease = await second  # must not wait for the departed head's heartbeat deadline
    await lease.release()
    await aiodlock_target.assert_no_leftovers(locks, other)
