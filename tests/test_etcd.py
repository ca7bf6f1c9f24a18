"""etcd-specific behaviour and faults, against real members (tests/support_etcd.py).

The conformance suite already runs every lock kind on a single member and on a three-member
cluster (tests/backends/test_etcd.py); this file covers what only etcd has: the key layout
and create-revision fencing, the lease (revoked behind our back, or left to expire by a
killed holder process), URLs and unreachable clusters, inspect/break, and the cluster's
faults: a leader killed while clients contend, a member paused under its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from typing import TYPE_CHECKING

import pytest

import aiodlock
from aiodlock.backends import Kind, LockSpec
from aiodlock.testing import History, settle
from tests.helpers import holder_process, wait_until
from tests.support_etcd import EtcdCluster, EtcdProbe, EtcdServer, etcdctl

if TYPE_CHECKING:
    from aiodlock.backends.etcd import EtcdBackend
    from tests.servers import TLSFiles

pytestmark = pytest.mark.etcd


def backend_of(client: aiodlock.LockClient) -> EtcdBackend:
    from aiodlock.backends.etcd import EtcdBackend

    backend = client.backend
    assert isinstance(backend, EtcdBackend)
    return backend


def _namespace() -> str:
    return f"e{os.urandom(6).hex()}"


def _lease_of(client: aiodlock.LockClient) -> int:
    lease = backend_of(client).statistics()["lease_id"]
    assert lease is not None
    return int(lease, 16)


# ---------------------------------------------------------------------- URLs and connecting


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("etcd://", "needs a host"),
        ("etcd://user@127.0.0.1:2379", "both a user name and a password"),
        ("etcd://127.0.0.1:2379?session_ttl=-1", "session_ttl"),
        ("etcd://127.0.0.1:2379?ssl_key=/nonexistent.pem", "ssl_key needs ssl_cert"),
        ("etcd://127.0.0.1:2379?ssl_ca=/nonexistent/ca.pem", "ssl_ca"),
        ("etcd://127.0.0.1:2379?tls_key=/nonexistent.pem", "tls_key needs tls_cert"),
        ("etcd://127.0.0.1:2379?tls_ca=/nonexistent/ca.pem", "tls_ca"),
        ("etcd://127.0.0.1:2379?ssl_ca=/a.pem&tls_ca=/b.pem", "two names of one option"),
        ("etcd://127.0.0.1:2379?tls=false&tls_ca=/a.pem", "tls=false contradicts tls_ca"),
        ("etcd://127.0.0.1:2379?tls_verify=false", "cannot skip the certificate check"),
    ],
)
def test_bad_urls_are_value_errors(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        aiodlock.connect(url)


async def test_unreachable_cluster_is_a_backend_error_within_connect_timeout() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    loop = asyncio.get_running_loop()
    started = loop.time()
    url = f"etcd://secret-user:hunter2@127.0.0.1:{port},127.0.0.1:{port}?connect_timeout=1"
    with pytest.raises(aiodlock.BackendError, match="within 1 s") as info:
        async with aiodlock.connect(url):
            pytest.fail("connected to nothing")
    assert loop.time() - started < 4
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("spelling", ["ssl", "tls"])
async def test_tls_with_a_client_certificate(tls_files: TLSFiles, spelling: str) -> None:
    """A member that serves TLS only and requires a client certificate: reached with the
    ``tls_ca``/``tls_cert``/``tls_key`` options (or their ``ssl_`` spellings); without a
    certificate, BackendError."""
    with EtcdServer(tls=tls_files) as server:
        base = f"etcd://{server.endpoint}/tls?{spelling}_ca={tls_files.ca}"
        url = f"{base}&{spelling}_cert={tls_files.client}"
        async with (
            aiodlock.connect(url, namespace=_namespace()) as locks,
            locks.lock("secure") as lease,
        ):
            assert lease.fencing_token > 0
        with pytest.raises(aiodlock.BackendError):
            async with aiodlock.connect(f"{base}&connect_timeout=2"):
                pytest.fail("connected without a client certificate")


async def test_user_and_password() -> None:
    """etcd authentication: the URL's user and password get a token; a wrong password is a
    BackendError that does not show it. A separate single member, since auth is cluster-wide."""
    with EtcdServer() as server:
        ctl = server.endpoint
        etcdctl(ctl, "user", "add", "root:R00t-pw!")
        etcdctl(ctl, "auth", "enable")
        good = f"etcd://root:R00t-pw%21@{server.endpoint}/auth"
        async with aiodlock.connect(good, namespace=_namespace()) as locks:
            async with locks.lock("guarded") as lease:
                assert lease.fencing_token > 0
            assert "R00t" not in repr(locks)
        bad = f"etcd://root:Wr0ng-pw@{server.endpoint}/auth?connect_timeout=2"
        with pytest.raises(aiodlock.BackendError) as info:
            async with aiodlock.connect(bad):
                pytest.fail("authenticated with a wrong password")
        assert "Wr0ng" not in str(info.value)


# ---------------------------------------------------------------------- layout and fencing


async def test_key_layout_fencing_by_create_revision_and_nothing_left(
    etcd_server: EtcdServer,
) -> None:
    """The key lives under <prefix>/<namespace>/<name>/<family>/<lease>-<owner>, on the
    client's lease; the fencing token is its create revision; release leaves nothing."""
    ns = _namespace()
    probe = await EtcdProbe(etcd_server.endpoint, "/layout").start()
    try:
        async with aiodlock.connect(f"{etcd_server.url}/layout", namespace=ns) as locks:
            async with locks.lock("a/b c") as lease:
                keys = await probe.keys(probe.name_prefix(ns, "a/b c"))
                assert len(keys) == 1
                key, meta = keys[0]
                assert key.startswith(f"/layout/{ns}/a%2Fb%20c/mutex/".encode())
                assert key.endswith(f"{_lease_of(locks):x}-".encode() + key.split(b"-")[-1])
                assert meta.lease == _lease_of(locks)
                assert lease.fencing_token == meta.create_revision
            async with locks.write_lock("a/b c") as again:
                assert again.fencing_token > lease.fencing_token
            assert await probe.leftovers(ns) == []
    finally:
        await probe.aclose()


