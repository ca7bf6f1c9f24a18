"""What operators use (``Capability.INSPECT``, ``Capability.BREAK``): ``inspect()`` shows
holders, tokens and waiters; ``break_lock()`` frees a lock under its holder."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

import aiodlock
from aiodlock.backends import Capability

from .. import settle
from ._fixtures import Target
from ._needs import LockKind, requires
from ._timing import LATE_RENEWAL_SLACK

__all__ = [
    "test_break_lock_frees_it_moves_the_token_on_and_cancels_the_holder",
    "test_inspect_counts_a_waiter_where_the_backend_can_tell",
    "test_inspect_names_each_holders_identity",
    "test_inspect_shows_holder_and_token_then_nothing_after_release",
    "test_namespaces_name_the_one_in_use",
]

# Every character a separator could trip on: space, "-", ":", "/", "@", quotes, non-ASCII.
ODD_IDENTITY = "worker 7 @ pod/shop-api-5f9c:1234 'é'"


@requires(Capability.INSPECT)
@pytest.mark.asyncio
async def test_inspect_shows_holder_and_token_then_nothing_after_release(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """An operator's view (another client): the held lock, its holder and its newest token."""
    lease = await make(locks, "shown", ttl=10).acquire()
    try:
        infos = await other.inspect("sh*n")
        assert [(i.name, i.kind) for i in infos] == [("shown", make.kind)]
        info = infos[0]
        assert [h.owner for h in info.holders] == [lease.owner]
        expires_in = info.holders[0].expires_in
        assert expires_in is None or 0 < expires_in <= 10
        assert info.fencing_token == lease.fencing_token
        assert info.waiters is None or info.waiters == 0
        assert await other.inspect("other*") == []
    finally:
        await lease.release()
    await settle(other)
    assert await other.inspect() == []


@requires(Capability.INSPECT)
@pytest.mark.asyncio
async def test_inspect_names_each_holders_identity(
    aiodlock_target: Target, other: aiodlock.LockClient, make: LockKind
) -> None:
    """Each holder shows the ``identity`` of the client that holds it, stored with the lock:
    an odd one given as an option, and the default ``host:pid`` of another client."""
    async with aiodlock_target.connect(identity=ODD_IDENTITY) as odd:
        assert odd.identity == ODD_IDENTITY
        lease = await make(odd, "named", ttl=10).acquire()
        try:
            (info,) = await other.inspect("named")
            assert [(h.owner, h.identity) for h in info.holders] == [(lease.owner, ODD_IDENTITY)]
        finally:
            await lease.release()
        await settle(odd)
    assert other.identity == f"{socket.gethostname()}:{os.getpid()}"
    async with make(other, "named by default", ttl=10) as mine:
        (info,) = await other.inspect("named by default")
        assert [(h.owner, h.identity) for h in info.holders] == [(mine.owner, other.identity)]


@requires(Capability.INSPECT)
@pytest.mark.asyncio
async def test_namespaces_name_the_one_in_use(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """``namespaces()`` names the namespace of a held lock, for ``inspect --all-namespaces``;
    its locks are found by ``inspect(namespace=...)`` from a client of another namespace."""
    async with make(locks, "listed", ttl=10) as lease:
        assert locks.namespace in await other.namespaces()
        (info,) = await other.inspect("listed", namespace=locks.namespace)
        assert [h.owner for h in info.holders] == [lease.owner]


@requires(Capability.INSPECT)
@pytest.mark.asyncio
async def test_inspect_counts_a_waiter_where_the_backend_can_tell(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """One waiter: ``waiters`` is 1 once it waits at the service, or ``None`` throughout if
    the backend cannot tell (Redis pub/sub waiters are invisible to the server)."""
    lease = await make(locks, "queued", ttl=10).acquire()
    waiting = asyncio.create_task(make(other, "queued", ttl=10).acquire(timeout=30))
    try:
        async with asyncio.timeout(10):
            while True:
                (info,) = await locks.inspect("queued")
                if info.waiters != 0:
                    break
                await asyncio.sleep(0.01)  # the waiter reaches the service in its own time
        assert info.waiters is None or info.waiters == 1
        assert [h.owner for h in info.holders] == [lease.owner]
    finally:
        await lease.release()
        await (await waiting).release()


@requires(Capability.BREAK)
@pytest.mark.asyncio
async def test_break_lock_frees_it_moves_the_token_on_and_cancels_the_holder(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    """An operator breaks a held lock: the holder's body is cancelled with LockLostError
    within its renewal interval, and a waiter gets the lock with a larger token."""
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()
    body_cancelled = asyncio.Event()
    held: list[aiodlock.Lease] = []

    ttl = 4 * LATE_RENEWAL_SLACK  # renewed every ttl/3; an expiry comes 2/3 ttl or more later

    async def holder() -> None:
        async with make(locks, "stuck", ttl=ttl) as lease:
            held.append(lease)
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                body_cancelled.set()
                raise

    holding = asyncio.create_task(holder())
    await entered.wait()
    waiting = asyncio.create_task(make(other, "stuck", ttl=5).acquire(timeout=10))
    assert await other.break_lock("stuck", kind=make.kind.value) == 1
    broken_at = loop.time()
    with pytest.raises(aiodlock.LockLostError):
        await holding
    assert body_cancelled.is_set()
    # At its next renewal (ttl/3, plus slack: 0.93 s), not at expiry (2/3 ttl, 1.07 s, or more).
    assert loop.time() - broken_at < ttl / 3 + LATE_RENEWAL_SLACK
    successor = await waiting
    assert successor.fencing_token > held[0].fencing_token
    await successor.release()
    assert await other.break_lock("stuck", kind=make.kind.value) == 0
