"""One suite, every backend × every exclusive lock kind (DESIGN §5).

``locks`` and ``other`` are two independent clients: as far as the service can tell, two
processes. Real cross-process tests (SIGSTOP, several processes) are in test_processes.py.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

import aiodlock
from aiodlock.testing import History
from tests.conftest import Target, settle

LockFactory = Callable[..., Any]

KINDS: dict[str, LockFactory] = {
    "mutex": lambda c, name, **kw: c.lock(name, **kw),
    "reentrant": lambda c, name, **kw: c.lock(name, reentrant=True, **kw),
    "fair": lambda c, name, **kw: c.lock(name, fair=True, **kw),
    "write": lambda c, name, **kw: c.write_lock(name, **kw),
    "semaphore1": lambda c, name, **kw: c.semaphore(name, limit=1, **kw),
}


@pytest.fixture(params=list(KINDS))
def make(request: pytest.FixtureRequest) -> LockFactory:
    # Kinds a backend does not declare are deselected in conftest.py (KIND_NEEDS).
    return KINDS[request.param]


async def test_exclusion_read_sleep_write(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory
) -> None:
    """The seeds' oversell: read, sleep, write under the lock loses no update."""
    counter = {"value": 0}
    history = History()

    async def worker(client: aiodlock.LockClient, who: str) -> None:
        for _ in range(5):
            async with make(client, "counter", timeout=10) as lease:
                with history.hold(who, lease.fencing_token):
                    seen = counter["value"]
                    await asyncio.sleep(random.uniform(0, 0.002))
                    counter["value"] = seen + 1

    async with asyncio.TaskGroup() as tg:
        for i in range(4):
            tg.create_task(worker(locks if i % 2 else other, f"w{i}"))
    assert counter["value"] == 20
    history.check(max_holders=1)


async def test_timeout(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory
) -> None:
    loop = asyncio.get_running_loop()
    async with make(locks, "busy"):
        started = loop.time()
        with pytest.raises(aiodlock.LockTimeoutError) as info:
            await make(other, "busy").acquire(timeout=0.2)
        assert loop.time() - started >= 0.2 - 1e-3  # uvloop keeps time in whole ms
    assert isinstance(info.value, TimeoutError)
    assert "'busy'" in str(info.value)


async def test_try_acquire(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory, target: Target
) -> None:
    lease = await make(locks, "door").try_acquire()
    assert lease is not None and lease.held
    assert await make(other, "door").try_acquire() is None
    await lease.release()
    second = await make(other, "door").try_acquire()
    assert second is not None
    assert second.fencing_token > lease.fencing_token
    await second.release()
    await settle(locks, other)
    assert await target.leftovers() == []


async def test_fencing_tokens_strictly_increase(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory
) -> None:
    tokens = []
    for i in range(10):
        async with make(locks if i % 2 else other, "fenced") as lease:
            tokens.append(lease.fencing_token)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


async def test_release_wakes_waiter_without_waiting_out_the_lease(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory
) -> None:
    """With a 30 s lease, only a wakeup can get the waiter in within its 5 s timeout."""
    holder = await make(locks, "handoff", ttl=30).acquire()
    waiting = asyncio.create_task(make(other, "handoff", ttl=30).acquire(timeout=5))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await holder.release()
    lease = await waiting
    assert lease.fencing_token > holder.fencing_token
    await lease.release()


async def test_crashed_holder_is_replaced_after_expiry(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory
) -> None:
    """A holder that stops renewing (crashed) loses the lock at expiry, not before."""
    loop = asyncio.get_running_loop()
    crashed = make(locks, "crash", ttl=0.5)
    lease = await crashed.acquire()
    locks._stop_keeper(lease)  # the "process" dies: no more renewals, no release
    granted_at = loop.time()
    successor = await make(other, "crash", ttl=5).acquire(timeout=3)
    assert loop.time() - granted_at >= 0.4  # not before the lease ran out
    assert successor.fencing_token > lease.fencing_token
    await successor.release()


