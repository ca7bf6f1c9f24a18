"""etcd under gray failures (issue 33): a hung member routed around, a loss told at once, and
``ttl`` governing how soon a crashed holder is replaced — against real members.

A hung member is a SIGSTOPped one (``member.pause()``): its sockets stay open and nothing
answers, as on a host that froze. Latency bounds are the issue's, plus a slack constant for
a loaded two-core machine (measured first; each test prints what it measured).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Final

import pytest

import aiodlock
from tests.helpers import holder_process, told_at_once
from tests.support_etcd import EtcdCluster, EtcdProbe, etcdctl

if TYPE_CHECKING:
    from aiodlock.backends.etcd import EtcdBackend
    from tests.support_etcd import EtcdServer

pytestmark = pytest.mark.etcd

# Scheduling noise on a loaded two-core machine running two test workers and three members.
SLACK: Final = 0.4
TOLD_WITHIN: Final = 0.1  # the bound for a loss told at once


def backend_of(client: aiodlock.LockClient) -> EtcdBackend:
    from aiodlock.backends.etcd import EtcdBackend

    backend = client.backend
    assert isinstance(backend, EtcdBackend)
    return backend


def _namespace() -> str:
    return f"g{os.urandom(6).hex()}"


def _url(cluster: EtcdCluster, first: EtcdServer, path: str) -> str:
    """The cluster's URL with ``first`` as the member its clients try first."""
    members = [first, *(m for m in cluster.members if m is not first)]
    return "etcd://" + ",".join(m.endpoint for m in members) + path


@contextlib.asynccontextmanager
async def _paused(cluster: EtcdCluster, member: EtcdServer) -> AsyncIterator[None]:
    await asyncio.to_thread(member.pause)
    try:
        yield
    finally:
        await asyncio.to_thread(member.resume)
        await asyncio.to_thread(cluster.wait_serving)


async def _follower(cluster: EtcdCluster) -> EtcdServer:
    leader = await asyncio.to_thread(cluster.leader)
    return next(m for m in cluster.members if m is not leader)


# ---------------------------------------------------------------------- a hung member


async def test_connect_routes_around_a_hung_first_member(etcd_cluster: EtcdCluster) -> None:
    """The first member of the URL is SIGSTOPped (it accepts connections, never answers): a new
    client leaves it after a short per-member bound and connects to the next, well within
    ``connect_timeout`` (before: the whole 5 s spent on it, then BackendError)."""
    victim = await _follower(etcd_cluster)
    url = _url(etcd_cluster, victim, "/gray?connect_timeout=5")
    loop = asyncio.get_running_loop()
    async with _paused(etcd_cluster, victim):
        started = loop.time()
        async with aiodlock.connect(url, namespace=_namespace()) as locks:
            connected = loop.time() - started
            async with locks.lock("after-connect", timeout=5) as lease:
                assert lease.fencing_token > 0
            endpoint = backend_of(locks).statistics()["endpoint"]
    print(f"connected {connected:.3f} s after the start with the first member hung")
    assert endpoint != victim.endpoint
    assert connected < 1.0 + SLACK  # the first try's bound (0.5 s), a lease grant, noise


async def test_a_holder_routes_around_its_hung_member_and_keeps_its_session(
    etcd_cluster: EtcdCluster,
) -> None:
    """The member a client talks to is SIGSTOPped while the client holds locks: it moves to
    another member before its lease could run out, keeps the same lease (no lock lost), and a
    new lock is granted while the member hangs."""
    victim = await _follower(etcd_cluster)
    url = _url(etcd_cluster, victim, "/gray?session_ttl=6")
    loop = asyncio.get_running_loop()
    async with aiodlock.connect(url, namespace=_namespace()) as locks:
        backend = backend_of(locks)
        assert backend.statistics()["endpoint"] == victim.endpoint
        lease_before = backend.statistics()["lease_id"]
        held = [await locks.lock(f"held-{i}", ttl=30).acquire(timeout=5) for i in range(3)]
        async with _paused(etcd_cluster, victim):
            paused_at = loop.time()
            # A new lock while the member hangs: its transaction moves to the next member.
            fresh = await locks.lock("while-hung", ttl=30).acquire(timeout=5)
            granted = loop.time() - paused_at
            stats = backend.statistics()
            assert not any(lease.lost.is_set() for lease in held)
            # The held keys' watch stream moved along: a break is still told at once.
            leader = await asyncio.to_thread(etcd_cluster.leader)
            async with aiodlock.connect(
                _url(etcd_cluster, leader, "/gray"), namespace=locks.namespace
            ) as operator:
                assert await operator.break_lock("held-0") == 1
                broken_at = loop.time()
            await asyncio.wait_for(held[0].lost.wait(), 5)
            told = loop.time() - broken_at
            for lease in [*held[1:], fresh]:
                await lease.release()
    print(
        f"hung member left, new lock granted {granted:.3f} s after the pause; "
        f"a break then told in {told * 1000:.1f} ms; {stats}"
    )
    assert stats["endpoint"] != victim.endpoint and stats["member_moves"] >= 1
    assert stats["lease_id"] == lease_before and stats["leases"] == 1
    assert granted < 5.0 / 3 + SLACK  # one request's share of request_timeout on the hung one
    assert told < TOLD_WITHIN + SLACK


