"""The suite's timing slack, and waits for conditions that no event reports."""

# ruff: noqa: PT018 - test code, held to the rules of tests/ (pyproject.toml)

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import aiodlock

__all__ = [
    "LATE_RENEWAL_SLACK",
    "SLACK_TTL",
    "backend_waiters",
    "has_backend_waiters",
    "kept_past",
    "wait_until",
]

LATE_RENEWAL_SLACK: Final = 0.4
"""Seconds of slack every timing assertion of the suite (and of aiodlock's own tests) keeps for
a renewal, a timer or a reply that comes late on a loaded machine (parallel test workers on a
few cores). A lease that must outlive a late renewal gets a ttl whose first renewal (due at
ttl/3) may come this late and still find it valid: ttl >= 3 * LATE_RENEWAL_SLACK, as
:data:`SLACK_TTL`. A bound on how soon something happens is the time promised plus this slack,
with a ttl long enough that the bound still tells the promise from its breach."""

SLACK_TTL: Final = 3 * LATE_RENEWAL_SLACK
"""A ttl (1.2 s) renewed every 0.4 s that outlives a renewal up to 0.8 s late (its validity
runs 2/3 ttl past each renewal's due time): twice :data:`LATE_RENEWAL_SLACK`, the other half for
the renewal's round trip and the drift margin."""


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Wait for a condition that no event reports (a waiter queued on a remote service)."""
    async with asyncio.timeout(10):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but the condition
            await asyncio.sleep(0.001)


def backend_waiters(client: aiodlock.LockClient) -> int:
    """The waiters ``client``'s backend counts (its ``waiters`` statistic; 0 without one)."""
    return int(client.statistics().backend.get("waiters", 0))


def has_backend_waiters(client: aiodlock.LockClient, count: int) -> bool:
    """Whether ``client``'s backend counts at least ``count`` waiters."""
    return backend_waiters(client) >= count


async def kept_past(lease: aiodlock.Lease, granted_until: float) -> None:
    """Wait until ``granted_until`` (the lease's ``valid_until`` right after its grant) has
    passed, then check that the lease is still held: only its keep-alive can have kept it
    (``valid_until`` moved on), however late the renewals came within their slack."""
    loop = asyncio.get_running_loop()
    await wait_until(lambda: loop.time() > granted_until or lease.lost.is_set())
    assert lease.held and not lease.lost.is_set(), "lost although it was being kept alive"
    assert lease.valid_until > granted_until
