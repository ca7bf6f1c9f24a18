"""redis-py's own lock, ``redis.asyncio.lock.Lock``, with its defaults (``sleep=0.1`` polling)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import redis.asyncio as aioredis

from .base import POOL_SIZE, AsyncAdapter

__all__ = ["RedisPyLockAdapter"]


class RedisPyLockAdapter(AsyncAdapter):
    """``async with redis.lock(name, timeout=ttl)``: SET NX PX, then sleep 0.1 s and retry."""

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
        # A new Lock object per acquisition: its token lives in a threading.local, shared by
        # every task of the thread if the object were shared.
        return self._redis.lock(name, timeout=ttl)

    def server_key(self, name: str) -> str | None:
        return name
