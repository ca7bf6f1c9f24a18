"""A Redis Sentinel deployment for the tests: a master, a replica and three sentinels, each a
throw-away process on a free loopback port (see :mod:`tests.servers`).

Imported only by the Sentinel test modules' fixtures (it imports the redis driver, sync API,
to ask the sentinels where the master is and to start failovers).

Usage::

    with SentinelDeployment() as deployment:
        url = deployment.url  # "redis+sentinel://127.0.0.1:p1,...,127.0.0.1:p3/aiodlock/0"
        deployment.failover()  # SENTINEL FAILOVER, returns once the replica is the master
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Final

import redis

from tests.servers import RedisServer

__all__ = ["SERVICE", "RedisSentinelServer", "SentinelDeployment"]

SERVICE: Final = "aiodlock"


class RedisSentinelServer(RedisServer):
    """``redis-server --sentinel`` watching ``master`` as :data:`SERVICE`: the master counts
    as down after ``down_after_ms`` without an answer; a failover may take up to 10 s."""

    def __init__(self, master: RedisServer, *, quorum: int = 2, down_after_ms: int) -> None:
        super().__init__()
        self.master = master
        self.quorum = quorum
        self.down_after_ms = down_after_ms

    @property
    def config(self) -> Path:
        return self.directory / "sentinel.conf"

    def prepare(self) -> None:
        # Sentinel rewrites its file as it learns the deployment: it must be its own.
        self.config.write_text(
            f"sentinel monitor {SERVICE} {self.master.host} {self.master.port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )

    def command(self) -> list[str]:
        return [
            self.executable, str(self.config), "--sentinel",
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.directory),
            "--logfile", str(self.log_file),
            "--daemonize", "no",
        ]  # fmt: skip

    def client(self) -> redis.Redis:
        return redis.Redis(self.host, self.port, socket_timeout=2, decode_responses=True)


class SentinelDeployment:
    """A master, a replica of it, and three sentinels (quorum 2) monitoring :data:`SERVICE`.

    ``down_after_ms``: how long the master may not answer before the sentinels fail over. Keep
    it long where no failover is wanted (a loaded 2-core machine can stall a server for a
    second), short where a test kills the master.
    """

    def __init__(self, *, down_after_ms: int = 10_000, ready_timeout: float = 30.0) -> None:
        self.master = RedisServer()
        self.replica = RedisServer()
        self.sentinels = [
            RedisSentinelServer(self.master, down_after_ms=down_after_ms) for _ in range(3)
        ]
        self.ready_timeout = ready_timeout

    @property
    def servers(self) -> list[RedisServer]:
        """Both data servers (which one is the master changes with failovers)."""
        return [self.master, self.replica]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelDeployment:
        self.master.start()
        self.replica.args = ["--replicaof", self.master.host, str(self.master.port)]
        self.replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        # Ready when every sentinel knows the replica and the two other sentinels: only then
        # can a failover be agreed on and carried out.
        self._wait(self._ready, "the sentinels to discover the replica and each other")
        return self

    def master_address(self) -> tuple[str, int]:
        """Where the sentinels say the master is now."""
        for sentinel in self.sentinels:
            if not sentinel.running or sentinel.paused:
                continue
            try:
                host, port = sentinel.client().sentinel_get_master_addr_by_name(SERVICE)
            except redis.RedisError:
                continue
            return str(host), int(port)
        raise RuntimeError("no sentinel answers")

    def current_master(self) -> RedisServer:
        """The data server the sentinels name as master."""
        _, port = self.master_address()
        return next(s for s in self.servers if s.port == port)

    def master_url(self) -> str:
        """``redis://`` to the current master (for probes)."""
        host, port = self.master_address()
        return f"redis://{host}:{port}/0"

    def failover(self) -> RedisServer:
        """``SENTINEL FAILOVER``: the replica becomes the master (the old one its replica);
        returns the new master once it takes writes and every sentinel names it."""
        old = self.current_master()
        self.sentinels[0].client().sentinel_failover(SERVICE)
        return self.wait_for_new_master(old)

    def wait_for_new_master(self, old: RedisServer) -> RedisServer:
        """Wait until the sentinels have promoted the server that is not ``old``."""
        new = next(s for s in self.servers if s is not old)

        def promoted() -> bool:
            for sentinel in self.sentinels:
                if sentinel.running and not sentinel.paused:
                    _, port = sentinel.client().sentinel_get_master_addr_by_name(SERVICE)
                    if int(port) != new.port:
                        return False
            role = redis.Redis(new.host, new.port, socket_timeout=2).role()
            return bool(role[0] == b"master")

        self._wait(promoted, f"{new!r} to become the master")
        return new

    def wait_for_replica(self, server: RedisServer) -> None:
        """Wait until ``server`` replicates the current master again (after a restart)."""

        def replicating() -> bool:
            info = redis.Redis(server.host, server.port, socket_timeout=2).info("replication")
            return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")

        self._wait(replicating, f"{server!r} to replicate the master")

    def _ready(self) -> bool:
        for sentinel in self.sentinels:
            client = sentinel.client()
            if len(client.sentinel_slaves(SERVICE)) < 1:
                return False
            if len(client.sentinel_sentinels(SERVICE)) < len(self.sentinels) - 1:
                return False
        return True

    def _wait(self, condition: object, what: str) -> None:
        assert callable(condition)
        deadline = time.monotonic() + self.ready_timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except redis.RedisError as exc:
                last = exc
            time.sleep(0.1)  # harness set-up: waiting for other processes, no event to await
        tails = "\n".join(f"--- {s!r}\n{s.log_tail(15)}" for s in self.sentinels)
        raise RuntimeError(f"timed out waiting for {what} (last error: {last})\n{tails}")

    def close(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            server.close()

    def __enter__(self) -> SentinelDeployment:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
