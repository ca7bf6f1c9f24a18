"""Reader/writer locks (``Capability.SHARED``): readers share, writers exclude, one release
wakes every reader; the lock families of one name are independent."""

from __future__ import annotations

import asyncio

import pytest

import aiodlock
from aiodlock.backends import Capability

from ._fixtures import Target
from ._needs import requires
from ._timing import wait_until

__all__ = [
    "test_lock_families_are_independent",
    "test_readers_share_writers_exclude",
    "test_writer_release_wakes_every_reader",
]


@requires(Capability.SHARED)
@pytest.mark.asyncio
async def test_readers_share_writers_exclude(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    r1 = await locks.read_lock("catalog").acquire()
    r2 = await other.read_lock("catalog").acquire(timeout=1)  # readers share
    assert r2.fencing_token > r1.fencing_token
    assert await other.write_lock("catalog").try_acquire() is None
    writing = other.write_lock("catalog")
    writer = asyncio.create_task(writing.acquire(timeout=5))
    await wait_until(lambda: writing.statistics().waiting == 1)  # r1's release wakes it
    await r1.release()
    # One reader is still in: a writer is refused after the first reader's release.
    assert await locks.write_lock("catalog").try_acquire() is None
    assert not writer.done()
    await r2.release()
    w = await writer  # woken when the last reader leaves
    assert await locks.read_lock("catalog").try_acquire() is None
    reading = locks.read_lock("catalog")
    reader = asyncio.create_task(reading.acquire(timeout=5))
    await wait_until(lambda: reading.statistics().waiting == 1)  # refused: the writer is in
    assert not reader.done()
    await w.release()
    r3 = await reader
    await r3.release()


@requires(Capability.SHARED)
@pytest.mark.asyncio
async def test_writer_release_wakes_every_reader(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, aiodlock_target: Target
) -> None:
    w = await locks.write_lock("doc").acquire()
    reading = [(locks if i % 2 else other).read_lock("doc") for i in range(6)]
    readers = [asyncio.create_task(lock.acquire(timeout=5)) for lock in reading]
    # Every reader refused once and waiting: the one release must wake them all.
    await wait_until(lambda: all(lock.statistics().waiting == 1 for lock in reading))
    assert not any(reader.done() for reader in readers)
    await w.release()
    leases = await asyncio.gather(*readers)
    assert all(lease.held for lease in leases)  # all six at once: shared
    for lease in leases:
        await lease.release()
    await aiodlock_target.assert_no_leftovers(locks, other)


@requires(Capability.SHARED, Capability.COUNTING)
@pytest.mark.asyncio
async def test_lock_families_are_independent(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, aiodlock_target: Target
) -> None:
    """A mutex, a read-write lock and a semaphore of one name are three locks: each is taken
    at once while the others are held, and each of them really excludes."""
    held = []
    for lock in (locks.lock("x"), locks.write_lock("x"), locks.semaphore("x", limit=1)):
        lease = await lock.try_acquire()
        assert lease is not None, f"{lock!r} was refused while another family was held"
        held.append(lease)
    assert await other.lock("x").try_acquire() is None
    assert await other.write_lock("x").try_acquire() is None
    assert await other.read_lock("x").try_acquire() is None
    assert await other.semaphore("x", limit=1).try_acquire() is None
    for lease in held:
        await lease.release()
    await aiodlock_target.assert_no_leftovers(locks, other)
