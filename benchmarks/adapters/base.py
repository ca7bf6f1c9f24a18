"""The interface every library is measured through: open, hold a named lock, close.

An adapter wraps one library (or the raw server commands) for one server. ``hold(name,
ttl=...)`` is a context manager whose entry acquires the lock, waiting as long as it takes, and
whose exit releases it: the library's own idiomatic acquire and release, nothing added.
Asynchronous libraries implement :class:`AsyncAdapter`; blocking ones :class:`SyncAdapter`
(the scenarios run them in threads).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import unquote, urlsplit

__all__ = ["POOL_SIZE", "AsyncAdapter", "Endpoint", "SyncAdapter"]

_FAMILIES = {
    "redis-cluster": "redis",
    "redis-sentinel": "redis",
    "zookeeper-ensemble": "zookeeper",
    "etcd-cluster": "etcd",
}

POOL_SIZE = 2000
"""Connection-pool ceiling given to the incumbents' redis-py clients. redis-py 8 defaults to
100, and then 900 of 1000 concurrent waiters fail with ``MaxConnectionsError``: raised so that
the waiters scenario measures what they cost rather than where they break."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a server listens, as aiodlock's URL (the other clients take its parts)."""

    backend: str
    url: str

    @property
    def family(self) -> str:
        """The kind of server: ``redis`` (also a Cluster or a Sentinel-watched master),
        ``redlock`` (independent Redis masters), ``zookeeper``, ``etcd``, ``mysql``,
        ``postgres``; the backend names a deployment of one (``zookeeper-ensemble``)."""
        return _FAMILIES.get(self.backend, self.backend)

    @property
    def nodes(self) -> list[tuple[str, int]]:
        """Every ``(host, port)`` of the URL (several for a cluster, an ensemble, sentinels
        or Redlock's masters)."""
        netloc = urlsplit(self.url).netloc.rpartition("@")[2]
        found = []
        for node in netloc.split(","):
            host, _, port = node.rpartition(":")
            found.append((host or "127.0.0.1", int(port)))
        return found

    @property
    def host(self) -> str:
        return self.nodes[0][0]

    @property
    def port(self) -> int:
        return self.nodes[0][1]

    @property
    def hosts(self) -> str:
        """``host:port[,host:port...]``, as ZooKeeper and etcd clients take it."""
        return ",".join(f"{host}:{port}" for host, port in self.nodes)

    @property
    def user(self) -> str:
        return unquote(urlsplit(self.url).username or "")

    @property
    def password(self) -> str:
        return unquote(urlsplit(self.url).password or "")

    @property
    def database(self) -> str:
        return urlsplit(self.url).path.strip("/")


class _Adapter:
    #: The server it talks to: "redis", "zookeeper", "mysql" or "none".
    backend: ClassVar[str]

    #: How many may hold one name at once (a semaphore's limit).
    holders: int = 1

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    def server_key(self, name: str) -> str | None:
        """The Redis key whose expiry frees lock ``name`` (for the handoff scenario)."""
        return None

    def crash_lease(self, *, ttl: float, session_timeout: float) -> float:
        """How long after a holder process dies its lock is freed, where no key's expiry
        tells (the handoff scenario): a ZooKeeper session's timeout, an etcd lease's TTL;
        0 where the server frees it with the connection."""
        if self.endpoint.family == "zookeeper":
            return session_timeout
        return 0.0


class AsyncAdapter(_Adapter, ABC):
    """An asyncio library: one instance is one client (its connections) in one process."""

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        """Acquire ``name`` on entry (waiting as long as needed), release it on exit."""


class SyncAdapter(_Adapter, ABC):
    """A blocking library: one instance is one client, shared by the threads of a process."""

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def hold(self, name: str, *, ttl: float) -> AbstractContextManager[object]:
        """Acquire ``name`` on entry (waiting as long as needed), release it on exit."""
