"""The client's lock statistics on the memory backend: totals, the wait-time histogram, the
per-name figures and the bound on how many names they keep."""

from __future__ import annotations

import asyncio
import math
import uuid

import pytest

import aiodlock

from .helpers import wait_until

pytestmark = pytest.mark.memory

NAMES_KEPT = 1000  # documented in docs/core.md (Statistics)
BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0, math.inf)


def _url() -> str:
    return f"memory://stats-{uuid.uuid4().hex[:8]}"


@pytest.mark.asyncio
async def test_a_fresh_client_counts_nothing() -> None:
    async with aiodlock.connect(_url()) as locks:
        stats = locks.statistics()
        assert (stats.grants, stats.timeouts, stats.losses) == (0, 0, 0)
        assert tuple(stats.wait_histogram) == BUCKETS
        assert not any(stats.wait_histogram.values())
        assert stats.by_name == {}


@pytest.mark.asyncio
async def test_waits_land_in_their_buckets() -> None:
    url = _url()
    async with aiodlock.connect(url) as locks, aiodlock.connect(url) as other:
        holder = await other.lock("w").acquire()
        waiting = locks.lock("w", timeout=10)
        waiter = asyncio.create_task(waiting.acquire())
        await wait_until(lambda: waiting.statistics().waiting == 1)
        await asyncio.sleep(0.02)  # the time waited is what is measured
        await holder.release()
        lease = await waiter
        histogram = locks.statistics().wait_histogram
        # Waited more than 10 ms: in the 0.1 bucket, or a later one on a loaded machine.
        assert histogram[0.001] == histogram[0.01] == 0
        assert sum(histogram.values()) == 1
        await lease.release()

        async with locks.lock("free"):
            pass  # uncontended: a fast grant
        histogram = locks.statistics().wait_histogram
        assert histogram[0.001] + histogram[0.01] == 1
        assert sum(histogram.values()) == 2


@pytest.mark.asyncio
async def test_per_name_figures_span_lock_objects_and_kinds() -> None:
    """A fresh lock object counts from zero; the name's figures are the client's."""
    async with aiodlock.connect(_url()) as locks:
        async with locks.lock("x", reentrant=True) as lease, locks.lock("x", reentrant=True):
            assert lease.held  # the re-entry is not a grant
        async with locks.read_lock("x"):
            pass
        assert await locks.semaphore("x", limit=2).try_acquire() is not None
        assert locks.lock("x").statistics().acquired == 0
        stats = locks.statistics()
        assert stats.by_name["x"].grants == 3
        assert stats.grants == 3
        assert set(stats.by_name) == {"x"}


@pytest.mark.asyncio
async def test_timeouts_and_losses_are_counted_where_they_happen() -> None:
    url = _url()
    async with aiodlock.connect(url) as locks, aiodlock.connect(url) as other:
        async with other.lock("busy"):
            with pytest.raises(aiodlock.LockTimeoutError):
                await locks.lock("busy").acquire(timeout=0.01)
            assert await locks.lock("busy").try_acquire() is None  # not a timeout
        lock = locks.lock("broken")
        lease = await lock.acquire()
        assert await other.break_lock("broken") == 1
        await asyncio.wait_for(lease.lost.wait(), 5)
        stats = locks.statistics()
        assert (stats.grants, stats.timeouts, stats.losses) == (1, 1, 1)
        assert stats.by_name["busy"].timeouts == 1
        assert stats.by_name["busy"].grants == 0
        assert stats.by_name["broken"].losses == 1
        assert lock.statistics().lost == 1
        assert other.statistics().losses == 0


@pytest.mark.asyncio
async def test_a_snapshot_does_not_change_afterwards() -> None:
    async with aiodlock.connect(_url()) as locks:
        before = locks.statistics()
        async with locks.lock("later"):
            pass
        assert before.grants == 0
        assert "later" not in before.by_name
        assert locks.statistics().grants == 1


@pytest.mark.asyncio
async def test_the_per_name_table_keeps_the_names_used_last() -> None:
    """Nothing kept per name grows forever: past NAMES_KEPT names the least recently used is
    forgotten (the totals still count it)."""
    async with aiodlock.connect(_url()) as locks:
        for i in range(NAMES_KEPT):
            async with locks.lock(f"n{i}"):
                pass
        async with locks.lock("n0"):
            pass  # n0 is now the most recently used: n1 goes first
        for i in range(NAMES_KEPT, NAMES_KEPT + 5):
            async with locks.lock(f"n{i}"):
                pass
        stats = locks.statistics()
        assert len(stats.by_name) == NAMES_KEPT
        assert stats.by_name["n0"].grants == 2
        assert all(f"n{i}" not in stats.by_name for i in range(1, 6))
        assert "n6" in stats.by_name
        assert f"n{NAMES_KEPT + 4}" in stats.by_name
        assert stats.grants == NAMES_KEPT + 6
