"""The zookeeper backend's test harness: servers, an ensemble, and the probe.

Imported by the ZooKeeper test modules and, lazily, by the server fixtures of
tests/conftest.py; the aiozk driver and the backend module are imported only when a probe is
made, so importing this module needs no driver.

Servers are Debian's ZooKeeper 3.8 (``/usr/share/java/zookeeper.jar``, whose manifest carries
its class path) run as ``java ... QuorumPeerMain zoo.cfg`` directly — more controllable than
``zkServer.sh``: one process per server in its own directory, on free loopback ports, with a
200 ms tick (sessions of 0.4 s and up), no fsync, a 0.5 s container reaper and 256 MB of heap
at most. :class:`ZooKeeperEnsemble` runs three of them as a quorum and finds the leader
through the ``srvr`` four-letter word. :class:`ZooKeeperTLSServer` adds a secure client port
(Netty, PEM key material made at test time).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tests.servers import INSTALL_HINT, ServerProcess, TLSFiles, free_port

if TYPE_CHECKING:
    import aiodlock

__all__ = [
    "ZooKeeperEnsemble",
    "ZooKeeperProbe",
    "ZooKeeperServer",
    "ZooKeeperTLSServer",
    "four_letter_word",
]

ZOOKEEPER_JAR: Final = Path("/usr/share/java/zookeeper.jar")
SLF4J_SIMPLE_JAR: Final = Path("/usr/share/java/slf4j-simple.jar")
NETTY_CODEC_JAR: Final = Path("/usr/share/java/netty-codec.jar")  # TLS (ZooKeeperTLSServer)
TICK_MS: Final = 200


def four_letter_word(
    host: str,
    port: int,
    word: str,
    *,
    timeout: float = 0.5,
    tls: ssl.SSLContext | None = None,
) -> str | None:
    """Send a ZooKeeper four-letter word (over TLS with ``tls``); the whole answer, or None if
    none came."""
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
            if tls is not None:
                sock = stack.enter_context(tls.wrap_socket(sock, server_hostname=host))
            sock.sendall(word.encode())
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:  # refused, reset, or timed out (a paused server)
        return None
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer(ServerProcess):
    """One ZooKeeper server, standalone or a member of a :class:`ZooKeeperEnsemble`.

    ``peers`` (``[(server_id, peer_port, election_port), ...]``) and ``server_id`` make it an
    ensemble member; without them it runs standalone. A standalone server is up when it
    serves clients (``srvr`` shows its mode); a member when it answers ``ruok`` (it serves
    only once a quorum has elected a leader: :meth:`ZooKeeperEnsemble.wait_serving`).
    """

    binary = "java"

    def __init__(
        self,
        *,
        port: int | None = None,
        peers: Sequence[tuple[int, int, int]] = (),
        server_id: int = 0,
        tick_ms: int = TICK_MS,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(port=port, start_timeout=start_timeout, stop_timeout=stop_timeout)
        self.peers = list(peers)
        self.server_id = server_id
        self.tick_ms = tick_ms

    @property
    def url(self) -> str:
        """``zookeeper://127.0.0.1:<port>``."""
        return f"zookeeper://{self.host}:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.directory / "zoo.cfg"

    def prepare(self) -> None:
        for jar in (ZOOKEEPER_JAR, SLF4J_SIMPLE_JAR):
            if not jar.exists():
                raise RuntimeError(f"{jar} is missing (Debian's zookeeper package); {INSTALL_HINT}")
        data = self.directory / "data"
        data.mkdir()
        lines = [
            f"tickTime={self.tick_ms}",
            "initLimit=20",
            "syncLimit=10",
            f"dataDir={data}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            f"minSessionTimeout={2 * self.tick_ms}",
            "maxSessionTimeout=60000",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "forceSync=no",
            "preAllocSize=4096",
        ]
        if self.peers:
            (data / "myid").write_text(f"{self.server_id}\n")
            lines += [f"server.{i}={self.host}:{p}:{e}" for i, p, e in self.peers]
        self.config_file.write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        return [
            self.executable,
            "-Xmx256m", "-Xms32m", "-Xss512k",
            "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true",
            "-Dznode.container.checkIntervalMs=500",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", f"{ZOOKEEPER_JAR}:{SLF4J_SIMPLE_JAR}",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.config_file),
        ]  # fmt: skip

    def probe(self) -> bool:
        if self.peers:  # a member answers ruok at once, but serves only with a quorum
            return four_letter_word(self.host, self.port, "ruok") == "imok"
        return self.serving()  # ruok says imok before a standalone server serves

    def mode(self) -> str | None:
        """``standalone``, ``leader`` or ``follower`` while serving clients, else None."""
        answer = four_letter_word(self.host, self.port, "srvr")
        if answer is None:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode: "):
                return line.removeprefix("Mode: ").strip()
        return None

    def serving(self) -> bool:
        return self.mode() is not None


