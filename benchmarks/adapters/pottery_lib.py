"""pottery's ``Redlock`` (blocking) and ``AIORedlock`` (asyncio), each with a single master."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager

import redis
import redis.asyncio as aioredis
from pottery import AIORedlock, Redlock

from .base import POOL_SIZE, AsyncAdapter, SyncAdapter

__all__ = ["PotteryAsyncAdapter", "PotterySyncAdapter"]


class PotterySyncAdapter(SyncAdapter):
    """``with Redlock(key=name, masters={client}, auto_release_time=ttl)``."""

    backend = "redis"
    _redis: redis.Redis | None = None

    def open(self) -> None:
        self._redis = redis.Redis(
            host=self.endpoint.host, port=self.endpoint.port, max_connections=POOL_SIZE
        )

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()

    def hold(self, name: str, *, ttl: float) -> AbstractContextManager[object]:
        assert self._redis is not None, "not open"
        return Redlock(key=name, masters={self._redis}, auto_release_time=ttl)

    def server_key(self, name: str) -> str | None:
        return f"redlock:{name}"


class PotteryAsyncAdapter(AsyncAdapter):
    """``async with AIORedlock(key=name, masters={client}, auto_release_time=ttl)``."""

    backend = "redis"
    _redis: aioredis.Redis | None = None

    async def open(self) -> None:
        self._redis = aioredis.Redis(
            host=self.endpoint.host, port=self.endpoint.port, max_connections=POOL_SIZE
        )

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        assert self._redis is not None, "not open"
        return AIORedlock(key=name, masters={self._redis}, auto_release_time=ttl)

    def server_key(self, name: str) -> str | None:
        return f"redlock:{name}"
