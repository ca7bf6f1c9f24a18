"""The etcd backend's test harness: a single member, a three-member cluster, and the probe.

Imported by the etcd test modules and, lazily, by the server fixtures of tests/conftest.py;
the aetcd driver is imported only when a probe is made, so importing this module needs no
driver.

Members are Debian's etcd 3.4 (``etcd-server``; ``etcdctl`` from ``etcd-client``), each in its
own directory on free loopback client and peer ports, with a heartbeat of 100 ms and an
election timeout of 1 s (a loaded two-core machine still keeps its leader; etcd's shortest
lease is then 2 s). :class:`EtcdCluster` runs three as one cluster (``--initial-cluster``) and
finds the leader with ``etcdctl endpoint status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Any, Final

from tests.servers import INSTALL_HINT, ServerProcess, free_port

if TYPE_CHECKING:
    import aiodlock
    from tests.servers import TLSFiles

__all__ = ["EtcdCluster", "EtcdProbe", "EtcdServer", "etcdctl"]

HEARTBEAT_MS: Final = 100
ELECTION_MS: Final = 1000


def etcdctl(endpoints: str, *args: str, timeout: float = 5.0, tls: TLSFiles | None = None) -> str:
    """Run ``etcdctl`` (API v3) against ``endpoints``; its stdout. RuntimeError if it fails."""
    options = [f"--endpoints={endpoints}", "--command-timeout=2s"]
    if tls is not None:
        options += [f"--cacert={tls.ca}", f"--cert={tls.client}", f"--key={tls.client}"]
    try:
        done = subprocess.run(
            ["etcdctl", *options, *args],
            env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise RuntimeError(f"etcdctl is not installed (etcd-client); {INSTALL_HINT}") from None
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"etcdctl {' '.join(args)}: no answer in {timeout:g}s") from exc
    if done.returncode != 0:
        raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


class EtcdServer(ServerProcess):
    """One etcd member, alone or one of an :class:`EtcdCluster` (``cluster``: the
    ``--initial-cluster`` string, ``name``: this member's name in it)."""

    binary = "etcd"

    def __init__(
        self,
        *,
        name: str = "solo",
        peer_port: int | None = None,
        cluster: str | None = None,
        tls: TLSFiles | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        super().__init__(start_timeout=start_timeout)
        self.tls = tls  # serve clients over TLS, and require a client certificate
        self.name = name
        self.peer_port = free_port() if peer_port is None else peer_port
        self.clustered = cluster is not None
        self.cluster = cluster or f"{name}=http://{self.host}:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:<port>``."""
        return f"etcd://{self.endpoint}"

    def command(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"
        client = f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"
        tls = []
        if self.tls is not None:
            tls = [
                f"--cert-file={self.tls.server_cert}",
                f"--key-file={self.tls.server_key}",
                f"--trusted-ca-file={self.tls.ca}",
                "--client-cert-auth",
            ]
        return [
            self.executable,
            f"--name={self.name}",
            f"--data-dir={self.directory / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.cluster}",
            "--initial-cluster-state=new",
            "--initial-cluster-token=aiodlock-tests",
            f"--heartbeat-interval={HEARTBEAT_MS}",
            f"--election-timeout={ELECTION_MS}",
            "--log-level=warn",
            "--logger=zap",
            "--unsafe-no-fsync",
            "--quota-backend-bytes=268435456",
            *tls,
        ]

    def probe(self) -> bool:
        if self.clustered:  # a member serves only once a quorum runs: its peer port is enough
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.peer_port), timeout=0.5),
            ):
                return True
            return False
        return self.serving()

    def serving(self) -> bool:
        """The member answers a linearizable read (so a leader exists)."""
        try:
            etcdctl(self.endpoint, "get", "--limit=1", "probe", timeout=3, tls=self.tls)
        except RuntimeError:
            return False
        return True

    def status(self) -> dict[str, Any] | None:
        try:
            out = etcdctl(
                self.endpoint, "endpoint", "status", "-w", "json", timeout=3, tls=self.tls
            )
        except RuntimeError:
            return None
        items: list[dict[str, Any]] = json.loads(out)
        return items[0]["Status"] if items else None


class EtcdCluster:
    """Three etcd members in one cluster, on free loopback ports."""

    def __init__(self, size: int = 3) -> None:
        names = [f"m{i}" for i in range(1, size + 1)]
        peers = {name: free_port() for name in names}
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in peers.items())
        self.members = [EtcdServer(name=n, peer_port=p, cluster=cluster) for n, p in peers.items()]

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``."""
        return f"etcd://{self.endpoints}"

    def start(self) -> EtcdCluster:
        for member in self.members:
            member.start()  # up (peer port) at once; serving needs the quorum
        self.wait_serving()
        return self

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Block until every running member serves (a leader was elected)."""
        deadline = time.monotonic() + timeout
        while True:
            running = [m for m in self.members if m.running and not m.paused]
            if running and all(m.serving() for m in running):
                return
            if time.monotonic() > deadline:
                logs = "\n".join(m.log_tail(15) for m in self.members)
                raise RuntimeError(f"cluster did not elect a leader in {timeout:g}s:\n{logs}")
            time.sleep(0.1)

    def leader(self) -> EtcdServer:
        """The member that leads now (``etcdctl endpoint status``)."""
        for member in self.members:
            if not member.running or member.paused:
                continue
            status = member.status()
            if status is not None and status["leader"] == status["header"]["member_id"]:
                return member
        raise RuntimeError("the cluster has no leader now")

    def restart_stopped(self) -> None:
        """Start again every member that was killed, resume paused ones, wait for quorum."""
        for member in self.members:
            if member.paused:
                member.resume()
            elif not member.running:
                member.start()
        self.wait_serving()

    def close(self) -> None:
        for member in self.members:
            member.close()

    def __enter__(self) -> EtcdCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------- the probe


class EtcdProbe:
    """Looks at the keys with its own plain aetcd client (never through aiodlock)."""

    def __init__(self, endpoint: str, prefix: str) -> None:
        import aetcd

        host, _, port = endpoint.rpartition(":")
        self.prefix = prefix
        self.client = aetcd.Client(host=host, port=int(port), timeout=5)

    async def start(self) -> EtcdProbe:
        async with asyncio.timeout(10):
            await self.client.connect()
        return self

    def namespace_prefix(self, namespace: str) -> bytes:
        from aiodlock.backends.etcd import encode_segment

        return f"{self.prefix}/{encode_segment(namespace)}/".encode()

    def name_prefix(self, namespace: str, name: str) -> bytes:
        from aiodlock.backends.etcd import encode_segment

        return self.namespace_prefix(namespace) + f"{encode_segment(name)}/".encode()

    async def keys(self, prefix: bytes) -> list[tuple[bytes, Any]]:
        """Every key under ``prefix`` with its metadata (create revision, lease)."""
        found = await self.client.get_prefix(prefix)
        return [(kv.key, kv) for kv in found.kvs]

    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        prefix = self.name_prefix(namespace, name)
        assert await self.keys(prefix), "nothing to break"
        await self.client.delete_prefix(prefix)

    async def leftovers(self, namespace: str) -> list[str]:
        """Every key still under the namespace (keys die with their lease or release)."""
        return [
            f"{key.decode()} (lease {meta.lease:x})"
            for key, meta in await self.keys(self.namespace_prefix(namespace))
        ]

    async def aclose(self) -> None:
        async with asyncio.timeout(10):
            await self.client.close()
