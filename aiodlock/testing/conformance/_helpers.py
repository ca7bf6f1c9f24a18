"""Lease and lock helpers: ``lease.remaining``, ``lease.extend()``, ``lock.locked()``, and the
client's statistics (totals and per-name figures)."""

from __future__ import annotations

import asyncio

import pytest

import aiodlock
from aiodlock.backends import Capability

from .. import abandon
from ._fixtures import Target
from ._needs import LockKind, needs_probe, requires
from ._timing import LATE_RENEWAL_SLACK, SLACK_TTL, kept_past

__all__ = [
    "test_extend_after_release_is_a_runtime_error",
    "test_extend_changes_the_ttl_where_the_backend_can",
    "test_extend_of_a_lost_lease_raises_lock_lost",
    "test_extend_renews_now",
    "test_extend_to_a_shorter_ttl_is_kept_alive_at_it",
    "test_extend_when_the_renewal_finds_the_lock_gone",
    "test_locked_asks_the_service",
    "test_locked_escapes_glob_characters",
    "test_remaining_counts_down_and_is_zero_once_over",
    "test_statistics_totals_and_per_name",
]

LONG_TTL = 30.0  # no renewal comes within a test's few reads of `remaining`


def _ttl_backend(client: aiodlock.LockClient) -> bool:
    return Capability.TTL_LEASE in client.backend.capabilities


async def _lost_lease(client: aiodlock.LockClient, name: str) -> aiodlock.Lease:
    """A lease lost through ``max_hold`` (renewals stop, its validity runs out)."""
    lease = await client.lock(name, ttl=SLACK_TTL, max_hold=0.05).acquire()
    await asyncio.wait_for(lease.lost.wait(), SLACK_TTL + 5)
    return lease


@pytest.mark.asyncio
async def test_remaining_counts_down_and_is_zero_once_over(
    locks: aiodlock.LockClient, make: LockKind
) -> None:
    """``remaining`` is the local validity left: at most the ttl, dropping between renewals
    (on a TTL backend: a session backend also bounds it by its session, which its keep-alive
    moves on), and 0 once the lease is released or lost."""
    lease = await make(locks, "remaining", ttl=LONG_TTL).acquire()
    loop = asyncio.get_running_loop()
    first = lease.remaining
    assert 0 < first <= LONG_TTL
    assert abs(first - (lease.valid_until - loop.time())) < 0.01
    if _ttl_backend(locks):
        await asyncio.sleep(0.05)  # time passing is what is measured
        assert lease.remaining < first
    await lease.release()
    assert lease.remaining == 0.0

    lost = await _lost_lease(locks, "remaining-lost")
    assert lost.remaining == 0.0


@pytest.mark.asyncio
async def test_extend_renews_now(locks: aiodlock.LockClient, make: LockKind) -> None:
    """``extend()`` renews at once and returns the new ``remaining``; on a TTL backend that is
    back up to about the ttl."""
    lease = await make(locks, "extend", ttl=LONG_TTL).acquire()
    try:
        if _ttl_backend(locks):
            await asyncio.sleep(0.2)  # let the validity run down first
            before = lease.remaining
            after = await lease.extend()
            assert after > before + 0.1
            assert after <= LONG_TTL
        else:
            after = await lease.extend()
            assert 0 < after <= LONG_TTL
        assert abs(lease.remaining - after) < 0.05
        assert lease.held
    finally:
        await lease.release()