async def test_an_attempt_sent_again_finds_its_own_key(etcd_server: EtcdServer) -> None:
    """The key is a function of the lease and the owner, and is created only if absent: an
    attempt sent again (its first reply lost with a member, or its caller cancelled) finds
    the key the first one made — same create revision, one key — instead of queueing twice."""
    ns = _namespace()
    probe = await EtcdProbe(etcd_server.endpoint, "/again").start()
    url = f"{etcd_server.url}/again"
    try:
        async with (
            aiodlock.connect(url, namespace=ns) as a,
            aiodlock.connect(url, namespace=ns) as b,
        ):
            holder = await a.lock("job").acquire()
            backend = backend_of(b)
            spec = LockSpec(ns, "job", Kind.MUTEX)
            first = await backend.try_acquire(spec, "0123abcd", 30)
            async with backend.waiter(spec, "0123abcd"):  # same step: the key is claimed
                mine = [
                    k
                    for k in await probe.keys(probe.name_prefix(ns, "job"))
                    if k[0].endswith(b"-0123abcd")
                ]
                [(key, meta)] = mine
                for entry in backend._entries.values():
                    entry.stale = True  # as after a reconnect: the next attempt sends it again
                again = await backend.try_acquire(spec, "0123abcd", 30)
                keys = await probe.keys(probe.name_prefix(ns, "job"))
            assert (type(first).__name__, type(again).__name__) == ("Busy", "Busy")
            assert [k for k, _ in keys].count(key) == 1 and len(keys) == 2
            assert dict(keys)[key].create_revision == meta.create_revision
            assert await backend.release(spec, "0123abcd") is False  # it only queued
            await settle(b)
            await holder.release()
            assert await probe.leftovers(ns) == []
    finally:
        await probe.aclose()


async def test_inspect_and_break(etcd_server: EtcdServer) -> None:
    ns = _namespace()
    url = f"{etcd_server.url}/inspect?session_ttl=5"
    async with aiodlock.connect(url, namespace=ns) as a, aiodlock.connect(url, namespace=ns) as b:
        holder = await a.lock("job").acquire()
        waiting = asyncio.create_task(b.lock("job").acquire(timeout=10))
        await wait_until(lambda: backend_of(b).statistics()["waiters"] == 1)
        [info] = await backend_of(a).inspect(ns)
        assert (info.name, info.kind, info.waiters) == ("job", Kind.MUTEX, 1)
        [who] = info.holders
        assert info.fencing_token == holder.fencing_token
        assert who.expires_in is not None and 0 < who.expires_in <= 5
        assert await backend_of(a).inspect(ns, "other*") == []
        spec = LockSpec(ns, "job", Kind.MUTEX)
        assert await backend_of(b).break_lock(spec) == 1
        await asyncio.wait_for(holder.lost.wait(), 2)
        successor = await waiting
        assert successor.fencing_token > holder.fencing_token
        await successor.release()


