"""Redis Cluster as a :class:`~._source.ConnectionSource`: ``redis+cluster://h1:p1,h2:p2``.

Commands go through redis-py's ``RedisCluster``, routed by the slot of their keys (one hash tag
per lock name, so never ``CROSSSLOT``); the rest is :class:`~._node.NodeSource`'s. Side
connections go to the master of a key's slot (:meth:`ClusterSource.route`). A node that
hangs is not waited for: the seeds (and, when the slot map is read again, the known nodes)
are PINGed at once and only those that answered are asked. docs/redis.md ("Cluster", "Design
notes") explains failovers, retries and hung nodes.

Example::

    source = ClusterSource(parse_url("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000"), {})
    await source.open(tasks)
    source.route(b"{locks:job}")  # "10.0.0.2:7000": the master of the key's slot
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster
from redis.asyncio.connection import Connection
from redis.cluster import PRIMARY

from ._node import NodeSource
from ._node_settings import TLS_OPTIONS, connection_defaults, refuse_node_options
from ._source import disconnect_quietly

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import AbstractConnection

    from .. import Options, ParsedURL, Tasks
    from ._source import Prepare

_log = logging.getLogger("aiodlock.redis")

__all__ = ["ClusterSource"]

_DEFAULT_PORT: Final = 6379
# A slot map read this recently is fresh enough for a waiter looking for its channel's master:
# a burst of evicted waiters shares one CLUSTER SLOTS.
_REFRESH_INTERVAL: Final = 0.05
_SCAN_COUNT: Final = 1000
_MASTER_PING: Final = 0.5
"""Seconds a master has to answer a PING at connect before the scripts are loaded without it
(a master that hangs would hold the connect for ``connect_timeout``; it loads them on first
use)."""


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
        self, url: ParsedURL, options: Options, connect_timeout: float
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
        self._open_connections: set[Connection] = set()
        settings = connection_defaults(url, connect_timeout, db=0)
        settings["socket_keepalive"] = True
        return Connection, settings

    async def _handshake(
        self, client: aioredis.Redis, prepare: Prepare | None, tasks: Tasks
    ) -> None:
        """Read the slot map through the first seed to answer, then ``prepare`` (see
        :meth:`_prepare_without_silent`). Unlike a PING, which a cluster client sends to every node
        (a hung one would hold the connect until ``connect_timeout``), nothing here waits for
        a node that does not answer: the seeds are PINGed at once, the slot map is read from
        one that answered, and the default node (COMMAND, and commands without keys) is a
        master among them where there is one."""
        manager = cast(RedisCluster, client).nodes_manager
        answered = await self._answering(self._seeds)
        # Side connections without a route go to a seed that answers.
        self._seeds = [*answered, *(seed for seed in self._seeds if seed not in answered)]
        names = [f"{host}:{port}" for host, port in answered]
        for name in list(manager.startup_nodes):
            if name not in names:
                # Not asked for this slot map (redis-py picks a startup node at random);
                # once read, every node of the map is a startup node again.
                del manager.startup_nodes[name]
        if not manager.nodes_cache:
            # redis-py keeps the order of known nodes and takes the first master as its
            # default node: one that answered.
            for name in names:
                manager.nodes_cache[name] = manager.startup_nodes[name]
        await cast(RedisCluster, client).initialize()
        if prepare is not None:
            await self._prepare_without_silent(client, prepare, manager)

    async def _answering(
        self, seeds: list[tuple[str, int]], within: float | None = None
    ) -> list[tuple[str, int]]:
        """The seeds that answered a PING (all asked at once), in the order they answered:
        those that did by the time the first did, or with ``within`` those that did within
        that many seconds. The last error if none does. Else unbounded: the caller's."""
        answered: list[tuple[str, int]] = []
        error: BaseException | None = None
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        async with asyncio.TaskGroup() as group:
            probes = {group.create_task(self._ping(seed)): seed for seed in seeds}
            pending = set(probes)
            while pending and (not answered if deadline is None else loop.time() < deadline):
                done, pending = await asyncio.wait(
                    pending,
                    timeout=None if deadline is None else deadline - loop.time(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for probe in done:
                    if (exc := probe.result()) is None:
                        answered.append(probes[probe])
                    else:
                        error = exc
            for probe in pending:
                probe.cancel()
        if not answered:
            assert error is not None
            raise error
        return answered

    async def _ping(self, seed: tuple[str, int]) -> Exception | None:
        # Its failure is returned, not raised: it would end the other PINGs' task group.
        conn = self.new_connection("probe", f"{seed[0]}:{seed[1]}")
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
            await conn.send_command("PING")
            await conn.read_response()
        except Exception as exc:
            return exc
        finally:
            await disconnect_quietly(conn)
        return None

    async def _prepare_without_silent(
        self, client: aioredis.Redis, prepare: Prepare, manager: NodesManager
    ) -> None:
        """``prepare(client)`` (it loads the scripts on every master) with the masters that
        do not answer a PING within :data:`_MASTER_PING` left out of the client's node list
        meanwhile: redis-py would send them their share and wait for it (the client is not in
        use yet). A master left out loads a script on first use."""
        nodes = manager.nodes_cache
        masters = [node for node in nodes.values() if node.server_type == PRIMARY]
        pings = [(node.host, int(node.port)) for node in masters]
        answered = {f"{host}:{port}" for host, port in await self._answering(pings, _MASTER_PING)}
        away = {node.name: node for node in masters if node.name not in answered}
        for name in away:
            del nodes[name]
        try:
            await prepare(client)
        finally:
            nodes.update(away)  # back, and last: never the default node
        if away:
            _log.warning(
                "redis cluster %s: master(s) %s did not answer within %.1f s at connect; "
                "connected without them",
                self.describe(),
                ", ".join(away),
                _MASTER_PING,
            )

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
        # redis-py drops a node that left the slot map (a failover) and closes its
        # connections in tasks of its own, or once their command ends; one it never closes
        # would reach the GC open. Every connection registers itself while open, so
        # aclose() can close what redis-py left behind.
        tracked = _tracking(self._open_connections)
        manager = cluster.nodes_manager
        manager.connection_kwargs["connection_class"] = tracked
        for node in (*manager.startup_nodes.values(), *manager.nodes_cache.values()):
            node.connection_class = tracked
        # RedisCluster is not a Redis, but it has every method the scripts call
        # (execute_command, script_load), routed by the slot of the keys.
        return cast("aioredis.Redis", cluster)

    def _command_client(self, shared: aioredis.Redis) -> aioredis.Redis:
        # The cluster client routes each command to its master's pool.
        return shared

    async def aclose(self) -> None:
        """:meth:`NodeSource.aclose`, then wait (bounded) for the disconnects redis-py runs in
        tasks of its own: a master that left the slot map (a failover) is dropped with its
        idle connections closing in the background. Any connection still open after that
        (one redis-py dropped without closing) is closed here rather than left to the GC."""
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
        left = [conn.disconnect(nowait=True) for conn in list(self._open_connections)]
        if left:
            await asyncio.gather(*left, return_exceptions=True)

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
                    await self._read_slots(self.cluster.nodes_manager)
        finally:
            self._refreshed = loop.time()
            self._refreshing = None
            done.set_result(None)

    async def _read_slots(self, manager: NodesManager) -> None:
        # Every known node is a startup node, and redis-py asks them in random order: one
        # that hangs would hold the read until connect_timeout. Ask those that answer a PING
        # now (all PINGed at once); the others are startup nodes again once the map is read.
        nodes = manager.startup_nodes
        answered = await self._answering([(node.host, int(node.port)) for node in nodes.values()])
        names = {f"{host}:{port}" for host, port in answered}
        left = {name: node for name, node in nodes.items() if name not in names}
        for name in left:
            del nodes[name]
        try:
            await manager.initialize()
        except BaseException:
            for name, node in left.items():
                nodes.setdefault(name, node)
            raise

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


def _tracking(registry: set[Connection]) -> type[Connection]:
    """A ``Connection`` class whose instances are in ``registry`` while connected."""

    class TrackedConnection(Connection):
        async def _connect(self) -> None:
            await super()._connect()  # type: ignore[no-untyped-call]
            registry.add(self)

        async def disconnect(self, *args: Any, **kwargs: Any) -> None:
            try:
                await super().disconnect(*args, **kwargs)
            finally:
                if not self.is_connected:
                    registry.discard(self)

    return TrackedConnection


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
