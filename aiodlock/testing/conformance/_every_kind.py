"""Every kind of exclusive lock (the ``make`` fixture): exclusion, timeouts, fencing, wakeups,
opaque names, ``run_exclusive`` and the capabilities every backend declares."""

# ruff: noqa: PT018 - test code, held to the rules of tests/ (pyproject.toml)

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

import aiodlock
from aiodlock.backends import Capability, load_backend

from .. import History, settle
from ._fixtures import Target
from ._needs import LockKind
from ._timing import wait_until

__all__ = [
    "test_every_backend_fences_and_wakes",
    "test_exclusion_read_sleep_write",
    "test_fencing_tokens_strictly_increase",
    "test_names_are_opaque",
    "test_release_wakes_waiter_without_waiting_out_the_lease",
    "test_run_exclusive_returns_result_and_guards",
    "test_timeout",
    "test_timeout_zero_tries_once",
    "test_try_acquire",
    "test_undeclared_kinds_fail_at_construction",
]


@pytest.mark.asyncio
async def test_exclusion_read_sleep_write(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
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


@pytest.mark.asyncio
async def test_timeout(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    loop = asyncio.get_running_loop()
    async with make(locks, "busy"):
        started = loop.time()
        with pytest.raises(aiodlock.LockTimeoutError) as info:
            await make(other, "busy").acquire(timeout=0.2)
        assert loop.time() - started >= 0.2 - 1e-3  # uvloop keeps time in whole ms
    assert isinstance(info.value, TimeoutError)
    assert "'busy'" in str(info.value)


@pytest.mark.asyncio
async def test_timeout_zero_tries_once(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """``timeout=0``: one attempt, no waiting (like ``try_acquire()``, but raising)."""
    async with make(locks, "once", timeout=0) as lease:
        assert lease.held
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(aiodlock.LockTimeoutError):
            await make(other, "once").acquire(timeout=0)
        assert loop.time() - started < 1
    await settle(locks)
    await settle(other)


@pytest.mark.asyncio
async def test_try_acquire(
    locks: aiodlock.LockClient,
    other: aiodlock.LockClient,
    make: LockKind,
    aiodlock_target: Target,
) -> None:
    lease = await make(locks, "door").try_acquire()
    assert lease is not None and lease.held
    assert await make(other, "door").try_acquire() is None
    await lease.release()
    second = await make(other, "door").try_acquire()
    assert second is not None
    assert second.fencing_token > lease.fencing_token
    await second.release()
    await aiodlock_target.assert_no_leftovers(locks, other)


@pytest.mark.asyncio
async def test_fencing_tokens_strictly_increase(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    tokens = []
    for i in range(10):
        async with make(locks if i % 2 else other, "fenced") as lease:
            tokens.append(lease.fencing_token)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


@pytest.mark.asyncio
async def test_release_wakes_waiter_without_waiting_out_the_lease(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """With a 30 s lease, only a wakeup can get the waiter in within its 5 s timeout."""
    holder = await make(locks, "handoff", ttl=30).acquire()
    lock = make(other, "handoff", ttl=30)
    waiting = asyncio.create_task(lock.acquire(timeout=5))
    # Refused once, now waiting: the release below must wake it (were it not waiting yet, its
    # first attempt would simply find the lock free).
    await wait_until(lambda: lock.statistics().waiting == 1)
    assert not waiting.done()
    await holder.release()
    lease = await waiting
    assert lease.fencing_token > holder.fencing_token
    await lease.release()


@pytest.mark.asyncio
async def test_names_are_opaque(
    locks: aiodlock.LockClient,
    other: aiodlock.LockClient,
    make: LockKind,
    aiodlock_target: Target,
) -> None:
    names = ["a/b/../c", "{tag}", "}{", "with space", "ünïcødé ✓", "x:fence", "..", "a" * 1000]
    leases = [await make(locks, name).acquire() for name in names]
    for name in names:
        assert await make(other, name).try_acquire() is None
    assert len({lease.fencing_token for lease in leases}) >= 1
    for lease in leases:
        await lease.release()
    await aiodlock_target.assert_no_leftovers(locks, other)


@pytest.mark.asyncio
async def test_run_exclusive_returns_result_and_guards(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    async def job(x: int) -> int:
        assert await other.lock("nightly").try_acquire() is None
        return x * 2

    assert await locks.run_exclusive("nightly", job, 21) == 42


@pytest.mark.asyncio
async def test_undeclared_kinds_fail_at_construction(
    locks: aiodlock.LockClient, aiodlock_target: Target
) -> None:
    """A kind the backend does not declare fails with UnsupportedError when it is built (so
    deselecting the tests of undeclared kinds cannot hide a missing feature)."""
    caps = load_backend(aiodlock_target.scheme).capabilities
    builders: dict[Capability, list[Callable[[], object]]] = {
        Capability.SHARED: [lambda: locks.read_lock("x"), lambda: locks.write_lock("x")],
        Capability.COUNTING: [lambda: locks.semaphore("x", limit=2)],
        Capability.FAIR: [lambda: locks.lock("x", fair=True)],
        Capability.EXCLUSIVE: [lambda: locks.lock("x")],
    }
    for capability, makers in builders.items():
        for build in makers:
            if capability in caps:
                build()  # constructs without a round trip
            else:
                with pytest.raises(aiodlock.UnsupportedError, match=capability.value):
                    build()


@pytest.mark.asyncio
async def test_every_backend_fences_and_wakes(aiodlock_target: Target) -> None:
    """The promises of the README: fencing tokens and no sleep-polling, on every backend."""
    caps = load_backend(aiodlock_target.scheme).capabilities
    assert Capability.FENCING in caps
    assert Capability.SERVER_WAKEUP in caps
    assert Capability.EXCLUSIVE in caps
    assert (Capability.TTL_LEASE in caps) != (Capability.SESSION_LEASE in caps)
