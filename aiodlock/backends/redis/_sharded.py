"""Sharded pub/sub wakeups for Redis Cluster: :class:`ShardedHub` and its
:class:`ShardedWaiter`.

One :class:`~._pubsub.PubSubHub` in sharded mode per master waited on (``SSUBSCRIBE``): one
connection per master. When a slot moves, the hub evicts the channel and its waiters subscribe
again where the slot is served now, then re-check. docs/redis.md ("Sharded pub/sub") explains.

Example::

    hub = ShardedHub(cluster_source)
    hub.start(tasks)
    async with hub.waiter(keys.signal, owner) as waiter:
        await waiter.wait(timeout=remaining_lease)
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Final

from .. import BackendError
from ._pubsub import ChannelMoved, PubSubHub, PubSubWaiter

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from .. import Tasks
    from ._cluster import ClusterSource

__all__ = ["AnyMaster", "ShardedHub", "ShardedWaiter"]

_JOIN_ATTEMPTS: Final = 3
"""How often entering a waiter looks for its channel's master before giving up (the slot map
can lag behind a move by a moment)."""
_RETRY_PAUSE: Final = 0.1
"""A waiter whose master cannot be reached pauses this long before its caller re-checks."""


class _Master:
    """The side connections of one master, for its hub (:class:`~._pubsub.SideConnections`)."""

    __slots__ = ("_route", "_source")

    def __init__(self, source: ClusterSource, route: str) -> None:
        self._source = source
        self._route = route

    @property
    def connect_timeout(self) -> float:
        return self._source.connect_timeout

    @property
    def request_timeout(self) -> float:
        return self._source.request_timeout

    def new_connection(self, purpose: str) -> AbstractConnection:
        return self._source.new_connection(purpose, self._route)

    def describe(self) -> str:
        return f"{self._source.describe()} (master {self._route})"


class AnyMaster(_Master):
    """Side connections to whichever master serves ``key``'s slot at each connect: for a
    plain (not sharded) subscription, which a cluster delivers on every node, so any master
    will do, and after a failover the next connect finds one that is up. ``purpose`` names
    the connections (``aiodlock:<purpose>`` in ``CLIENT LIST``)."""

    __slots__ = ("_key", "_purpose")

    def __init__(self, source: ClusterSource, key: bytes, purpose: str) -> None:
        super().__init__(source, "")
        self._key = key
        self._purpose = purpose

    def new_connection(self, purpose: str) -> AbstractConnection:
        try:
            route = self._source.route(self._key)
        except BackendError:
            route = ""  # no slot map yet: the first seed
        return self._source.new_connection(self._purpose, route)

    def describe(self) -> str:
        return f"{self._source.describe()} (any master)"


class ShardedWaiter:
    """One waiting acquisition on a sharded channel; follows the channel's slot (see module)."""

    __slots__ = ("_channel", "_hub", "_inner", "_owner")

    def __init__(self, hub: ShardedHub, channel: bytes, owner: str) -> None:
        self._hub = hub
        self._channel = channel
        self._owner = owner
        self._inner: PubSubWaiter | None = None

    async def __aenter__(self) -> ShardedWaiter:
        for attempt in range(_JOIN_ATTEMPTS):
            try:
                await self._join()
            except ChannelMoved:
                if attempt == _JOIN_ATTEMPTS - 1:
                    raise
                await self._hub.source.refresh()
            else:
                return self
        raise AssertionError("unreachable")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            await inner.__aexit__(exc_type, exc, tb)

    async def wait(self, timeout: float | None) -> None:
        """Return when woken (or a wakeup was banked), or after ``timeout`` seconds; at once
        (after subscribing where the slot is now) if the channel moved."""
        hub = self._hub
        inner = self._inner
        if inner is not None and inner.active:
            await inner.wait(timeout)
            if hub.closed or inner.active:  # woken, or timed out, on its channel
                return
        if hub.closed:
            return
        # Evicted: the slot is served elsewhere now, or its master is gone. The old waiter is
        # off its channel already; subscribe where the slot is, then let the caller re-check.
        self._inner = None
        try:
            await hub.source.refresh()
            await self._join()
        except BackendError:
            # No master to subscribe on yet (failover under way): pause, so that a caller
            # whose re-checks are answered keeps no connection busy in a tight loop.
            pause = _RETRY_PAUSE if timeout is None else min(timeout, _RETRY_PAUSE)
            if pause > 0:
                await asyncio.sleep(pause)

    async def _join(self) -> None:
        inner = self._hub.hub_for(self._channel).waiter(self._channel, self._owner)
        await inner.__aenter__()
        self._inner = inner


