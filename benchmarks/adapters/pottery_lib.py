"""pottery's ``Redlock`` (blocking) and ``AIORedlock`` (asyncio), on one master (``redis``) or
on every master of a ``redlock://`` endpoint."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager

import redis
import redis.asyncio as aioredis
from pottery import AIORedlock, Redlock

from .base import POOL_SIZE, AsyncAdapter, SyncAdapter

__all__ = ["PotteryAsyncAdapter", "PotterySyncAdapter"]


class PotterySyncAdapter(SyncAdapter):
    """``with Redlock(key=name, masters={client, ...}, auto_release_time=ttl)``."""

    backend = "redis"
    _masters: tuple[redis.Redis, ...] = ()

    def open(self) -> None:
        self._masters = tuple(
            redis.Redis(host=host, port=port, max_connections=POOL_SIZE)
            for host, port in self.endpoint.nodes
        )

    def close(self) -> None:
        for master in self._masters:
            master.close()

    def hold(self, name: str, *, ttl: float) -> AbstractContextManager[object]:
        assert self._masters, "not open"
        return Redlock(key=name, masters=set(self._masters), auto_release_time=ttl)

    def server_key(self, name: str) -> str | None:
        return f"redlock:{name}"


class PotteryAsyncAdapter(AsyncAdapter):
    """``async with AIORedlock(key=name, masters={client, ...}, auto_release_time=ttl)``."""

    backend = "redis"
    _masters: tuple[aioredis.Redis, ...] = ()

    async def open(self) -> None:
        self._masters = tuple(
            aioredis.Redis(host=host, port=port, max_connections=POOL_SIZE)
            for host, port in self.endpoint.nodes
        )

    async def close(self) -> None:
        for master in self._masters:
            await master.aclose()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        assert self._masters, "not open"
        return AIORedlock(key=name, masters=set(self._masters), auto_release_time=ttl)

    def server_key(self, name: str) -> str | None:
        return f"redlock:{name}"