class ZooKeeperTLSServer(ZooKeeperServer):
    """A standalone :class:`ZooKeeperServer` that also serves TLS on :attr:`secure_port`.

    ZooKeeper's ``secureClientPort`` with the Netty connection factory, its key and trust
    stores read as PEM (``ssl.keyStore.type=PEM``). ``client_auth`` is ``ssl.clientAuth``:
    ``"need"`` (a certificate signed by ``files.ca`` is required of every TLS client) or
    ``"none"``. The plain :attr:`port` stays open: the harness probes it, and a test can
    show that a client speaking in the clear to the secure port is refused.

    Usage::

        with ZooKeeperTLSServer(files) as zk:
            url = f"{zk.tls_url}?tls_ca={files.ca}&tls_cert={files.client}"
    """

    def __init__(self, files: TLSFiles, *, client_auth: str = "need") -> None:
        super().__init__()
        self.files = files
        self.client_auth = client_auth
        self.secure_port = free_port()

    @property
    def tls_url(self) -> str:
        """``zookeeper://127.0.0.1:<secure port>`` (TLS options still to be added)."""
        return f"zookeeper://{self.host}:{self.secure_port}"

    def prepare(self) -> None:
        super().prepare()
        from cryptography.hazmat.primitives import serialization

        # ZooKeeper's PEM reader takes a PKCS#8 key ("BEGIN PRIVATE KEY") and the certificate
        # in one file; trustme writes the key in OpenSSL's traditional form.
        key = serialization.load_pem_private_key(self.files.server_key.read_bytes(), None)
        keystore = self.directory / "keystore.pem"
        keystore.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            + self.files.server_cert.read_bytes()
        )
        lines = [
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"secureClientPort={self.secure_port}",
            f"secureClientPortAddress={self.host}",
            f"ssl.keyStore.location={keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.files.ca}",
            "ssl.trustStore.type=PEM",
            f"ssl.clientAuth={self.client_auth}",
            # Checks a client certificate (need/want); not registered by default, and without
            # it the server closes every TLS connection ("X509 Auth provider not found").
            "authProvider.x509=org.apache.zookeeper.server.auth.X509AuthenticationProvider",
            # The client certificate names no host: the server checks its signature only.
            "ssl.hostnameVerification=false",
        ]
        with self.config_file.open("a") as config:
            config.write("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        # Called before each attempt to start: when a port was taken meanwhile (the base
        # class then retries on a new plain port), zoo.cfg is brought up to date, with a new
        # secure port if that one is taken.
        if not _bindable(self.host, self.secure_port):
            self.secure_port = free_port()
        config = self.config_file.read_text()
        for key, port in (("clientPort", self.port), ("secureClientPort", self.secure_port)):
            config = re.sub(rf"(?m)^{key}=\d+$", f"{key}={port}", config)
        self.config_file.write_text(config)
        # Debian's zookeeper.jar lists the Netty jars it needs in its manifest but one: the
        # codec, which the Netty connection factory's channel handler needs.
        command = super().command()
        at = command.index("-cp") + 1
        command[at] += f":{NETTY_CODEC_JAR}"
        return command

    def client_context(self) -> ssl.SSLContext:
        """A context that trusts the CA and presents the client certificate."""
        context = ssl.create_default_context(cafile=str(self.files.ca))
        context.load_cert_chain(str(self.files.client))
        return context

    def probe(self) -> bool:
        # The plain port may serve before the secure one listens.
        tls = self.client_context()
        answer = four_letter_word(self.host, self.secure_port, "srvr", tls=tls)
        return super().probe() and answer is not None and "Mode: " in answer


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class ZooKeeperEnsemble:
    """Three ZooKeeper servers in one quorum, on free loopback ports."""

    def __init__(self, size: int = 3) -> None:
        peers = [(i, free_port(), free_port()) for i in range(1, size + 1)]
        self.members = [ZooKeeperServer(peers=peers, server_id=i) for i, _, _ in peers]

    @property
    def url(self) -> str:
        """``zookeeper://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``."""
        return "zookeeper://" + ",".join(f"{m.host}:{m.port}" for m in self.members)

    def start(self) -> ZooKeeperEnsemble:
        for member in self.members:
            member.start()  # up (ruok) at once; serving needs the quorum
        self.wait_serving()
        return self

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Block until every running member serves clients (a leader was elected)."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            running = [m for m in self.members if m.running]
            if all(m.serving() for m in running):
                return
            if time.monotonic() > deadline:
                logs = "\n".join(m.log_tail(15) for m in running)
                raise RuntimeError(f"ensemble did not elect a leader in {timeout:g}s:\n{logs}")
            time.sleep(0.05)

    def leader(self) -> ZooKeeperServer:
        for member in self.members:
            if member.running and member.mode() == "leader":
                return member
        raise RuntimeError("the ensemble has no leader now")

    def restart_stopped(self) -> None:
        """Start again every member that was killed or stopped, and wait for the quorum."""
        for member in self.members:
            if not member.running:
                member.start()
        self.wait_serving()

    def close(self) -> None:
        for member in self.members:
            member.close()

    def __enter__(self) -> ZooKeeperEnsemble:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------- the probe


class ZooKeeperProbe:
    """Looks at the tree with its own plain aiozk client (never through aiodlock).

    ``auth=(user, password)`` authenticates it with ZooKeeper's digest scheme (once, after
    connecting: the probe is not meant to survive a reconnection with its identity).
    """

    def __init__(self, hosts: str, root: str, *, auth: tuple[str, str] | None = None) -> None:
        from aiozk import ZKClient

        self.hosts = hosts
        self.root = root
        self.auth = auth
        self.client = ZKClient(hosts, session_timeout=10)
        self._started = False

    async def start(self) -> ZooKeeperProbe:
        from aiozk import protocol

        async with asyncio.timeout(10):
            await self.client.start()
            self._started = True
            if self.auth is not None:
                user, password = self.auth
                request = protocol.AuthRequest(
                    type=0, scheme="digest", auth=f"{user}:{password}".encode()
                )
                await self.client.session.conn.send(request)
        return self

    async def get_acl(self, path: str) -> list[str]:
        """The ACL of ``path`` as ``scheme:id:perms`` strings (perms as ZooKeeper's letters
        ``cdrwa``), as the server shows it to this probe's identity."""
        from aiozk import protocol

        response = await self.client.send(protocol.GetACLRequest(path=path))
        letters = {"c": 4, "d": 8, "r": 1, "w": 2, "a": 16}  # zkCli's order: cdrwa
        return [
            f"{a.id.scheme}:{a.id.id}:"
            + "".join(letter for letter, bit in letters.items() if a.perms & bit)
            for a in response.acl
        ]

    async def stat(self, path: str) -> Any | None:
        from aiozk import exc as zk_exc

        try:
            _, stat = await self.client.get(path)
        except zk_exc.NoNode:
            return None
        return stat

    async def sync(self) -> None:
        """Let the probe's server catch up with the leader: on an ensemble, a listing sent
        right after a client's create may otherwise reach a follower that has not applied it."""
        from aiozk import protocol

        await self.client.send(protocol.SyncRequest(path="/"))

    async def children(self, path: str) -> list[str]:
        from aiozk import exc as zk_exc

        try:
            return [str(c) for c in await self.client.get_children(path)]
        except zk_exc.NoNode:
            return []

    async def walk(self, path: str) -> list[tuple[str, Any]]:
        """Every node at and under ``path`` with its stat (depth first)."""
        stat = await self.stat(path)
        if stat is None:
            return []
        found = [(path, stat)]
        for child in sorted(await self.children(path)):
            found += await self.walk(f"{path.rstrip('/')}/{child}")
        return found

    async def lock_nodes(self, namespace: str, name: str) -> list[str]:
        """Paths of every contender node of ``name`` (all families)."""
        from aiodlock.backends.zookeeper import encode_segment, namespace_path

        base = f"{namespace_path(self.root, namespace)}/{encode_segment(name)}"
        await self.sync()
        return [
            f"{base}/{family}/{node}"
            for family in await self.children(base)
            for node in await self.children(f"{base}/{family}")
        ]

    async def contenders_under(self, base: str) -> list[str]:
        """Paths of every contender node of every lock under a namespace directory."""
        return [
            f"{base}/{name}/{family}/{node}"
            for name in await self.children(base)
            for family in await self.children(f"{base}/{name}")
            for node in await self.children(f"{base}/{name}/{family}")
        ]

    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        from aiozk import exc as zk_exc

        nodes = await self.lock_nodes(namespace, name)
        assert nodes, "nothing to break"
        for path in nodes:
            with contextlib.suppress(zk_exc.NoNode):
                await self.client.delete(path, force=True)

    async def leftovers(self, namespace: str) -> list[str]:
        """Every node under the namespace but the (empty) directory levels.

        ``<namespace>/<name>/<family>`` are CONTAINER nodes, reaped by the server once empty
        (test_zookeeper.py checks that). A ZooKeeper stat does not tell a container from a
        persistent node (it shows ephemeralOwner 0 for both), so what counts as left over is
        anything ephemeral and anything below a family directory: a contender node.
        """
        from aiodlock.backends.zookeeper import namespace_path

        return await self.leftovers_under(namespace_path(self.root, namespace))

    async def leftovers_under(self, base: str) -> list[str]:
        """:meth:`leftovers` for a namespace directory given by its path."""
        await self.sync()
        return [
            f"{path} (ephemeralOwner={stat.ephemeral_owner:#x})"
            for path, stat in await self.walk(base)
            if stat.ephemeral_owner != 0 or path.removeprefix(base).count("/") > 2
        ]

    async def aclose(self) -> None:
        if self._started:
            self._started = False
            async with asyncio.timeout(10):
                await self.client.close()
