"""A Redis Cluster for the tests: three masters with one replica each, six throw-away
``redis-server`` processes on free loopback ports (see :mod:`tests.servers`).

Imported only by the Cluster test modules' fixtures (it imports the redis driver, sync API, to
ask the nodes about the cluster, fail over and move slots).

Cheap to run: no persistence, diskless replication at once, and a node timeout of 2 s (short
enough for a failover test, long enough that a loaded 2-core machine does not fail nodes over
by itself).

Usage::

    with ClusterDeployment() as cluster:
        url = cluster.url  # "redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
        master = cluster.master_of(b"{ns:name}")
        cluster.failover(master)  # CLUSTER FAILOVER on its replica
"""

from __future__ import annotations

import subprocess
import time
from types import TracebackType
from typing import Any, Final

import redis

from tests.servers import RedisServer, free_port

__all__ = ["ClusterDeployment", "ClusterNodeServer"]

NODE_TIMEOUT_MS: Final = 2000


class ClusterNodeServer(RedisServer):
    """A ``redis-server`` with ``cluster-enabled yes``; its bus listens on a free port of its
    own (``cluster-port``: the default, port + 10000, may be taken or out of range). Its
    ``nodes.conf`` stays in its directory, so a restarted node rejoins as itself."""

    def __init__(self) -> None:
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica may take over whatever its replication offset (a test kills masters).
            "--cluster-replica-validity-factor", "0",
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        super().__init__(args=args)
        self.bus_port = 0

    def listen_args(self) -> list[str]:
        if not self.bus_port:
            self.bus_port = free_port()
        return [*super().listen_args(), "--cluster-port", str(self.bus_port)]

    def client(self) -> redis.Redis:
        return redis.Redis(self.host, self.port, socket_timeout=5)

    def cluster(self, *args: Any) -> Any:
        """``CLUSTER <args>`` on this node."""
        return self.client().execute_command("CLUSTER", *args)  # type: ignore[no-untyped-call]

    @property
    def node_id(self) -> str:
        return bytes(self.cluster("MYID")).decode()


