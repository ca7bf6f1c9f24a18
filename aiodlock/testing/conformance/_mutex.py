"""Mutexes: reentrancy (``reentrant=True``) and the error a non-reentrant re-entry raises."""

# ruff: noqa: PT018 - test code, held to the rules of tests/ (pyproject.toml)

from __future__ import annotations

import asyncio

import pytest

import aiodlock

from ._timing import SLACK_TTL, kept_past

__all__ = [
    "test_acquired_reentrant_lease_is_reentered_by_async_with",
    "test_non_reentrant_reentry_is_an_error_not_a_deadlock",
    "test_reentrant_lock_excludes_other_tasks_of_same_client",
    "test_reentrant_lock_same_task_reenters_without_new_token",
]


@pytest.mark.asyncio
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


@pytest.mark.asyncio
async def test_acquired_reentrant_lease_is_reentered_by_async_with(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    """A lease taken with ``acquire()`` is re-entered by ``async with`` in the same task (it
    once timed out: the lease was invisible to reentrancy), and outlives the inner block."""
    # Renewed every ttl/3, it outlives a renewal up to 2 x LATE_RENEWAL_SLACK late.
    lease = await locks.lock("job", reentrant=True, ttl=SLACK_TTL).acquire()
    granted_until = lease.valid_until
    async with locks.lock("job", reentrant=True, timeout=1) as inner:
        assert inner is lease
        assert inner.fencing_token == lease.fencing_token
        assert await other.lock("job").try_acquire() is None
    await kept_past(lease, granted_until)  # still renewed by its one keep-alive
    assert await other.lock("job").try_acquire() is None
    await lease.release()
    after = await other.lock("job").try_acquire()
    assert after is not None and after.fencing_token > lease.fencing_token
    await after.release()


@pytest.mark.asyncio
async def test_reentrant_lock_excludes_other_tasks_of_same_client(
    locks: aiodlock.LockClient,
) -> None:
    async with locks.lock("job", reentrant=True):
        attempt = asyncio.create_task(locks.lock("job", reentrant=True).acquire(timeout=0.2))
        with pytest.raises(aiodlock.LockTimeoutError):
            await attempt


@pytest.mark.asyncio
async def test_non_reentrant_reentry_is_an_error_not_a_deadlock(
    locks: aiodlock.LockClient,
) -> None:
    async with locks.lock("job"):
        with pytest.raises(RuntimeError, match="reentrant=True"):
            async with locks.lock("job"):
                pass