# ---------------------------------------------------------------------- the lease


async def test_lease_revoked_with_etcdctl_tells_the_holder_and_grants_the_waiter(
    etcd_cluster: EtcdCluster,
) -> None:
    ns = _namespace()
    url = f"{etcd_cluster.url}/revoke?session_ttl=10"
    loop = asyncio.get_running_loop()
    async with aiodlock.connect(url, namespace=ns) as a, aiodlock.connect(url, namespace=ns) as b:
        inside = asyncio.Event()
        revoked_at = 0.0
        told_at = 0.0

        async def hold() -> None:
            nonlocal told_at
            with pytest.raises(aiodlock.LockLostError):
                async with a.lock("stock", ttl=30) as lease:
                    inside.set()
                    try:
                        await asyncio.sleep(30)
                    finally:
                        told_at = loop.time()
            assert lease.lost.is_set()

        holding = asyncio.create_task(hold())
        await inside.wait()
        waiting = asyncio.create_task(b.lock("stock", ttl=30).acquire(timeout=20))
        await wait_until(lambda: backend_of(b).statistics()["waiters"] == 1)
        lease_id = _lease_of(a)
        await asyncio.to_thread(etcdctl, etcd_cluster.endpoints, "lease", "revoke", f"{lease_id:x}")
        revoked_at = loop.time()
        await holding
        successor = await waiting
        print(f"holder told {told_at - revoked_at:.3f} s after etcdctl returned")
        assert told_at - revoked_at < 1.0
        await successor.release()
        # The revoking client takes a new lease for its next lock.
        async with a.lock("stock", timeout=10):
            assert _lease_of(a) != lease_id


async def test_sigkilled_holder_process_is_replaced_after_the_lease_ttl(
    etcd_cluster: EtcdCluster,
) -> None:
    """A holder process dies (SIGKILL: no release, no revoke): its lease runs out after its
    TTL and the waiter is granted then — not before, and not much later."""
    ns = _namespace()
    session_ttl = 3
    url = f"{etcd_cluster.url}/killed?session_ttl={session_ttl}"
    async with (
        holder_process(url, ns, "stock", 30) as holder,
        aiodlock.connect(url, namespace=ns) as locks,
    ):
        assert await locks.lock("stock").try_acquire() is None
        killed_at = holder.kill()
        lease = await locks.lock("stock").acquire(timeout=session_ttl + 10)
        waited = asyncio.get_running_loop().time() - killed_at
        print(f"granted {waited:.3f} s after the holder was killed (lease ttl {session_ttl} s)")
        assert lease.fencing_token > holder.token
        # Its last keep-alive was at most ttl/4 before the kill.
        assert session_ttl * 0.7 <= waited <= session_ttl + 3
        await lease.release()


# ---------------------------------------------------------------------- cluster faults


def _rotated(cluster: EtcdCluster, first: EtcdServer) -> str:
    """The cluster's URL with ``first`` as the member its clients talk to first."""
    members = [first, *(m for m in cluster.members if m is not first)]
    return "etcd://" + ",".join(m.endpoint for m in members)


async def _contend(
    clients: list[aiodlock.LockClient],
    rounds: int,
    fault: asyncio.Event,
    history: History,
    counter: dict[str, int],
) -> None:
    """Read-sleep-write rounds under one lock; ``fault`` is set once a few rounds are done."""

    async def worker(locks: aiodlock.LockClient, who: str) -> None:
        done = 0
        while done < rounds:
            try:
                async with locks.lock("stock", ttl=3, timeout=60) as lease:
                    with history.hold(who, lease.fencing_token):
                        seen = counter["value"]
                        await asyncio.sleep(random.uniform(0.005, 0.02))
                        counter["value"] = seen + 1
            except aiodlock.LockLostError:
                counter["lost"] += 1
                continue
            done += 1
            counter["done"] += 1
            if counter["done"] >= len(clients) * 2:
                fault.set()

    async with asyncio.TaskGroup() as group:
        for i, client in enumerate(clients):
            group.create_task(worker(client, f"w{i}"))


