"""ZooKeeper digest authentication and the ACLs of the backend's nodes, on a real server.

Digest authentication needs no server setting: any session may say ``user:password`` and is
known from then on as ``digest:user:<hash>``. The outside clients here are plain aiozk
sessions (:class:`~tests.support_zookeeper.ZooKeeperProbe`), with or without an identity;
the CLI runs as a subprocess. docs/zookeeper.md, "Authentication and ACLs", says what is
checked here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

import aiodlock
from tests.helpers import eventually, wait_until
from tests.servers import LOOPBACK
from tests.support_zookeeper import ZooKeeperProbe, ZooKeeperServer

pytestmark = pytest.mark.zookeeper

ROOT: Final = Path(__file__).resolve().parent.parent
ALICE: Final = ("alice", "s3cret:/@?#")  # a password that must be percent-encoded
BOB: Final = ("bob", "hunter2")
OPS: Final = ("ops", "0perator")
FAST_FAILURE: Final = 2.0
"""Seconds within which a refused identity is told (connect_timeout is 5 s: the bound says no
wait for a timeout and no retries; a healthy round trip takes milliseconds, the rest is slack
for a loaded 2-core machine)."""


# The driver is imported when a test runs, never at collection (a memory-only venv collects
# this module without aiozk).


def digest(user: str, password: str) -> str:
    from aiodlock.backends import zookeeper

    return zookeeper.digest(user, password)


def encode_segment(text: str) -> str:
    from aiodlock.backends import zookeeper

    return zookeeper.encode_segment(text)


def namespace_path(root: str, namespace: str) -> str:
    from aiodlock.backends import zookeeper

    return zookeeper.namespace_path(root, namespace)


def no_auth() -> type[Exception]:
    from aiozk import exc

    return exc.NoAuth  # type: ignore[no-any-return]


def zk_url(
    server: ZooKeeperServer, root: str, who: tuple[str, str] | None = None, query: str = ""
) -> str:
    auth = ""
    if who is not None:
        user, password = (urllib.parse.quote(part, safe="") for part in who)
        auth = f"{user}:{password}@"
    return f"zookeeper://{auth}{server.host}:{server.port}{root}{'?' + query if query else ''}"


@pytest.fixture
def root() -> str:
    return f"/auth{os.urandom(4).hex()}"


@pytest.fixture
def namespace() -> str:
    return f"z{os.urandom(4).hex()}"


@contextlib.asynccontextmanager
async def probe_as(
    server: ZooKeeperServer, who: tuple[str, str] | None = None
) -> AsyncIterator[ZooKeeperProbe]:
    probe = await ZooKeeperProbe(f"{server.host}:{server.port}", "", auth=who).start()
    try:
        yield probe
    finally:
        await probe.aclose()


def lock_directory(root: str, namespace: str, name: str) -> str:
    return f"{namespace_path(root, namespace)}/{encode_segment(name)}/mutex"


async def the_lock_node(probe: ZooKeeperProbe, root: str, namespace: str, name: str) -> str:
    directory = lock_directory(root, namespace, name)
    await probe.sync()
    (node,) = await probe.children(directory)
    return f"{directory}/{node}"


def alice_only() -> list[str]:
    return [f"digest:{digest(*ALICE)}:cdrwa", "world:anyone:r"]


# ---------------------------------------------------------------------- without a server


def test_credentials_and_acl_options_are_checked_without_connecting() -> None:
    url = "zookeeper://alice:hunter2@127.0.0.1:2181/apps"
    client = aiodlock.connect(url)
    assert "hunter2" not in repr(client)
    assert repr(client).startswith("<LockClient new zookeeper://alice:***@127.0.0.1:2181/apps ")
    # The options name the user as well; the password never shows.
    client = aiodlock.connect("zookeeper://zk1/apps", username="bob", password="hunter2")
    assert "zookeeper://bob:***@zk1/apps" in repr(client)
    assert "hunter2" not in repr(client)
    failures: list[tuple[dict[str, Any], str, type[Exception]]] = [
        ({"username": "bob", "password": "pw"}, "one way", ValueError),
        ({"acl": "world:anyone:r"}, "crwd", ValueError),  # alice could not release her nodes
        ({"acl": "digest:ops:rd"}, "user:hash", ValueError),
        ({"acl": "auth::cdrwq"}, "crwda", ValueError),
        ({"acl": 3}, "acl must be", TypeError),
    ]
    for options, message, error in failures:
        with pytest.raises(error, match=message) as info:
            aiodlock.connect(url, **options)
        assert "hunter2" not in str(info.value)
    for bad in ("zookeeper://alice@zk1/apps", "zookeeper://:hunter2@zk1/apps"):
        with pytest.raises(ValueError, match="both a user name and a password") as info:
            aiodlock.connect(bad)
        assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match="cannot contain ':'"):
        aiodlock.connect("zookeeper://a%3Ab:pw@zk1/apps")
    with pytest.raises(ValueError, match="needs credentials"):
        aiodlock.connect("zookeeper://zk1/apps", acl="auth::cdrwa")
    # A list works as well as a str; an operator's entry is a digest (no password in it).
    operator = f"digest:{digest(*OPS)}:dr"  # in the order the server shows perms
    aiodlock.connect(url, acl=["auth::cdrwa", "world:anyone:r", operator])


# ---------------------------------------------------------------------- ACLs


async def test_without_credentials_every_node_stays_open_to_the_world(
    zookeeper_server: ZooKeeperServer, root: str, namespace: str
) -> None:
    async with (
        aiodlock.connect(zk_url(zookeeper_server, root), namespace=namespace) as locks,
        probe_as(zookeeper_server) as probe,
        locks.lock("job"),
    ):
        node = await the_lock_node(probe, root, namespace, "job")
        print(f"\ngetAcl {node} (no credentials): {await probe.get_acl(node)}")
        for path in (node, lock_directory(root, namespace, "job"), root):
            assert await probe.get_acl(path) == ["world:anyone:cdrwa"], path


async def test_the_holders_node_refuses_a_strangers_delete_and_the_holder_keeps_it(
    zookeeper_server: ZooKeeperServer, root: str, namespace: str
) -> None:
    url = zk_url(zookeeper_server, root, ALICE)
    async with (
        aiodlock.connect(url, namespace=namespace) as locks,
        aiodlock.connect(url, namespace=namespace) as same_identity,
        probe_as(zookeeper_server) as stranger,
        probe_as(zookeeper_server, BOB) as bob,
    ):
        async with locks.lock("job") as lease:
            node = await the_lock_node(stranger, root, namespace, "job")
            acl = await stranger.get_acl(node)
            print(f"\ngetAcl {node} (as alice, seen by a stranger): {acl}")
            # Every level the backend made is alice's alone; the world may read.
            directory = lock_directory(root, namespace, "job")
            levels = [node, directory, directory.rsplit("/", 1)[0], root]
            for path in levels:
                assert await bob.get_acl(path) == [
                    f"digest:{ALICE[0]}:x:cdrwa",  # hashes are shown only to admins
                    "world:anyone:r",
                ], path
            for probe in (stranger, bob):
                with pytest.raises(no_auth()):
                    await probe.client.delete(node, force=True)
                with pytest.raises(no_auth()):  # nor can they queue
                    await probe.client.create(f"{directory}/intruder", ephemeral=True)
                with pytest.raises(no_auth()):
                    await probe.client.set_data(node, b"mine", force=True)
            assert await stranger.children(directory) == [node.rsplit("/", 1)[1]]
            # The holder still holds: its lease is intact, and another client is refused.
            assert not lease.lost.is_set()
            assert await same_identity.lock("job").try_acquire() is None
            assert locks.statistics().backend["held"] == 1
        async with probe_as(zookeeper_server, ALICE) as alice, locks.lock("job"):
            node = await the_lock_node(alice, root, namespace, "job")
            assert await alice.get_acl(node) == alice_only()  # alice sees her own hash


async def test_a_second_client_with_the_same_identity_contends_normally(
    zookeeper_server: ZooKeeperServer, root: str, namespace: str
) -> None:
    url = zk_url(zookeeper_server, root, ALICE)
    async with (
        aiodlock.connect(url, namespace=namespace) as first,
        aiodlock.connect(url, namespace=namespace) as second,
        probe_as(zookeeper_server) as probe,
    ):
        granted = asyncio.Event()
        async with first.lock("job") as held:
            token = held.fencing_token

            async def wait_for_it() -> int:
                async with second.lock("job", timeout=10) as lease:
                    granted.set()
                    return lease.fencing_token

            waiter = asyncio.create_task(wait_for_it())
            directory = lock_directory(root, namespace, "job")

            async def queued() -> bool:
                await probe.sync()
                return len(await probe.children(directory)) == 2

            await eventually(queued)  # the waiter's node is behind the holder's
            assert not granted.is_set()
        assert await waiter > token
        async with second.read_lock("shared"), first.read_lock("shared"):
            pass  # readers of one identity share, as any readers do


# ---------------------------------------------------------------------- breaking


async def test_an_identity_without_delete_cannot_break_a_lock_and_an_operator_can(
    zookeeper_server: ZooKeeperServer, root: str, namespace: str
) -> None:
    operator = f"digest:{digest(*OPS)}:dr"  # in the order the server shows perms
    acl = f"auth::cdrwa,world:anyone:r,{operator}"
    async with (
        aiodlock.connect(zk_url(zookeeper_server, root, ALICE), namespace=namespace) as alice,
        aiodlock.connect(zk_url(zookeeper_server, root, BOB), namespace=namespace) as bob,
        aiodlock.connect(zk_url(zookeeper_server, root), namespace=namespace) as anonymous,
        aiodlock.connect(zk_url(zookeeper_server, root, OPS), namespace=namespace) as ops,
    ):
        async with alice.lock("job") as lease:
            for stranger in (bob, anonymous):
                assert len(await stranger.inspect("job")) == 1  # the world may look
                with pytest.raises(aiodlock.BackendError, match="DELETE") as caught:
                    await stranger.break_lock("job")
                assert "cannot break" in str(caught.value)
                assert BOB[1] not in str(caught.value)
            assert not lease.lost.is_set()
            with pytest.raises(aiodlock.BackendError, match="DELETE"):
                await ops.break_lock("job")  # not in this lock's ACL
        # Made with an ACL naming the operator: the operator may break it.
        async with aiodlock.connect(
            zk_url(zookeeper_server, root, ALICE), namespace=namespace, acl=acl
        ) as alice_with_ops:
            with pytest.raises(aiodlock.LockLostError):
                async with alice_with_ops.lock("ops-may-break"):
                    assert await ops.break_lock("ops-may-break") == 1
                    await asyncio.Event().wait()  # cancelled by the loss
            async with (
                probe_as(zookeeper_server, ALICE) as probe,
                alice_with_ops.lock("ops-may-break"),
            ):
                node = await the_lock_node(probe, root, namespace, "ops-may-break")
                assert await probe.get_acl(node) == [*alice_only(), operator]


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


async def aiodlock_cli(*args: str) -> Result:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-W", "error", "-m", "aiodlock", *args,
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


async def test_cli_inspect_and_break_take_the_urls_credentials(
    zookeeper_server: ZooKeeperServer, root: str, namespace: str
) -> None:
    alice_url = zk_url(zookeeper_server, root, ALICE)
    bob_url = zk_url(zookeeper_server, root, BOB)
    async with aiodlock.connect(alice_url, namespace=namespace) as locks:
        # Held outside ``async with``: the break's loss must not cancel the CLI's await.
        lease = await locks.lock("job").acquire()
        shown = await aiodlock_cli("inspect", alice_url, "--namespace", namespace)
        assert shown.returncode == 0, shown.stderr
        assert "job" in shown.stdout
        refused = await aiodlock_cli("break", bob_url, "job", "-n", namespace, "--yes")
        assert refused.returncode == 1
        assert "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "cannot break" in refused.stderr and "DELETE" in refused.stderr
        assert BOB[1] not in refused.stderr + refused.stdout
        assert not lease.lost.is_set()
        broken = await aiodlock_cli("break", alice_url, "job", "-n", namespace, "--yes")
        assert broken.returncode == 0, broken.stderr
        assert ALICE[1] not in broken.stderr + broken.stdout
        async with asyncio.timeout(5):
            await lease.lost.wait()


# ---------------------------------------------------------------------- wrong identities


async def test_a_wrong_password_fails_fast_and_clearly(
    zookeeper_server: ZooKeeperServer, root: str, namespace: str
) -> None:
    loop = asyncio.get_running_loop()
    wrong = (ALICE[0], "not-her-password")
    async with (
        aiodlock.connect(zk_url(zookeeper_server, root, ALICE), namespace=namespace) as alice,
        alice.lock("job"),
    ):
        # With a chroot of hers: refused at connect.
        started = loop.time()
        with pytest.raises(aiodlock.BackendError, match="wrong password") as info:
            async with aiodlock.connect(zk_url(zookeeper_server, root, wrong), connect_timeout=5):
                pass
        elapsed = loop.time() - started
        print(f"\nwrong password refused at connect after {elapsed * 1000:.1f} ms")
        assert elapsed < FAST_FAILURE
        assert wrong[1] not in str(info.value)
        assert "alice" in str(info.value)
    # Without a chroot to compare at connect: the first request her ACLs refuse says so.
    async with (
        aiodlock.connect(zk_url(zookeeper_server, "", ALICE), namespace=namespace) as alice,
        alice.lock("job"),
        aiodlock.connect(zk_url(zookeeper_server, "", wrong), namespace=namespace) as mistaken,
    ):
        started = loop.time()
        with pytest.raises(aiodlock.BackendError, match="NoAuth") as info:
            await mistaken.lock("job").try_acquire()
        assert loop.time() - started < FAST_FAILURE
        assert "wrong password" in str(info.value)
        assert wrong[1] not in str(info.value)


# ---------------------------------------------------------------------- reconnections


class CuttableProxy:
    """A TCP relay in front of one server; :meth:`cut` drops every connection through it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._group = asyncio.TaskGroup()

    async def __aenter__(self) -> CuttableProxy:
        await self._group.__aenter__()
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        await self._server.wait_closed()
        await self._group.__aexit__(None, None, None)

    def cut(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        self._group.create_task(self._pump(reader, up_writer))
        self._group.create_task(self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
        except OSError:
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()


async def test_credentials_are_sent_again_on_every_reconnection(
    zookeeper_server: ZooKeeperServer, root: str, namespace: str
) -> None:
    """A creator-only node can be deleted, and one created, only by a session that said who
    it is on its current connection: both work after the connection is cut."""
    async with CuttableProxy(zookeeper_server.port) as proxy:
        user, password = (urllib.parse.quote(part, safe="") for part in ALICE)
        url = f"zookeeper://{user}:{password}@{LOOPBACK}:{proxy.port}{root}"
        async with aiodlock.connect(url, namespace=namespace, session_ttl=10) as locks:
            lease = await locks.lock("before").acquire()
            reconnects = locks.statistics().backend["reconnects"]
            accepted = proxy.accepted
            proxy.cut()
            await wait_until(lambda: locks.statistics().backend["reconnects"] > reconnects)
            assert proxy.accepted > accepted
            assert not lease.lost.is_set()  # same session
            await lease.release()  # DELETE on alice's directory: needs her identity
            async with locks.lock("after"):  # an auth:: ACL needs an identity, too
                pass
        async with probe_as(zookeeper_server) as probe:
            await probe.sync()
            assert await probe.leftovers_under(namespace_path(root, namespace)) == []


# ---------------------------------------------------------------------- AUTH_FAILED


class RefusingServer:
    """Speaks just enough ZooKeeper to answer ``srvr``, grant a session, and answer our
    credentials with AUTH_FAILED (then closes, as ZooKeeper does). A stock server never
    refuses a digest (a wrong password is only another identity), so this one stands in for
    a server whose authentication provider refuses. The first ``accepts`` sessions are let
    in (their pings answered) until :meth:`cut`. Counts the connections it accepts."""

    _AUTH_FAILED: Final = -115
    _PING: Final = (-2, 11)

    def __init__(self, accepts: int = 0) -> None:
        self.port = 0
        self.connections = 0
        self.accepts = accepts
        self.refused = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RefusingServer:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        await self._server.wait_closed()

    def cut(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    async def _frame(self, reader: asyncio.StreamReader) -> tuple[int, int]:
        size = int.from_bytes(await reader.readexactly(4), "big")
        xid, opcode = struct.unpack_from("!ii", await reader.readexactly(size))
        return xid, opcode

    def _reply(self, writer: asyncio.StreamWriter, xid: int, error: int = 0) -> None:
        reply = struct.pack("!iqi", xid, 0, error)
        writer.write(len(reply).to_bytes(4, "big") + reply)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            first = await reader.readexactly(4)
            if first == b"srvr":
                writer.write(b"Zookeeper version: 3.8.0-fake, built on 1970-01-01\nMode: x\n")
                return
            await reader.readexactly(int.from_bytes(first, "big"))  # the connect request
            password = bytes(16)
            body = struct.pack("!iiqi", 0, 4000, 0x5EED, len(password)) + password
            writer.write(len(body).to_bytes(4, "big") + body)
            xid, opcode = await self._frame(reader)
            assert (xid, opcode) == (-4, 100), (xid, opcode)  # auth, before anything else
            if self.accepts <= 0:
                self._reply(writer, xid, self._AUTH_FAILED)
                await writer.drain()
                self.refused.set()
                return
            self.accepts -= 1
            self._reply(writer, xid)
            while True:  # a session let in: only pings come (the client holds nothing)
                xid, opcode = await self._frame(reader)
                assert (xid, opcode) == self._PING, (xid, opcode)
                self._reply(writer, xid)
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


async def test_auth_failed_fails_at_connect_at_once_without_retrying() -> None:
    loop = asyncio.get_running_loop()
    async with RefusingServer() as server:
        url = f"zookeeper://alice:hunter2@{LOOPBACK}:{server.port}/apps?connect_timeout=5"
        started = loop.time()
        with pytest.raises(aiodlock.BackendError, match="AUTH_FAILED") as info:
            async with aiodlock.connect(url):
                pass
        elapsed = loop.time() - started
        assert elapsed < FAST_FAILURE
        assert "hunter2" not in str(info.value)
        assert "zookeeper://alice:***@" in str(info.value)
        await asyncio.sleep(0.3)  # nothing to wait on: a retry would connect meanwhile
        assert server.connections == 2  # "srvr", then the session: no retry


async def test_auth_failed_on_a_reconnection_ends_the_session_without_retrying() -> None:
    async with RefusingServer(accepts=1) as server:
        url = f"zookeeper://alice:hunter2@{LOOPBACK}:{server.port}"
        async with aiodlock.connect(url, session_ttl=4) as locks:
            assert server.connections == 2
            server.cut()  # the client reconnects, says who it is again, and is refused
            async with asyncio.timeout(5):
                await server.refused.wait()
            assert server.connections == 4  # "srvr" and the session, once more
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(aiodlock.BackendError, match="AUTH_FAILED") as info:
                await locks.lock("job").try_acquire()
            assert loop.time() - started < FAST_FAILURE  # not request_timeout (10 s)
            assert "hunter2" not in str(info.value)
            await asyncio.sleep(0.3)  # nothing to wait on: a retry would connect meanwhile
            assert server.connections == 4