@pytest.mark.asyncio
async def test_extend_changes_the_ttl_where_the_backend_can(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    """On a TTL backend ``extend(ttl)`` asks the service for the new ttl: a holder that dies
    right after extending keeps the lock that long, not the old ttl. On a session backend a
    different ttl is UnsupportedError (the session's timeout governs); the same ttl is fine."""
    lease = await locks.lock("retimed", ttl=SLACK_TTL).acquire()
    if not _ttl_backend(locks):
        with pytest.raises(aiodlock.UnsupportedError, match="session"):
            await lease.extend(LONG_TTL)
        assert lease.held
        assert await lease.extend(SLACK_TTL) > 0
        await lease.release()
        return
    longer = 10.0
    remaining = await lease.extend(longer)
    assert SLACK_TTL < remaining <= longer
    abandon(locks, lease)  # the holder dies: no renewal, no release
    # Twice the old ttl: free by then had the service kept the old one.
    with pytest.raises(aiodlock.LockTimeoutError):
        await other.lock("retimed").acquire(timeout=2 * SLACK_TTL)


@requires(Capability.TTL_LEASE)
@pytest.mark.asyncio
async def test_extend_to_a_shorter_ttl_is_kept_alive_at_it(locks: aiodlock.LockClient) -> None:
    """After ``extend(shorter)`` the keep-alive renews at the new ttl: the lease outlives its
    new validity (a keep-alive still timed by the old ttl would let it run out)."""
    lease = await locks.lock("shortened", ttl=LONG_TTL).acquire()
    remaining = await lease.extend(SLACK_TTL)
    assert 0 < remaining <= SLACK_TTL
    await kept_past(lease, lease.valid_until)
    assert lease.remaining <= SLACK_TTL
    await lease.release()


@pytest.mark.asyncio
async def test_extend_of_a_lost_lease_raises_lock_lost(locks: aiodlock.LockClient) -> None:
    lease = await _lost_lease(locks, "lost-extend")
    with pytest.raises(aiodlock.LockLostError):
        await lease.extend()
    with pytest.raises(aiodlock.LockNotOwnedError):
        await lease.release()
    with pytest.raises(RuntimeError, match="released"):
        await lease.extend()


@needs_probe
@pytest.mark.asyncio
async def test_extend_when_the_renewal_finds_the_lock_gone(
    locks: aiodlock.LockClient, aiodlock_target: Target
) -> None:
    """A lock broken under its holder: ``extend()`` raises LockLostError (told by the service's
    loss signal, or by its own renewal being refused) and the lease is lost."""
    lease = await locks.lock("gone", ttl=LONG_TTL).acquire()
    await aiodlock_target.break_lock(locks, "gone")
    # A probe may end the holder's session in the background (SQL): nothing tells us when it
    # is done but the service itself, so ask it.
    async with asyncio.timeout(10):
        while any(info.name == "gone" for info in await locks.inspect()):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    with pytest.raises(aiodlock.LockLostError):
        await lease.extend()
    assert lease.lost.is_set()
    assert lease.remaining == 0.0


@pytest.mark.asyncio
async def test_extend_after_release_is_a_runtime_error(locks: aiodlock.LockClient) -> None:
    lease = await locks.lock("released").acquire()
    await lease.release()
    with pytest.raises(RuntimeError, match="released"):
        await lease.extend()
    with pytest.raises(RuntimeError, match="released"):
        await lease.extend(SLACK_TTL)


@pytest.mark.asyncio
async def test_locked_asks_the_service(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """``locked()`` is False while free, True while another client holds the lock (and while
    this one does), False again once it is released."""
    mine = make(locks, "asked")
    assert await mine.locked() is False
    lease = await make(other, "asked").acquire()
    try:
        assert await mine.locked() is True
        assert await make(locks, "asked-not").locked() is False
    finally:
        await lease.release()
    assert await mine.locked() is False
    async with mine:
        assert await make(other, "asked").locked() is True


@pytest.mark.asyncio
async def test_locked_escapes_glob_characters(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    """A name is a name, not a pattern: "job*" is not held because "jobX" is."""
    lease = await other.lock("jobX").acquire()
    try:
        for pattern in ("job*", "job?", "job[X]", "j*"):
            assert await locks.lock(pattern).locked() is False, pattern
        assert await locks.lock("jobX").locked() is True
    finally:
        await lease.release()
    async with other.lock("job*"):
        assert await locks.lock("job*").locked() is True
        assert await locks.lock("jobX").locked() is False


@pytest.mark.asyncio
async def test_statistics_totals_and_per_name(
    locks: aiodlock.LockClient, other: aiodlock.LockClient
) -> None:
    """The client counts grants, timeouts and losses, and waits by bucket, in total and per
    name across lock objects (a fresh lock object starts at zero; the name does not)."""
    for _ in range(2):
        async with locks.lock("counted"):
            pass
    assert locks.lock("counted").statistics().acquired == 0  # a fresh object
    named = locks.statistics().by_name["counted"]
    assert (named.grants, named.timeouts, named.losses) == (2, 0, 0)
    assert sum(named.wait_histogram.values()) == 2

    async with other.lock("counted"):
        with pytest.raises(aiodlock.LockTimeoutError):
            await locks.lock("counted").acquire(timeout=LATE_RENEWAL_SLACK / 4)
    await _lost_lease(locks, "dropped")

    stats = locks.statistics()
    assert (stats.grants, stats.timeouts, stats.losses) == (3, 1, 1)
    assert sum(stats.wait_histogram.values()) == stats.grants
    assert stats.by_name["counted"].timeouts == 1
    assert stats.by_name["dropped"].losses == 1
    assert stats.by_name["dropped"].grants == 1
    assert "counted" in other.statistics().by_name  # each client counts its own
    assert other.statistics().by_name["counted"].grants == 1