class ClusterDeployment:
    """Three masters, a replica of each, slots split evenly (``redis-cli --cluster create``)."""

    def __init__(self, *, ready_timeout: float = 60.0) -> None:
        self.nodes = [ClusterNodeServer() for _ in range(6)]
        self.ready_timeout = ready_timeout

    @property
    def url(self) -> str:
        """``redis+cluster://`` with the three first nodes as seeds."""
        return "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in self.nodes[:3])

    def seed_url(self) -> str:
        """``redis://`` to a running node, for redis-py's own cluster client (probes)."""
        node = self.running()[0]
        return f"redis://{node.host}:{node.port}"

    def start(self) -> ClusterDeployment:
        for node in self.nodes:
            node.start()
        addresses = [f"{n.host}:{n.port}" for n in self.nodes]
        create = ["redis-cli", "--cluster", "create", *addresses]
        done = subprocess.run(
            [*create, "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=self.ready_timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        self.wait_ready()
        return self

    def running(self) -> list[ClusterNodeServer]:
        return [n for n in self.nodes if n.running and not n.paused]

    def masters(self) -> list[ClusterNodeServer]:
        """The running nodes that are masters with slots, by their own account."""
        found = []
        for node in self.running():
            role = node.client().role()
            if role[0] == b"master" and _owned_slots(node):
                found.append(node)
        return found

    def node_at(self, port: int) -> ClusterNodeServer:
        return next(n for n in self.nodes if n.port == port)

    def slot_of(self, key: bytes) -> int:
        return int(self.running()[0].cluster("KEYSLOT", key))

    def master_of(self, key: bytes) -> ClusterNodeServer:
        """The master serving ``key``'s slot, as the running nodes agree."""
        slot = self.slot_of(key)
        for start, end, master, *_ in self.running()[0].cluster("SLOTS"):
            if start <= slot <= end:
                return self.node_at(int(master[1]))
        raise RuntimeError(f"no node serves slot {slot}")

    def replica_of(self, master: ClusterNodeServer) -> ClusterNodeServer:
        """A running replica of ``master``."""
        master_id = master.node_id
        for node in self.running():
            info = node.client().info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                return node
        raise RuntimeError(f"no running replica of {master!r} ({master_id})")

    def failover(self, master: ClusterNodeServer) -> ClusterNodeServer:
        """``CLUSTER FAILOVER`` on a replica of ``master``; returns it once every running
        node agrees that it is the master."""
        replica = self.replica_of(master)
        for _ in range(3):  # a manual failover times out (5 s) if the master stalls
            replica.cluster("FAILOVER")
            try:
                self._wait(lambda: _is_master(replica), f"{replica!r} to take over", 8.0)
            except RuntimeError:
                continue
            break
        self.wait_master(replica)
        return replica

    def wait_master(self, node: ClusterNodeServer) -> None:
        """Wait until ``node`` is a master with slots and the cluster is healthy again."""

        self._wait(lambda: _is_master(node), f"{node!r} to become a master")
        self.wait_ready()

    def move_slot(self, slot: int, target: ClusterNodeServer) -> None:
        """Move ``slot`` with its keys to ``target`` the way ``redis-cli --cluster reshard``
        does: IMPORTING on the target, MIGRATING on the source, MIGRATE every key, then
        SETSLOT NODE on both and the other masters."""
        source = self.node_at(self._owner_port(slot))
        target_id, source_id = target.node_id, source.node_id
        target.cluster("SETSLOT", slot, "IMPORTING", source_id)
        source.cluster("SETSLOT", slot, "MIGRATING", target_id)
        client = source.client()
        while keys := source.cluster("GETKEYSINSLOT", slot, 100):
            client.execute_command(  # type: ignore[no-untyped-call]
                "MIGRATE", target.host, target.port, "", 0, 5000, "REPLACE", "KEYS", *keys
            )
        for node in (target, source, *self.masters()):
            node.cluster("SETSLOT", slot, "NODE", target_id)
        self._wait(lambda: self._owner_port(slot) == target.port, f"slot {slot} to move")
        self.wait_ready()

    def _owner_port(self, slot: int) -> int:
        for start, end, master, *_ in self.running()[0].cluster("SLOTS"):
            if start <= slot <= end:
                return int(master[1])
        raise RuntimeError(f"no node serves slot {slot}")

    def wait_ready(self) -> None:
        """Wait until every running node reports ``cluster_state:ok`` and they all agree on
        the owner of every slot (one configuration epoch seen everywhere)."""
        self._wait(self._agreed, "the cluster to be ok and agreed")

    def _agreed(self) -> bool:
        views = set()
        running = {n.port for n in self.running()}
        for node in self.running():
            info = bytes(node.cluster("INFO")).decode()
            if "cluster_state:ok" not in info:
                return False
            slots = node.cluster("SLOTS")
            views.add(tuple(sorted((s, e, int(m[1])) for s, e, m, *_ in slots)))
            # Every running node known and healthy here (a manual failover needs the master
            # to know its replica), and a replica in sync with its master.
            healthy = set()
            for line in bytes(node.cluster("NODES")).decode().splitlines():
                fields = line.split()
                flags = fields[2]
                if not any(bad in flags for bad in ("fail", "handshake", "noaddr")):
                    healthy.add(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
            if not running <= healthy:
                return False
            replication = node.client().info("replication")
            if replication.get("role") == "slave" and (
                replication.get("master_link_status") != "up"
            ):
                return False
        return len(views) == 1

    def _wait(self, condition: Any, what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except redis.RedisError as exc:
                last = exc
            time.sleep(0.1)  # harness set-up: waiting for other processes, no event to await
        tails = "\n".join(f"--- {n!r}\n{n.log_tail(10)}" for n in self.nodes)
        raise RuntimeError(f"timed out waiting for {what} (last error: {last})\n{tails}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> ClusterDeployment:
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


def _is_master(node: ClusterNodeServer) -> bool:
    role = node.client().role()
    return bool(role[0] == b"master" and _owned_slots(node))


def _owned_slots(node: ClusterNodeServer) -> int:
    # CLUSTER NODES "myself" line: slot ranges follow the 8 fixed fields.
    for line in bytes(node.cluster("NODES")).decode().splitlines():
        fields = line.split()
        if "myself" in fields[2]:
            return len(fields) - 8
    return 0
