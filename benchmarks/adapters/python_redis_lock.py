"""python-redis-lock (blocking): SET NX EX, then BLPOP on a signal list until released."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import redis
import redis_lock  # type: ignore[import-untyped]  # ships no type information

from .base import POOL_SIZE, SyncAdapter

__all__ = ["PythonRedisLockAdapter"]


class PythonRedisLockAdapter(SyncAdapter):
    """``redis_lock.Lock(client, name, expire=ceil(ttl))``; waits in BLPOP on its own connection."""

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
        return self._hold(name, math.ceil(ttl))  # its expire is whole seconds

    @contextmanager
    def _hold(self, name: str, expire: int) -> Iterator[object]:
        lock = redis_lock.Lock(self._redis, name, expire=expire)
        lock.acquire(blocking=True)
        try:
            yield lock
        finally:
            lock.release()

    def server_key(self, name: str) -> str | None:
        return f"lock:{name}"