async def test_watchdog_cancels_body_when_lock_is_broken(
    locks: aiodlock.LockClient, make: LockFactory, target: Target
) -> None:
    loop = asyncio.get_running_loop()
    body_cancelled = asyncio.Event()
    broken_at = 0.0

    with pytest.raises(aiodlock.LockLostError):
        async with make(locks, "fragile", ttl=0.6) as lease:
            await target.break_lock(locks, "fragile")
            broken_at = loop.time()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                body_cancelled.set()
                raise
    assert body_cancelled.is_set()
    assert lease.lost.is_set()
    # Noticed at the next renewal: within ttl/3 plus slack, well before the ttl itself.
    assert loop.time() - broken_at < 0.6


async def test_outside_cancellation_stays_cancelled_and_releases(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory
) -> None:
    entered = asyncio.Event()

    async def hold() -> None:
        async with make(locks, "cancel-me"):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(hold())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    lease = await make(other, "cancel-me").try_acquire()
    assert lease is not None
    await lease.release()


async def test_body_exception_passes_through_unwrapped(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory
) -> None:
    with pytest.raises(ZeroDivisionError):
        async with make(locks, "oops"):
            1 / 0  # noqa: B018
    lease = await make(other, "oops").try_acquire()
    assert lease is not None
    await lease.release()


@pytest.mark.parametrize("steps", range(12))
async def test_cancel_at_each_await_point_leaves_nothing(
    locks: aiodlock.LockClient,
    other: aiodlock.LockClient,
    make: LockFactory,
    target: Target,
    steps: int,
) -> None:
    """Cancel a waiting acquire after 0, 1, 2... loop iterations: nothing may remain."""
    holder = await make(other, "contended").acquire()
    free_task = asyncio.create_task(make(locks, "free").acquire())
    waiting_task = asyncio.create_task(make(locks, "contended").acquire())
    for _ in range(steps):
        await asyncio.sleep(0)
    free_task.cancel()
    waiting_task.cancel()
    for task in (free_task, waiting_task):
        try:
            lease = await task
        except asyncio.CancelledError:
            continue
        await lease.release()  # it won the race against cancel(): a normal lease
    await holder.release()
    await settle(locks, other)
    assert await target.leftovers() == []
    assert locks.statistics().background_leases == 0


async def test_release_is_idempotent_and_lost_release_raises(
    locks: aiodlock.LockClient, make: LockFactory, target: Target
) -> None:
    lease = await make(locks, "twice").acquire()
    await lease.release()
    await lease.release()
    assert not lease.held

    lease = await make(locks, "gone", ttl=0.3).acquire()
    await target.break_lock(locks, "gone")
    await asyncio.wait_for(lease.lost.wait(), 2)
    with pytest.raises(aiodlock.LockNotOwnedError):
        await lease.release()


async def test_max_hold_stops_renewing(locks: aiodlock.LockClient, make: LockFactory) -> None:
    with pytest.raises(aiodlock.LockLostError, match="max_hold"):
        async with make(locks, "hung", ttl=0.3, max_hold=0.2):
            await asyncio.sleep(10)


async def test_acquire_outside_async_with_sets_lost(
    locks: aiodlock.LockClient, make: LockFactory, target: Target
) -> None:
    lease = await make(locks, "bg", ttl=0.3).acquire()
    assert locks.statistics().background_leases == 1
    await asyncio.sleep(0.5)  # several renewals happen meanwhile
    assert lease.held
    await target.break_lock(locks, "bg")
    await asyncio.wait_for(lease.lost.wait(), 2)
    with pytest.raises(aiodlock.LockLostError):
        lease.assert_held()


async def test_names_are_opaque(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockFactory, target: Target
) -> None:
    names = ["a/b/../c", "{tag}", "}{", "with space", "ünïcødé ✓", "x:fence", "..", "a" * 1000]
    leases = [await make(locks, name).acquire() for name in names]
    for name in names:
        assert await make(other, name).try_acquire() is None
    assert len({lease.fencing_token for lease in leases}) >= 1
    for lease in leases:
        await lease.release()
    await settle(locks, other)
    assert await target.leftovers() == []