# ---------------------------------------------------------------------- loss told at once


async def _told_after(
    locks: aiodlock.LockClient, name: str, fault: Callable[[], Awaitable[object]]
) -> float:
    """Hold ``name`` in a body; run ``fault()``; seconds from its end to the body's
    cancellation (the holder's ``LockLostError``)."""
    loop = asyncio.get_running_loop()
    inside = asyncio.Event()
    told_at = 0.0

    async def hold() -> None:
        nonlocal told_at
        with pytest.raises(aiodlock.LockLostError):
            async with locks.lock(name, ttl=30):
                inside.set()
                try:
                    await asyncio.sleep(60)
                finally:
                    told_at = loop.time()

    holding = asyncio.create_task(hold())
    await inside.wait()
    await fault()
    done_at = loop.time()
    await asyncio.wait_for(holding, 10)
    return max(told_at - done_at, 0.0)


async def test_a_broken_lock_is_told_at_once(etcd_server: EtcdServer) -> None:
    """``break_lock()`` from another client: the holder's body is cancelled with LockLostError
    within 100 ms (its client watches its own key), 20 times over."""
    ns = _namespace()
    url = f"{etcd_server.url}/gray"
    async with aiodlock.connect(url, namespace=ns) as a, aiodlock.connect(url, namespace=ns) as b:

        async def fault() -> None:
            assert await b.break_lock("job") == 1

        took = [await _told_after(a, "job", fault) for _ in range(20)]
    print(
        f"break -> LockLostError: max {max(took) * 1000:.1f} ms, "
        f"median {sorted(took)[10] * 1000:.1f} ms"
    )
    told_at_once(took, TOLD_WITHIN + SLACK)


async def test_a_deleted_key_or_a_revoked_lease_is_told_at_once(etcd_server: EtcdServer) -> None:
    """The holder's key deleted by anyone (a plain etcd client), or its lease revoked
    (``etcdctl lease revoke``): told within 100 ms."""
    ns = _namespace()
    url = f"{etcd_server.url}/gray"
    probe = await EtcdProbe(etcd_server.endpoint, "/gray").start()
    try:
        async with aiodlock.connect(url, namespace=ns) as locks:

            async def delete() -> None:
                await probe.client.delete_prefix(probe.name_prefix(ns, "deleted"))

            async def revoke() -> None:
                lease = backend_of(locks).statistics()["lease_id"]
                await asyncio.to_thread(etcdctl, etcd_server.endpoint, "lease", "revoke", lease)

            deleted = [await _told_after(locks, "deleted", delete) for _ in range(5)]
            revoked = [await _told_after(locks, "revoked", revoke) for _ in range(3)]
    finally:
        await probe.aclose()
    print(
        f"key deleted -> told: max {max(deleted) * 1000:.1f} ms; lease revoked -> told: "
        f"max {max(revoked) * 1000:.1f} ms"
    )
    told_at_once(deleted, TOLD_WITHIN + SLACK)
    told_at_once(revoked, TOLD_WITHIN + SLACK)


def _etcd_tasks() -> int:
    """The etcd backend's tasks running now (the core's own keep-alives not counted)."""
    return sum(t.get_name().startswith("aiodlock-etcd") for t in asyncio.all_tasks())


