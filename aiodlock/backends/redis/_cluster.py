"""Redis Cluster as a :class:`~._source.ConnectionSource`: ``redis+cluster://``.

``redis+cluster://[[user]:password@]h1:p1[,h2:p2...]``: seed nodes (any of the cluster's
nodes; the client learns the rest from them). There is no database (Cluster has only db 0).

Commands go through redis-py's asyncio ``RedisCluster``, which routes each one by the slot of
its keys and follows ``MOVED`` and ``ASK`` (slot migrations) on its own. Every key of one lock
name shares the hash tag ``{ns:name}`` (:mod:`._keys`), so each lock step is one script on one
master -- never ``CROSSSLOT``. Everything else comes from :class:`~._node.NodeSource`: the
bounded commands, the two lanes (``max_connections`` commands in flight at a time, so at most
that many command connections per master), the error translation.

redis-py's own retries stay off, as on one server: a connection error fails that command once
(``BackendError``) and makes the client read the cluster's slot map again before the next, so
after a failover the next command goes to the new master.

Side connections (pub/sub and BLPOP wakeups) go to the master of a key's slot
(:meth:`ClusterSource.route`); the sharded pub/sub hub is in :mod:`._sharded`.

What a failover can lose, and how the holder finds out, is in docs/redis.md ("Cluster").

Example::

    source = ClusterSource(parse_url("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000"), {})
    await source.open()
    source.route(b"{locks:job}")  # "10.0.0.2:7000": the master of the key's slot
    source.describe()  # "redis+cluster://:***@10.0.0.1:7000,10.0.0.2:7000"
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection

from ._node import TLS_OPTIONS, NodeSource, connection_defaults, refuse_node_options

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import AbstractConnection

    from ..._url import ParsedURL

__all__ = ["ClusterSource"]

_DEFAULT_PORT: Final = 6379
# A slot map read this recently is fresh enough for a waiter looking for its channel's master:
# a burst of evicted waiters shares one CLUSTER SLOTS.
_REFRESH_INTERVAL: Final = 0.05
_SCAN_COUNT: Final = 1000


class ClusterSource(NodeSource):
    """The masters of a Redis Cluster, routed by slot (see the module docstring).

    Options: those of :class:`NodeSource` but ``redis_client``, ``db`` and the TLS ones.
    """

    options: ClassVar[Mapping[str, type]] = {
        key: kind
        for key, kind in NodeSource.options.items()
        if key not in ("redis_client", "db", *TLS_OPTIONS)
    }

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        if options.get("redis_client") is not None:
            # Checked first: NodeSource would take the client's pool for the commands.
            raise ValueError(f"option redis_client is not supported on {url.scheme}://")
        super().__init__(url, options)

    def _connection_settings(
        self, url: ParsedURL, options: Mapping[str, Any], connect_timeout: float
    ) -> tuple[type[AbstractConnection], dict[str, Any]]:
        refuse_node_options(url, options, "a cluster has database 0 only")
        if not url.hosts:
            raise ValueError(
                f"{url.scheme}:// needs seed nodes: {url.scheme}://host1:7000,host2:7000"
            )
        if url.path.strip("/") not in ("", "0"):
            raise ValueError(
                f"{url.scheme}:// has no database to choose (a cluster has database 0 only), "
                f"got path {url.path!r}"
            )
        self._seeds = [(host or "localhost", port or _DEFAULT_PORT) for host, port in url.hosts]
        self._refreshed = -_REFRESH_INTERVAL
        self._refreshing: asyncio.Future[None] | None = None
        settings = connection_defaults(url, connect_timeout, db=0)
        settings["socket_keepalive"] = True
        return Connection, settings

    def _new_client(self) -> aioredis.Redis:
        kwargs = {key: value for key, value in self._conn_kwargs.items() if key != "db"}
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in self._seeds],
            # Our lanes keep at most max_connections commands in flight, so no master is
            # asked for more connections than this (redis-py fails rather than waits).
            max_connections=self._max_connections,
            # Locks on the slots still served go on while a master is being replaced.
            require_full_coverage=False,
            **kwargs,
        )
        # RedisCluster is not a Redis, but it has every method the scripts call
        # (execute_command, script_load), routed by the slot of the keys.
        return cast("aioredis.Redis", cluster)

    def _command_client(self, shared: aioredis.Redis) -> aioredis.Redis:
        # The cluster client routes each command to its master's pool.
        return shared

    async def aclose(self) -> None:
        """:meth:`NodeSource.aclose`, then wait (bounded) for the disconnects redis-py runs in
        tasks of its own: a master that left the slot map (a failover) is dropped with its
        idle connections closing in the background, and one still open when the event loop
        ends is left to the GC (an unraisable ``ResourceWarning``)."""
        client = self._client
        await super().aclose()
        if client is None:
            return
        manager = cast(RedisCluster, client).nodes_manager
        pending = set(getattr(manager, "_background_tasks", ()))
        for node in manager.nodes_cache.values():
            pending.update(getattr(node, "_background_tasks", ()))
        if pending:
            await asyncio.wait(pending, timeout=self.connect_timeout)

    @property
    def cluster(self) -> RedisCluster:
        """The command client (``BackendError`` before :meth:`open` and once closed)."""
        return cast(RedisCluster, self.client)

    def route(self, key: bytes) -> str:
        """``host:port`` of the master that serves ``key``'s slot, as far as the client knows
        (:meth:`refresh` reads the slot map again)."""
        cluster = self.cluster
        with self.errors("wakeup"):
            return str(cluster.nodes_manager.get_node_from_slot(cluster.keyslot(key)).name)

    def new_connection(self, purpose: str, route: str = "") -> AbstractConnection:
        """A side connection to the master named ``route`` (default: the first seed)."""
        if route:
            host, _, port = route.rpartition(":")
            where: tuple[str, int] = (host, int(port))
        else:
            where = self._seeds[0]
        settings = {**self._conn_kwargs, "host": where[0], "port": where[1]}
        settings["client_name"] = f"aiodlock:{purpose}"
        return Connection(**settings)

    async def refresh(self) -> None:
        """Read the cluster's slot map again (after a side connection found a key's slot
        elsewhere, or its master gone). Callers that ask at the same time share one read (its
        error is reported to the first), and a read finished within the last 50 ms is
        reused. Raises ``BackendError``."""
        running = self._refreshing
        if running is not None:
            await asyncio.wait((running,))
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._refreshed < _REFRESH_INTERVAL:
            return
        done = self._refreshing = loop.create_future()
        try:
            with self.errors("wakeup"):
                async with asyncio.timeout(self.connect_timeout):
                    await self.cluster.nodes_manager.initialize()
        finally:
            self._refreshed = loop.time()
            self._refreshing = None
            done.set_result(None)

    async def scan_iter(self, match: str) -> AsyncIterator[bytes]:
        """Every key matching the glob ``match``: ``SCAN`` on every master, page by page,
        each page a bounded command (a slot moving meanwhile may report a key twice)."""
        with self.errors("inspect"):
            masters = [node.name for node in self.cluster.get_primaries()]
        for name in masters:
            cursor = 0
            while True:
                with self.errors("inspect"):
                    cursor, keys = await self.call(_scan_page, name, cursor, match)
                for key in keys:
                    yield key if isinstance(key, bytes) else str(key).encode()
                if cursor == 0:
                    break


async def _scan_page(
    client: aioredis.Redis, node_name: str, cursor: int, match: str
) -> tuple[int, list[Any]]:
    cluster = cast(RedisCluster, client)
    node = cluster.get_node(node_name=node_name)
    if node is None:  # no longer in the cluster: nothing more to read there
        return 0, []
    reply: Any = await cluster.scan(cursor, match=match, count=_SCAN_COUNT, target_nodes=node)
    cursors, keys = reply  # a cluster's SCAN answers with a cursor per node
    return int(cursors[node_name] if isinstance(cursors, dict) else cursors), list(keys)
