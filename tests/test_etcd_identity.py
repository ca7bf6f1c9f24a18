"""etcd: each client's identity in one key per session lease, and the namespaces in use.

The conformance suite checks that ``inspect`` names each holder's identity and that
``namespaces()`` names the one in use; this file covers what only this layout has: a
contender's value is byte for byte that of every release (``mutex``, ``read``, ``write``,
``sema:<limit>``), so clients of an older release share a prefix with ours; the identity is
``<prefix>/:identity/<lease id, 16 hex digits>`` on that lease, put once per lease (at open,
and again for a lease that replaces a lost one), gone with the lease; a holder with no identity
key (an older client's) shows ``None``; ``namespaces()`` reads names only, page by page,
skipping the rest of each namespace it has named, and never names ``:identity``.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

import aiodlock
from aiodlock.backends import Kind, LockSpec
from aiodlock.backends.etcd import (
    IDENTITY_SEGMENT,
    contenders,
    encode_segment,
    identity_key,
    identity_prefix,
    lease_of_identity_key,
    namespace_of,
    value,
)
from aiodlock.testing import settle
from tests.support_etcd import EtcdProbe

if TYPE_CHECKING:
    from aiodlock.backends.etcd import EtcdBackend
    from tests.support_etcd import EtcdServer

pytestmark = pytest.mark.etcd

# Spaces, ":" (the limit's separator), "%", quotes, "/", non-ASCII: stored as they are.
ODD_IDENTITY = "worker 7 identity=y @ pod/shop-api:1234 100% 'é' 鍵"


def _namespace() -> str:
    return f"e{os.urandom(6).hex()}"


def _kv(revision: int, stored: bytes) -> Any:
    return SimpleNamespace(key=f"k{revision}".encode(), create_revision=revision, value=stored)


def _backend(client: aiodlock.LockClient) -> EtcdBackend:
    from aiodlock.backends.etcd import EtcdBackend

    backend = client.backend
    assert isinstance(backend, EtcdBackend)
    return backend


def _leases(client: aiodlock.LockClient) -> list[int]:
    """Every lease the client has now (one per ttl in use)."""
    sessions = _backend(client).statistics()["sessions"]
    return sorted(int(lease, 16) for lease in sessions.values() if lease is not None)


# ---------------------------------------------------------------------- the layout


def test_values_are_those_of_every_release_byte_for_byte() -> None:
    specs = [LockSpec("ns", "n", Kind.MUTEX), LockSpec("ns", "n", Kind.READ)]
    specs += [LockSpec("ns", "n", Kind.WRITE), LockSpec("ns", "n", Kind.SEMAPHORE, 12)]
    assert [value(spec) for spec in specs] == [b"mutex", b"read", b"write", b"sema:12"]


def test_values_of_every_release_read_as_their_kind_and_limit() -> None:
    old = [_kv(1, b"mutex"), _kv(2, b"read"), _kv(3, b"write"), _kv(4, b"sema:2")]
    assert [(c.kind, c.limit) for c in contenders(old)] == [
        (Kind.MUTEX, 0),
        (Kind.READ, 0),
        (Kind.WRITE, 0),
        (Kind.SEMAPHORE, 2),
    ]


def test_identity_keys_are_named_by_lease_in_lease_order() -> None:
    leases = [0x1, 0xAB, 0x694D8C1B2F7E3A05, 0x7FFFFFFFFFFFFFFF]
    keys = [identity_key("/p", lease) for lease in leases]
    assert keys[1] == b"/p/:identity/00000000000000ab"
    assert sorted(keys) == keys  # a range between two keys holds the leases between
    assert [lease_of_identity_key("/p", key) for key in keys] == leases
    assert lease_of_identity_key("/p", b"/p/shop/n/mutex/ab-o") is None
    assert lease_of_identity_key("/p", b"/p/:identity/zz") is None


def test_the_identity_segment_is_no_namespace() -> None:
    """No namespace encodes to a segment with a ``:`` (every byte but ``A-Z a-z 0-9 - _`` is
    written %XX), so ``:identity`` never meets a namespace's keys."""
    assert ":" not in encode_segment("a:b") and encode_segment(":identity") != IDENTITY_SEGMENT
    assert namespace_of(IDENTITY_SEGMENT.encode()) is None
    assert identity_prefix("/p") == f"/p/{IDENTITY_SEGMENT}/".encode()


@pytest.mark.parametrize(
    ("segment", "namespace"),
    [
        (b"shop", "shop"),
        (b"caf%C3%A9%20bar", "caf\u00e9 bar"),
        (b"caf%c3%a9", None),  # not how we encode
        (b"a.b", None),
        (b"%FF", None),  # not UTF-8
        (b"a%3Ab", None),  # ":" is never in a namespace
        (b":identity", None),
        ("caf\u00e9".encode(), None),
    ],
)
def test_a_segment_is_a_namespace_only_if_one_encodes_to_it(
    segment: bytes, namespace: str | None
) -> None:
    assert namespace_of(segment) == namespace


