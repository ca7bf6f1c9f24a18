"""Leases: expiry of a crashed holder, loss noticed by the watchdog, ``max_hold``, a lost
lease forgotten at once, and a closing client ending its waiters and holders."""

# ruff: noqa: PT012 - test code, held to the rules of tests/ (pyproject.toml)

from __future__ import annotations

import asyncio

import pytest

import aiodlock

from .. import abandon, settle
from ._fixtures import Target
from ._needs import LockKind, needs_probe
from ._timing import SLACK_TTL, kept_past, wait_until

__all__ = [
    "test_acquire_outside_async_with_sets_lost",
    "test_closing_a_client_ends_its_waiters_and_holders_alike",
    "test_crashed_holder_is_replaced_after_expiry",
    "test_lost_lease_is_forgotten_at_once",
    "test_max_hold_stops_renewing",
    "test_release_is_idempotent_and_lost_release_raises",
    "test_watchdog_cancels_body_when_lock_is_broken",
]


@pytest.mark.asyncio
async def test_crashed_holder_is_replaced_after_expiry(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """A holder that stops renewing (crashed) loses the lock at expiry, not before."""
    loop = asyncio.get_running_loop()
    # Counted from before the request: the service granted the lease after this instant, so
    # a late reply (a stalled machine) cannot make an expiry on time look early.
    asked_at = loop.time()
    lease = await make(locks, "crash", ttl=0.5).acquire()
    abandon(locks, lease)  # the "process" dies: no more renewals, no release
    successor = await make(other, "crash", ttl=5).acquire(timeout=3)
    assert loop.time() - asked_at >= 0.45  # not before the lease ran out
    assert successor.fencing_token > lease.fencing_token
    await successor.release()


@needs_probe
@pytest.mark.asyncio
async def test_watchdog_cancels_body_when_lock_is_broken(
    locks: aiodlock.LockClient, make: LockKind, aiodlock_target: Target
) -> None:
    body_cancelled = asyncio.Event()
    # Renewed every ttl/3 (1 s); the lease's own expiry would end it no sooner than 2 s
    # after the break: a loaded machine's late renewal still comes first.
    ttl = 3.0

    with pytest.raises(aiodlock.LockLostError) as caught:
        async with make(locks, "fragile", ttl=ttl) as lease:
            try:
                # A backend that watches its lock (etcd, ZooKeeper) may cancel the body while
                # the probe is still at work: that is a body cancelled too.
                await aiodlock_target.break_lock(locks, "fragile")
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                body_cancelled.set()
                raise
    assert body_cancelled.is_set()
    assert lease.lost.is_set()
    # The service said so (a refused renewal, or a pushed loss): not the lease's own
    # validity running out, which is how a lease nobody watches ends (a clock bound here
    # failed whenever a loaded machine stalled the test for a second).
    message = str(caught.value)
    assert "renewal refused" in message or "reported it gone" in message, message


@needs_probe
@pytest.mark.asyncio
async def test_release_is_idempotent_and_lost_release_raises(
    locks: aiodlock.LockClient, make: LockKind, aiodlock_target: Target
) -> None:
    lease = await make(locks, "twice").acquire()
    await lease.release()
    await lease.release()
    assert not lease.held

    # A lease long enough to still be there when the probe breaks it on a loaded machine
    # (scanning every master of a cluster; its renewals, every 0.8 s, may come 1.6 s late),
    # short enough that renewals notice at once.
    lease = await make(locks, "gone", ttl=2 * SLACK_TTL).acquire()
    await aiodlock_target.break_lock(locks, "gone")
    await asyncio.wait_for(lease.lost.wait(), 5)
    with pytest.raises(aiodlock.LockNotOwnedError):
        await lease.release()


@pytest.mark.asyncio
async def test_max_hold_stops_renewing(locks: aiodlock.LockClient, make: LockKind) -> None:
    # One renewal (at ttl/3) comes before max_hold (ttl/2), none after. The lease must last
    # until then on its own: a grant and a renewal slower than ttl - ttl/3 together would let
    # it run out first, which is a loss too, but not max_hold's; SLACK_TTL leaves 0.8 s.
    ttl = SLACK_TTL
    with pytest.raises(aiodlock.LockLostError, match="max_hold"):
        async with make(locks, "hung", ttl=ttl, max_hold=ttl / 2):
            await asyncio.sleep(10)


@needs_probe
@pytest.mark.asyncio
async def test_acquire_outside_async_with_sets_lost(
    locks: aiodlock.LockClient, make: LockKind, aiodlock_target: Target
) -> None:
    # Renewed every ttl/3, it outlives a renewal up to 2 x LATE_RENEWAL_SLACK late.
    lease = await make(locks, "bg", ttl=SLACK_TTL).acquire()
    assert locks.statistics().leases == 1
    await kept_past(lease, lease.valid_until)  # kept alive without an ``async with``
    await aiodlock_target.break_lock(locks, "bg")
    await asyncio.wait_for(lease.lost.wait(), 2)
    with pytest.raises(aiodlock.LockLostError):
        lease.assert_held()


@pytest.mark.asyncio
async def test_lost_lease_is_forgotten_at_once(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """A lease taken with ``acquire()`` and lost (here: ``max_hold`` ran out) is dropped from
    the client's bookkeeping when it is lost, not when (or if) it is released — a job that
    takes a lock once per period and never releases a lost one must not grow the client —
    and its ``release()`` reports the loss at once, without waiting for the service."""
    leases = [
        await make(locks, f"dropped{i}", ttl=SLACK_TTL, max_hold=0.05).acquire() for i in range(3)
    ]
    # Each is lost once its unrenewed ttl runs out, maybe before the last grant on a slow
    # machine: the bookkeeping holds exactly those not lost yet.
    assert locks.statistics().leases == sum(not lease.lost.is_set() for lease in leases) > 0
    for lease in leases:
        await asyncio.wait_for(lease.lost.wait(), SLACK_TTL + 5)
    assert locks.statistics().leases == 0
    # At once: the release raises in its first step, without awaiting anything (a service
    # round trip, or a timer), whatever the machine's load.
    releasing = leases[0].release()
    try:
        with pytest.raises(aiodlock.LockNotOwnedError):
            releasing.send(None)
    finally:
        releasing.close()
    await settle(locks)
    async with make(other, "dropped0", timeout=2):
        pass  # given back on the service (or expired)


@pytest.mark.asyncio
async def test_closing_a_client_ends_its_waiters_and_holders_alike(
    aiodlock_target: Target, locks: aiodlock.LockClient, make: LockKind
) -> None:
    """``aclose()`` with a task waiting and a task inside ``async with``: on every backend the
    waiter raises ``RuntimeError`` at once (not a timeout, not the backend's closed-connection
    error), the body is cancelled and raises ``LockLostError``, the held lock is free for
    others at once, nothing is left on the service, and the closed client refuses new work."""
    closing = aiodlock_target.connect()
    await closing.__aenter__()
    inside = asyncio.Event()

    async def hold_forever() -> None:
        async with make(closing, "held"):
            inside.set()
            await asyncio.Event().wait()

    async with make(locks, "busy"):
        waiting = make(closing, "busy", timeout=30)
        waiter = asyncio.create_task(waiting.acquire())
        holder = asyncio.create_task(hold_forever())
        await asyncio.wait_for(inside.wait(), 10)
        await wait_until(lambda: waiting.statistics().waiting == 1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await closing.aclose()
        assert loop.time() - started < 2
        with pytest.raises(RuntimeError, match="closed while waiting"):
            await waiter
        with pytest.raises(aiodlock.LockLostError):
            await holder
        taken = await make(locks, "held").try_acquire()
        assert taken is not None
        await taken.release()
    with pytest.raises(RuntimeError):
        await make(closing, "busy").acquire()
    await aiodlock_target.assert_no_leftovers(locks)