class ShardedHub:
    """Sharded pub/sub over one :class:`~._pubsub.PubSubHub` per master (see module)."""

    def __init__(
        self,
        source: ClusterSource,
        *,
        unclaimed: Callable[[bytes], None] | None = None,
        handed: Callable[[bytes, int], None] | None = None,
    ) -> None:
        self.source = source
        self._unclaimed = unclaimed  # see PubSubHub
        self._handed = handed
        self._where = source.describe()
        self._hubs: dict[str, PubSubHub] = {}
        # Subscription numbers unique across the masters' hubs (see PubSubHub.subscription).
        self._ids = itertools.count(1)
        self._tasks: Tasks | None = None
        self.closed = False

    def start(self, tasks: Tasks) -> None:
        """Masters' hubs run in tasks of ``tasks`` (the backend's share), as they come."""
        self._tasks = tasks

    def close(self) -> None:
        """Stop every master's hub and release everyone waiting; synchronous, idempotent."""
        self.closed = True
        for hub in self._hubs.values():
            hub.close()

    async def settle(self) -> None:
        """See :meth:`PubSubHub.settle`, on every master's hub."""
        for hub in list(self._hubs.values()):
            await hub.settle()

    def hub_for(self, channel: bytes) -> PubSubHub:
        """The hub of the master that serves ``channel``'s slot (made on first use)."""
        if self.closed or self._tasks is None:
            raise BackendError(f"the redis backend for {self._where} is closed")
        route = self.source.route(channel)
        hub = self._hubs.get(route)
        if hub is None:
            hub = PubSubHub(
                _Master(self.source, route),
                sharded=True,
                ids=self._ids,
                unclaimed=self._unclaimed,
                handed=self._handed,
            )
            hub.start(self._tasks)
            self._hubs[route] = hub
        return hub

    def waiter(self, channel: bytes, owner: str) -> ShardedWaiter:
        """A waiter on ``channel`` for the acquisition of ``owner`` (not entered yet)."""
        return ShardedWaiter(self, channel, owner)

    def subscription(self, channel: bytes) -> int:
        """See :meth:`PubSubHub.subscription` (numbers are unique across masters)."""
        hub = self._known(channel)
        return 0 if hub is None else hub.subscription(channel)

    def waiting(self, channel: bytes) -> int:
        """See :meth:`PubSubHub.waiting`."""
        hub = self._known(channel)
        return 0 if hub is None else hub.waiting(channel)

    def subscribed(self, channel: bytes) -> bool:
        """See :meth:`PubSubHub.subscribed` (SPUBLISH counts the subscribers of one shard:
        the hub of the channel's master)."""
        hub = self._known(channel)
        return hub is not None and hub.subscribed(channel)

    def expect(self, channel: bytes, owner: str) -> None:
        """See :meth:`PubSubHub.expect`."""
        hub = self._known(channel)
        if hub is not None:
            hub.expect(channel, owner)

    def forget(self, channel: bytes, owner: str) -> bool:
        """See :meth:`PubSubHub.forget` (on every master: the channel may have moved)."""
        kept = False
        for hub in self._hubs.values():
            kept = hub.forget(channel, owner) or kept
        return kept

    def next_waiter(self, channel: bytes) -> str | None:
        """See :meth:`PubSubHub.next_waiter`."""
        hub = self._known(channel)
        return None if hub is None else hub.next_waiter(channel)

    def wake(self, channel: bytes, owner: str) -> None:
        """See :meth:`PubSubHub.wake`."""
        hub = self._known(channel)
        if hub is not None:
            hub.wake(channel, owner)

    def statistics(self) -> dict[str, int]:
        """The masters' hubs' statistics, summed; ``pubsub_masters``: how many hubs."""
        total = {"pubsub_connections": 0, "subscribed_channels": 0, "waiters": 0}
        total["pubsub_connects"] = 0
        for hub in self._hubs.values():
            for key, value in hub.statistics().items():
                total[key] = total.get(key, 0) + value
        total["pubsub_masters"] = len(self._hubs)
        return total

    def _known(self, channel: bytes) -> PubSubHub | None:
        try:
            route = self.source.route(channel)
        except BackendError:
            return None
        return self._hubs.get(route)
