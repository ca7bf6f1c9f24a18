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
from typing import Any, Final

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

    def master_address(self) -> tuple[str, int]:
        """``SENTINEL GET-MASTER-ADDR-BY-NAME``."""
        host, port = self._ask("SENTINEL GET-MASTER-ADDR-BY-NAME")
        return str(host), int(port)

    def knows(self) -> tuple[int, int]:
        """How many replicas and other sentinels of :data:`SERVICE` this sentinel knows."""
        replicas = self._ask("SENTINEL REPLICAS")
        sentinels = self._ask("SENTINEL SENTINELS")
        return len(replicas), len(sentinels)

    def _ask(self, command: str) -> Any:
        return self.client().execute_command(command, SERVICE)  # type: ignore[no-untyped-call]


class SentinelDeployment:
    """A master, ``replicas`` replicas of it, and three sentinels (quorum 2) monitoring
    :data:`SERVICE`.

    ``down_after_ms``: how long the master may not answer before the sentinels fail over. Keep
    it long where no failover is wanted (a loaded 2-core machine can stall a server for a
    second or two), shorter where a test kills the master. With two replicas, a killed master
    leaves a new master *and* a replica of it (what ``wait_replicas=1`` needs to go on).
    """

    def __init__(
        self, *, replicas: int = 1, down_after_ms: int = 10_000, ready_timeout: float = 30.0
    ) -> None:
        # Diskless, at once: a replica (re)joining is in sync in milliseconds, not after the
        # default 5 s delay (a replica still waiting for its first sync acknowledges nothing).
        sync = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        self.master = RedisServer(args=sync)
        self.replicas = [RedisServer(args=sync) for _ in range(replicas)]
        self.sentinels = [
            RedisSentinelServer(self.master, down_after_ms=down_after_ms) for _ in range(3)
        ]
        self.ready_timeout = ready_timeout

    @property
    def servers(self) -> list[RedisServer]:
        """The data servers (which one is the master changes with failovers)."""
        return [self.master, *self.replicas]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelDeployment:
        self.master.start()
        for replica in self.replicas:
            replica.args += ["--replicaof", self.master.host, str(self.master.port)]
            replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        # Ready when every sentinel knows the replicas and the two other sentinels: only then
        # can a failover be agreed on and carried out.
        self._wait(self._ready, "the sentinels to discover the replicas and each other")
        for replica in self.replicas:
            self.wait_for_replica(replica)
        return self

    def master_address(self) -> tuple[str, int]:
        """Where the sentinels say the master is now."""
        for sentinel in self.sentinels:
            if not sentinel.running or sentinel.paused:
                continue
            try:
                return sentinel.master_address()
            except redis.RedisError:
                continue
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
        """Wait until every sentinel names a master other than ``old``, and it takes writes;
        then until the other servers still running replicate it. Returns the new master."""
        found: list[RedisServer] = []

        def promoted() -> bool:
            ports = {s.master_address()[1] for s in self.sentinels if s.running and not s.paused}
            if len(ports) != 1 or old.port in ports:
                return False
            new = next(s for s in self.servers if s.port in ports)
            role = redis.Redis(new.host, new.port, socket_timeout=2).role()
            found[:] = [new]
            return bool(role[0] == b"master")

        self._wait(promoted, f"a master other than {old!r}")
        new = found[0]
        for server in self.servers:
            if server not in (old, new) and server.running and not server.paused:
                self.wait_for_replica(server)
        return new

    def wait_for_replica(self, server: RedisServer) -> None:
        """Wait until ``server`` replicates the master the sentinels name, in sync."""

        def replicating() -> bool:
            _, master_port = self.master_address()
            info = redis.Redis(server.host, server.port, socket_timeout=2).info("replication")
            return bool(
                info.get("role") == "slave"
                and int(info.get("master_port", 0)) == master_port
                and info.get("master_link_status") == "up"
            )

        self._wait(replicating, f"{server!r} to replicate the master")

    def _ready(self) -> bool:
        for sentinel in self.sentinels:
            replicas, others = sentinel.knows()
            if replicas < 1 or others < len(self.sentinels) - 1:
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
        for server in [*self.sentinels, *self.replicas, self.master]:
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