async def test_killing_the_leader_keeps_exclusion_and_waiters_proceed(
    etcd_cluster: EtcdCluster,
) -> None:
    """Four clients (two talking to the leader first) do read-sleep-write rounds under one
    lock; the leader is SIGKILLed mid-run. The clients on it move to the other members, no
    two holders overlap, no update is lost, and grants resume after the election."""
    ns = _namespace()
    rounds = 10
    history = History()
    counter = {"value": 0, "done": 0, "lost": 0}
    warmed_up = asyncio.Event()
    leader = await asyncio.to_thread(etcd_cluster.leader)
    others = [m for m in etcd_cluster.members if m is not leader]
    urls = [_rotated(etcd_cluster, m) for m in (leader, leader, *others)]
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                aiodlock.connect(f"{url}/leader?session_ttl=5", namespace=ns)
            )
            for url in urls
        ]
        on_leader = clients[:2]
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_contend(clients, rounds, warmed_up, history, counter))
                await asyncio.wait_for(warmed_up.wait(), 30)
                before = counter["done"]
                await asyncio.to_thread(leader.kill)
                killed_at = loop.time()
                await wait_until(lambda: counter["done"] > before + 1, timeout=30)
                resumed = loop.time() - killed_at
        finally:
            await asyncio.to_thread(etcd_cluster.restart_stopped)
        moves = [backend_of(c).statistics()["member_moves"] for c in on_leader]
        endpoints = [backend_of(c).statistics()["endpoint"] for c in on_leader]
    print(f"leader killed: grants resumed after {resumed:.3f} s, moves {moves}, {counter}")
    assert counter["done"] == rounds * len(clients)
    assert counter["value"] == counter["done"]  # no lost update
    history.check(max_holders=1)
    assert all(m >= 1 for m in moves)
    assert leader.endpoint not in endpoints


async def test_pausing_a_member_moves_its_clients_and_keeps_their_lease(
    etcd_cluster: EtcdCluster,
) -> None:
    """A follower that two of four clients talk to is SIGSTOPped mid-run (its connections
    stay open, nothing answers: a hung host). They move to the other members within their
    lease, keep it (no new lease granted), and every round finishes while it hangs."""
    ns = _namespace()
    rounds = 8
    history = History()
    counter = {"value": 0, "done": 0, "lost": 0}
    warmed_up = asyncio.Event()
    leader = await asyncio.to_thread(etcd_cluster.leader)
    victim, bystander = [m for m in etcd_cluster.members if m is not leader]
    urls = [_rotated(etcd_cluster, m) for m in (victim, victim, leader, bystander)]
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                aiodlock.connect(f"{url}/pause?session_ttl=6", namespace=ns)
            )
            for url in urls
        ]
        on_victim = clients[:2]
        leases = [_lease_of(c) for c in on_victim]
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_contend(clients, rounds, warmed_up, history, counter))
                await asyncio.wait_for(warmed_up.wait(), 30)
                await asyncio.to_thread(victim.pause)
                # Its clients move on at their next request or keep-alive (every 1.5 s).
                await wait_until(
                    lambda: all(
                        backend_of(c).statistics()["endpoint"] != victim.endpoint for c in on_victim
                    ),
                    timeout=15,
                )
            assert victim.paused  # every round finished while the member hung
            stats = [backend_of(c).statistics() for c in on_victim]
            kept = [_lease_of(c) for c in on_victim]
        finally:
            if victim.paused:
                await asyncio.to_thread(victim.resume)
            await asyncio.to_thread(etcd_cluster.wait_serving)
    print(f"member paused: {[(s['endpoint'], s['member_moves']) for s in stats]}, {counter}")
    assert counter["done"] == rounds * len(clients)
    assert counter["value"] == counter["done"]  # no lost update
    history.check(max_holders=1)
    assert all(s["member_moves"] >= 1 and s["endpoint"] != victim.endpoint for s in stats)
    assert kept == leases
    # No lease lost: one granted per session (the session_ttl one, and ttl 3's).
    assert all(s["leases"] == len(s["sessions"]) == 2 for s in stats)