# ---------------------------------------------------------------------- against etcd


async def test_one_identity_key_per_lease_on_that_lease_gone_when_the_client_closes(
    etcd_server: EtcdServer,
) -> None:
    """Open puts the ``session_ttl`` lease's identity key, a lock of another ttl its lease's;
    more locks put nothing more; holders' values are the old words; ``inspect`` names the
    identity; closing revokes the leases and their identity keys go with them."""
    ns, root = _namespace(), f"/ids{os.urandom(4).hex()}"
    probe = await EtcdProbe(etcd_server.endpoint, root).start()
    try:
        url = f"{etcd_server.url}{root}?session_ttl=10"
        async with aiodlock.connect(url, namespace=ns, identity=ODD_IDENTITY) as locks:
            [main] = _leases(locks)
            stored = dict(await probe.keys(identity_prefix(root)))
            assert list(stored) == [identity_key(root, main)]
            assert stored[identity_key(root, main)].value == ODD_IDENTITY.encode()
            assert stored[identity_key(root, main)].lease == main
            async with (
                locks.lock("a", ttl=30),
                locks.write_lock("b", ttl=30),
                locks.semaphore("c", limit=3, ttl=3),
            ):
                leases = _leases(locks)
                assert len(leases) == 2 and main in leases
                stored = dict(await probe.keys(identity_prefix(root)))
                assert sorted(stored) == sorted(identity_key(root, lease) for lease in leases)
                assert all(kv.lease == lease_of_identity_key(root, k) for k, kv in stored.items())
                held = await probe.keys(probe.namespace_prefix(ns))
                assert sorted(kv.value for _, kv in held) == [b"mutex", b"sema:3", b"write"]
                infos = await locks.inspect()
                assert [(i.name, [h.identity for h in i.holders]) for i in infos] == [
                    ("a", [ODD_IDENTITY]),
                    ("b", [ODD_IDENTITY]),
                    ("c", [ODD_IDENTITY]),
                ]
            await settle(locks)
        assert await probe.keys(identity_prefix(root)) == []
        assert await probe.leftovers(ns) == []
    finally:
        await probe.aclose()


async def test_a_lease_that_replaces_a_lost_one_gets_its_identity_key(
    etcd_server: EtcdServer,
) -> None:
    """The session lease revoked behind the client's back (a plain etcd client): its identity
    key goes with it; the next acquisition grants a new lease and puts the identity again."""
    ns, root = _namespace(), f"/ids{os.urandom(4).hex()}"
    probe = await EtcdProbe(etcd_server.endpoint, root).start()
    try:
        url = f"{etcd_server.url}{root}?session_ttl=10"
        async with aiodlock.connect(url, namespace=ns, identity="web-1:4242") as locks:
            [old] = _leases(locks)
            await probe.client.revoke_lease(old)
            assert await probe.keys(identity_prefix(root)) == []
            async with locks.lock("job", timeout=10) as lease:
                [new] = _leases(locks)
                assert new != old
                [(key, kv)] = await probe.keys(identity_prefix(root))
                assert (key, kv.value, kv.lease) == (identity_key(root, new), b"web-1:4242", new)
                [info] = await locks.inspect()
                assert [(h.owner, h.identity) for h in info.holders] == [
                    (lease.owner, "web-1:4242")
                ]
            assert _backend(locks).statistics()["leases"] == 2
            await settle(locks)
    finally:
        await probe.aclose()


