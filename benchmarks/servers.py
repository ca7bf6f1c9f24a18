"""The servers of one run, started with the test harness's own classes on free loopback ports.

Redis from ``tests/servers.py``, Redis Cluster (three masters with a replica each) from
``tests/support_redis_cluster.py``, Sentinel (a master, a replica, three sentinels) from
``tests/support_sentinel.py``, Redlock's three masters from ``tests/support_redlock.py``,
ZooKeeper (standalone and a three-node ensemble) from ``tests/support_zookeeper.py``, etcd
from ``tests/support_etcd.py``, MariaDB from
``tests/support_mysql.py`` and PostgreSQL from ``tests/support_postgres.py``. A server that
cannot start makes its backend's rows unavailable (the reason goes into the report); it never
stops the other backends.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .adapters.base import Endpoint
from .scenarios.probes import zookeeper_word

__all__ = ["Server", "started"]


@dataclass(frozen=True, slots=True)
class Server:
    """A running server (``endpoint``), or why there is none (``error``)."""

    backend: str
    endpoint: Endpoint | None
    version: str = ""
    error: str = ""


def _redis_version(host: str, port: int) -> str:
    import redis

    client = redis.Redis(host=host, port=port)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def _redis() -> tuple[Any, Endpoint, str]:
    from tests.servers import RedisServer

    server = RedisServer().start()
    version = f"Redis {_redis_version(server.host, server.port)}"
    return server, Endpoint("redis", server.url), version


def _redis_cluster() -> tuple[Any, Endpoint, str]:
    from tests.support_redis_cluster import ClusterDeployment

    cluster = ClusterDeployment().start()
    version = _redis_version(cluster.nodes[0].host, cluster.nodes[0].port)
    where = f"Redis Cluster {version} (3 masters + 3 replicas, one machine)"
    return cluster, Endpoint("redis-cluster", cluster.url), where


def _redis_sentinel() -> tuple[Any, Endpoint, str]:
    from tests.support_sentinel import SentinelDeployment

    deployment = SentinelDeployment(replicas=1).start()
    version = _redis_version(deployment.master.host, deployment.master.port)
    where = f"Redis {version} master + 1 replica, 3 sentinels (one machine)"
    return deployment, Endpoint("redis-sentinel", deployment.url), where


def _redlock() -> tuple[Any, Endpoint, str]:
    from tests.support_redlock import RedlockMasters

    masters = RedlockMasters(3).start()
    version = _redis_version(masters.servers[0].host, masters.servers[0].port)
    where = f"Redis {version} x 3 independent masters (one machine)"
    return masters, Endpoint("redlock", masters.url), where


def _zookeeper() -> tuple[Any, Endpoint, str]:
    from tests.support_zookeeper import ZooKeeperServer

    server = ZooKeeperServer().start()
    answer = zookeeper_word(server.host, server.port, "srvr")
    match = re.search(r"Zookeeper version: ([^\s,-]+)", answer)
    version = f"ZooKeeper {match.group(1) if match else '?'} (standalone, tick {server.tick_ms} ms)"
    return server, Endpoint("zookeeper", server.url), version


def _zookeeper_ensemble() -> tuple[Any, Endpoint, str]:
    from tests.support_zookeeper import ZooKeeperEnsemble

    ensemble = ZooKeeperEnsemble().start()
    first = ensemble.members[0]
    answer = zookeeper_word(first.host, first.port, "srvr")
    match = re.search(r"Zookeeper version: ([^\s,-]+)", answer)
    version = f"ZooKeeper {match.group(1) if match else '?'} (3-node ensemble, one machine)"
    return ensemble, Endpoint("zookeeper-ensemble", ensemble.url), version


def _etcd() -> tuple[Any, Endpoint, str]:
    from tests.support_etcd import ELECTION_MS, EtcdServer

    server = EtcdServer().start()
    status = server.status() or {}
    version = f"etcd {status.get('version', '?')} (one member, election {ELECTION_MS} ms)"
    return server, Endpoint("etcd", server.url), version


def _mysql() -> tuple[Any, Endpoint, str]:
    import pymysql  # type: ignore[import-untyped]  # comes with aiomysql, untyped

    from tests.support_mysql import MariaDBServer

    server = MariaDBServer().start()
    conn = pymysql.connect(**{k: v for k, v in server.connect_kwargs().items() if k != "db"})
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT VERSION()")
            (version,) = cursor.fetchone()
    finally:
        conn.close()
    return server, Endpoint("mysql", server.url), f"MariaDB {version}"


def _postgres() -> tuple[Any, Endpoint, str]:
    import subprocess

    from tests.support_postgres import PostgresServer, postgres_bin_dir

    server = PostgresServer().start()
    version = subprocess.run(
        [str(postgres_bin_dir() / "postgres"), "--version"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return server, Endpoint("postgres", server.url), version.replace("postgres (", "(")


_STARTERS: dict[str, Callable[[], tuple[Any, Endpoint, str]]] = {
    "redis": _redis,
    "redis-cluster": _redis_cluster,
    "redis-sentinel": _redis_sentinel,
    "redlock": _redlock,
    "zookeeper": _zookeeper,
    "zookeeper-ensemble": _zookeeper_ensemble,
    "etcd": _etcd,
    "mysql": _mysql,
    "postgres": _postgres,
}


@contextlib.contextmanager
def started(backends: Sequence[str]) -> Iterator[dict[str, Server]]:
    """Start one server per backend; stop them all on exit."""
    with contextlib.ExitStack() as stack:
        servers: dict[str, Server] = {}
        for backend in backends:
            try:
                process, endpoint, version = _STARTERS[backend]()
            except Exception as exc:  # reported, not raised: the other backends still run
                servers[backend] = Server(backend, None, error=f"{type(exc).__name__}: {exc}")
                continue
            stack.callback(process.close)
            servers[backend] = Server(backend, endpoint, version)
        yield servers
