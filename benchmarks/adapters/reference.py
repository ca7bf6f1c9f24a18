"""Ceilings: what no lock can beat on this machine, reported beside the libraries so that the
contended efficiencies can be read against what is reachable here.

- ``asyncio.Lock`` (no server, no network): with a 1 ms critical section the ideal is 1000
  grants/s; what ``asyncio.sleep(0.001)`` and the loop cost keeps even this below that.
- ``asyncio.Lock`` plus one fencing write per grant, on each server (:mod:`.fenced`): a lock
  that gives every grant a fencing token must write to the server once per grant, so this is
  the in-process ceiling of any such lock.
- A baton passed round a ring of processes by ``PUBLISH`` (each member waits on its own
  channel, holds the baton for the section, publishes it to the next): one message per
  handover and no lock state at all, so this is the cross-process ceiling of a fair lock that
  hands over with one message. Members number themselves (``INCR`` of a counter: consecutive
  numbers modulo the ring's size, so one run's members are each a different place) and member
  0 starts with the baton. It is only measured as processes: each member is one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from .base import AsyncAdapter, Endpoint
from .raw import execute, redis_client

__all__ = ["LocalLockAdapter", "PubSubBaton"]


class LocalLockAdapter(AsyncAdapter):
    backend = "none"

    async def open(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    async def close(self) -> None:
        self._locks.clear()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._locks.setdefault(name, asyncio.Lock())


class PubSubBaton(AsyncAdapter):
    backend = "redis"

    def __init__(self, endpoint: Endpoint, *, members: str = "10", **_: object) -> None:
        super().__init__(endpoint)
        self._members = int(members)
        self._redis: Any = None
        self._listener: Any = None
        self._place = 0
        self._has_baton = False

    async def open(self) -> None:
        self._redis = await redis_client(self.endpoint).initialize()  # its connection, now
        number = await execute(self._redis, "INCR", "baton:members")
        self._place = (number - 1) % self._members
        self._has_baton = self._place == 0
        # A connection of its own, read directly (as aiodlock's pub/sub hub reads its own).
        self._listener = await redis_client(self.endpoint).initialize()
        await execute(self._listener, "SUBSCRIBE", self._channel(self._place))

    async def close(self) -> None:
        for client in (self._listener, self._redis):
            if client is not None:
                await client.aclose()

    def _channel(self, place: int) -> str:
        return f"baton:{place}"

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold()

    @asynccontextmanager
    async def _hold(self) -> AsyncIterator[object]:
        if not self._has_baton:
            await self._listener.connection.read_response()  # the only message: the baton
            self._has_baton = True
        try:
            yield self._place
        finally:
            self._has_baton = False
            following = self._channel((self._place + 1) % self._members)
            await execute(self._redis, "PUBLISH", following, "baton")