async def test_a_lease_whose_identity_cannot_be_written_is_not_used(
    etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity put refused: ``connect()`` (or the acquisition that grants a lease) fails
    with BackendError as a refused grant would, the lease is revoked, and the next
    acquisition grants again."""
    ns, root = _namespace(), f"/ids{os.urandom(4).hex()}"
    url = f"{etcd_server.url}{root}?session_ttl=10"
    probe = await EtcdProbe(etcd_server.endpoint, root).start()
    # The connection's put, refused as an etcd denying the user would refuse it (fault
    # injection: the etcd server has no switch for "refuse this one key").
    connection = "aiodlock.backends.etcd._conn.EtcdConnection"
    put = sys.modules["aiodlock.backends.etcd._conn"].EtcdConnection.put
    refused: list[int] = []
    refusing = True

    async def refuse(self: Any, key: bytes, stored: bytes, *, lease: int) -> Any:
        if refusing:
            refused.append(lease)
            raise aiodlock.BackendError("Put failed: PERMISSION_DENIED (as etcd would say)")
        return await put(self, key, stored, lease=lease)

    monkeypatch.setattr(f"{connection}.put", refuse)
    try:
        with pytest.raises(aiodlock.BackendError, match="PERMISSION_DENIED"):
            async with aiodlock.connect(url, namespace=ns):
                pytest.fail("opened with no identity key")
        refusing = False
        async with aiodlock.connect(url, namespace=ns) as locks:
            refusing = True
            with pytest.raises(aiodlock.BackendError, match="PERMISSION_DENIED"):
                await locks.lock("short", ttl=3).acquire(timeout=5)
            assert len(_leases(locks)) == 1  # the ttl-3 session has no lease
            refusing = False
            async with locks.lock("short", ttl=3, timeout=5):
                assert len(_leases(locks)) == 2
                assert len(await probe.keys(identity_prefix(root))) == 2
            await settle(locks)
        assert len(refused) == 2
        for lease in refused:  # revoked at once, not left to expire
            assert (await probe.client.get_lease_info(lease)).TTL == -1
    finally:
        await probe.aclose()


async def test_inspect_reads_keys_of_an_older_aiodlock(etcd_server: EtcdServer) -> None:
    """Holders' keys made by an aiodlock before identities (on a lease with no identity key):
    their owners show, their identities are ``None``, and new clients queue with them as
    ever (a mutex behind one, a semaphore's limit compared with an old ``sema:2``)."""
    ns, root = _namespace(), "/identity-old"
    probe = await EtcdProbe(etcd_server.endpoint, root).start()
    lease = await probe.client.lease(30)
    try:
        mutex = probe.name_prefix(ns, "job") + f"mutex/{lease.id:x}-0123abcd".encode()
        await probe.client.put(mutex, b"mutex", lease=lease)
        sema = probe.name_prefix(ns, "pool") + f"semaphore/{lease.id:x}-4567cdef".encode()
        await probe.client.put(sema, b"sema:2", lease=lease)
        url = f"{etcd_server.url}{root}"
        async with aiodlock.connect(url, namespace=ns, identity=ODD_IDENTITY) as locks:
            [job, pool] = await locks.inspect()
            assert [(h.owner, h.identity) for h in job.holders] == [("0123abcd", None)]
            assert [(h.owner, h.identity) for h in pool.holders] == [("4567cdef", None)]
            assert await locks.lock("job").try_acquire() is None
            async with locks.semaphore("pool", limit=2, ttl=10) as permit:
                [_, pool] = await locks.inspect()
                assert [(h.owner, h.identity) for h in pool.holders] == [
                    ("4567cdef", None),
                    (permit.owner, ODD_IDENTITY),
                ]
                [ours] = [
                    kv for key, kv in await probe.keys(probe.name_prefix(ns, "pool"))
                    if key.endswith(permit.owner.encode())
                ]  # fmt: skip
                assert ours.value == b"sema:2"  # what the older aiodlock reads
            await settle(locks)
    finally:
        await lease.revoke()
        await probe.aclose()


async def test_namespaces_read_names_only_and_skip_each_named_namespace(
    etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of 2 keys over 5 namespaces, strays and the client's own identity key: every
    namespace is named once, in order, in at most one request per top-level segment (not one
    per 2 of the 40 keys of ``a``); keys no namespace encodes to, ``:identity`` among them,
    are left out."""
    root = f"/scan{os.urandom(4).hex()}"
    probe = await EtcdProbe(etcd_server.endpoint, root).start()
    lease = await probe.client.lease(30)
    keys = [f"a/n{i}/mutex/1-o{i}" for i in range(40)]
    keys += ["b%20c/n/rw/1-o", "caf%C3%A9/n/mutex/1-o", "caf%C3%A9/m/mutex/1-o", "zz/n/mutex/1-o"]
    strays = ["junk", "x%3Ay/n/mutex/1-o", "lower%c3%a9/n/mutex/1-o", "%FF/n/mutex/1-o"]
    strays += [f"{IDENTITY_SEGMENT}/{n:016x}" for n in range(3)]  # as other clients' sessions
    try:
        for key in keys + strays:
            await probe.client.put(f"{root}/{key}".encode(), b"mutex", lease=lease)
        monkeypatch.setattr("aiodlock.backends.etcd._inspect._PAGE", 2)  # pages of 2 keys
        async with aiodlock.connect(f"{etcd_server.url}{root}") as locks:
            assert len(await probe.keys(identity_prefix(root))) == 4  # and our session's
            conn = locks.backend._conn  # type: ignore[attr-defined]
            requests = []
            call = conn.call

            async def counted(stub: str, method: str, *rest: Any) -> Any:
                requests.append(method)
                return await call(stub, method, *rest)

            monkeypatch.setattr(conn, "call", counted)
            assert await locks.namespaces() == ["a", "b c", "caf\u00e9", "zz"]
        segments = {key.partition("/")[0] for key in keys + strays}
        assert requests.count("Range") <= len(segments) + 1
    finally:
        await lease.revoke()
        await probe.aclose()