async def test_held_keys_share_one_watch_stream(etcd_server: EtcdServer) -> None:
    """Fifty held locks are watched on the client's one stream (a watch id each, no task or
    stream per grant): breaking one tells that holder only; releases cancel the watches."""
    ns = _namespace()
    url = f"{etcd_server.url}/gray"
    async with aiodlock.connect(url, namespace=ns) as a, aiodlock.connect(url, namespace=ns) as b:
        backend = backend_of(a)
        tasks_before = _etcd_tasks()
        held = [await a.lock(f"many-{i}").acquire(timeout=5) for i in range(50)]
        assert backend.statistics()["watched_keys"] == 50
        assert _etcd_tasks() - tasks_before <= 2  # the stream's, not one per grant
        assert await b.break_lock("many-7") == 1
        await asyncio.wait_for(held[7].lost.wait(), 5)
        assert [i for i, lease in enumerate(held) if lease.lost.is_set()] == [7]
        for lease in held[:7] + held[8:]:
            await lease.release()
        assert backend.statistics()["watched_keys"] == 0


async def test_aiodlock_break_on_the_command_line_is_told_at_once(etcd_server: EtcdServer) -> None:
    """``aiodlock break URL NAME --yes`` in a process of its own: the holder is told within
    100 ms of the command's exit."""
    ns = _namespace()
    url = f"{etcd_server.url}/gray"

    async def cli_break() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiodlock", "break", url, "job", "--namespace", ns, "--yes",
            stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert await proc.wait() == 0

    async with aiodlock.connect(url, namespace=ns) as locks:
        took = await _told_after(locks, "job", cli_break)
    print(f"aiodlock break -> LockLostError {took * 1000:.1f} ms after the command exited")
    assert took < TOLD_WITHIN + SLACK


# ---------------------------------------------------------------------- ttl governs


async def test_a_sigkilled_holder_is_replaced_within_its_ttl(etcd_cluster: EtcdCluster) -> None:
    """A holder process with ``ttl=3`` (and the default ``session_ttl`` of 10 s) is SIGKILLed:
    its key is on the 3 s lease of its ttl, so the waiter is granted within ttl + 1 s (before:
    9.35 s, the client's one 10 s lease)."""
    ns = _namespace()
    ttl = 3
    url = f"{etcd_cluster.url}/gray"
    async with (
        holder_process(url, ns, "stock", ttl) as holder,
        aiodlock.connect(url, namespace=ns) as locks,
    ):
        first = holder.token
        assert await locks.lock("stock").try_acquire() is None
        killed_at = holder.kill()
        lease = await locks.lock("stock").acquire(timeout=15)
        waited = asyncio.get_running_loop().time() - killed_at
        await lease.release()
    print(f"ttl={ttl}: SIGKILLed holder replaced after {waited:.3f} s")
    assert lease.fencing_token > first
    # Its last keep-alive was at most ttl/4 before the kill; etcd expires leases in 0.5 s
    # rounds.
    assert ttl * 0.7 <= waited <= ttl + 1


async def test_each_ttl_has_a_lease_of_its_own(etcd_server: EtcdServer) -> None:
    """Locks of ttl 3, 3.5 and 30 (``session_ttl=10``): keys on leases of 3, 4 and 10 s, each
    granted at its first use and kept alive; one lease per distinct whole-second ttl."""
    ns = _namespace()
    probe = await EtcdProbe(etcd_server.endpoint, "/gray").start()
    try:
        async with aiodlock.connect(f"{etcd_server.url}/gray", namespace=ns) as locks:
            backend = backend_of(locks)
            assert list(backend.statistics()["sessions"]) == [10]  # granted at open
            ttls = {}
            for name, ttl in (("a", 3.0), ("b", 3.5), ("c", 30.0), ("d", 2.5)):
                async with locks.lock(name, ttl=ttl):
                    [(_, meta)] = await probe.keys(probe.name_prefix(ns, name))
                    reply = await probe.client.get_lease_info(meta.lease)
                    ttls[name] = reply.grantedTTL
            sessions = backend.statistics()["sessions"]
    finally:
        await probe.aclose()
    assert ttls == {"a": 3, "b": 4, "c": 10, "d": 3}
    assert sorted(sessions) == [3, 4, 10] and all(sessions.values())
