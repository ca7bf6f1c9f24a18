"""ZooKeeper: the holder's identity in its node's data, and the namespaces under the root.

The conformance suite checks that ``inspect`` names each holder's identity and that
``namespaces()`` names the one in use; this file covers what only this layout has: the
identity is a percent-encoded word of the node's data (so no character of it splits or fakes
a word), a node made before identities were stored still reads (identity ``None``), and the
children of a root without a chroot that no namespace encodes to (``zookeeper``) are left out.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

import aiodlock
from aiodlock.backends import Kind
from tests.support_zookeeper import ZooKeeperProbe

if TYPE_CHECKING:
    from tests.support_zookeeper import ZooKeeperServer

pytestmark = pytest.mark.zookeeper

# Words of its own ("owner=", "identity="), spaces, "%", quotes, non-ASCII.
ODD_IDENTITY = "worker 7 owner=x identity=y @ pod/shop-api:1234 100% 'é' 鍵"


def _namespace() -> str:
    return f"z{os.urandom(6).hex()}"


@pytest.fixture
def zk() -> Any:
    """The backend's package, whose layout helpers these tests read (it imports aiozk, so not
    at collection: a venv without drivers still collects the memory tests)."""
    from aiodlock.backends import zookeeper

    return zookeeper


def test_the_identity_is_one_word_of_the_node_data_whatever_it_holds(zk: Any) -> None:
    data = zk.node_data("0123abcd", ODD_IDENTITY)
    words = data.decode().split()
    assert words[:2] == ["aiodlock", "owner=0123abcd"] and len(words) == 3
    assert zk.node_owner(data, 0x1F) == "0123abcd"
    assert zk.node_identity(data) == ODD_IDENTITY


def test_the_default_identity_stays_readable_in_zkcli(zk: Any) -> None:
    assert zk.node_data("0123abcd", "web-1:4242") == b"aiodlock owner=0123abcd identity=web-1:4242"


def test_a_node_of_an_older_aiodlock_reads_with_no_identity(zk: Any) -> None:
    old = b"aiodlock owner=0123abcd web-1 pid=4242"
    assert (zk.node_owner(old, 0x1F), zk.node_identity(old)) == ("0123abcd", None)
    assert (zk.node_owner(b"", 0x1F), zk.node_identity(b"")) == ("session 0x1f", None)


@pytest.mark.parametrize(
    ("segment", "namespace"),
    [
        ("shop", "shop"),
        ("caf%C3%A9%20bar", "café bar"),
        ("%7Aookeeper", "zookeeper"),  # the namespace "zookeeper", encoded
        ("zookeeper", None),  # ZooKeeper's own node at "/"
        ("caf%c3%a9", None),  # not how we encode: another application's node
        ("a.b", None),
        ("%FF", None),  # not UTF-8
        ("a%3Ab", None),  # ":" is never in a namespace
    ],
)
def test_a_root_child_is_a_namespace_only_if_one_encodes_to_it(
    zk: Any, segment: str, namespace: str | None
) -> None:
    assert zk.namespace_of(segment) == namespace


async def test_inspect_reads_a_node_of_an_older_aiodlock(
    zk: Any, zookeeper_server: ZooKeeperServer
) -> None:
    """A holder's node with the data of an aiodlock before identities: its owner shows, its
    identity is ``None``, and a new client queues behind it as ever."""
    root, ns = "/identity-old", _namespace()
    directory = zk.lock_directory(root, ns, "job", Kind.MUTEX)
    probe = await ZooKeeperProbe(f"{zookeeper_server.host}:{zookeeper_server.port}", root).start()
    try:
        await probe.client.ensure_path(directory)
        node = await probe.client.create(
            f"{directory}/_c_{os.urandom(16).hex()}-lock-",
            data=b"aiodlock owner=0123abcd web-1 pid=4242",
            ephemeral=True,
            sequential=True,
        )
        url = f"{zookeeper_server.url}{root}"
        async with aiodlock.connect(url, namespace=ns, identity=ODD_IDENTITY) as locks:
            [info] = await locks.inspect()
            assert [(h.owner, h.identity) for h in info.holders] == [("0123abcd", None)]
            assert await locks.lock("job").try_acquire() is None
            await probe.client.delete(node)
            async with locks.lock("job", ttl=10) as lease:
                [info] = await locks.inspect()
                assert [(h.owner, h.identity) for h in info.holders] == [
                    (lease.owner, ODD_IDENTITY)
                ]
    finally:
        await probe.client.deleteall(f"{root}/{ns}")  # ensure_path made them persistent
        await probe.aclose()


async def test_namespaces_without_a_chroot_leave_zookeepers_own_node_out(
    zookeeper_server: ZooKeeperServer,
) -> None:
    ns = _namespace()
    async with (
        aiodlock.connect(zookeeper_server.url, namespace=ns) as locks,
        locks.lock("listed"),
    ):
        found = await locks.namespaces()
        assert ns in found and "zookeeper" not in found
        assert found == sorted(found)
        [info] = await locks.inspect(namespace=ns)
        assert info.name == "listed"
