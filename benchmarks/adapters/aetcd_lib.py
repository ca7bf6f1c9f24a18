"""aetcd's own ``Lock`` (asyncio): one key, compare-and-set, a new lease per attempt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from .base import AsyncAdapter, Endpoint

__all__ = ["AetcdLockAdapter"]

ROOT = "/bench-aetcd"


class AetcdLockAdapter(AsyncAdapter):
    """``lock = client.lock(key, ttl); await lock.acquire(); ...; await lock.release()``.

    A new lock object per acquisition, as aetcd's docs show; its lease is not renewed (the
    ttl must outlast the hold).
    """

    backend = "etcd"

    def __init__(self, endpoint: Endpoint, **_: object) -> None:
        super().__init__(endpoint)
        self._client: Any = None

    async def open(self) -> None:
        import aetcd

        self._client = aetcd.Client(host=self.endpoint.host, port=self.endpoint.port)  # one member
        await self._client.connect()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name, max(1, round(ttl)))

    def crash_lease(self, *, ttl: float, session_timeout: float) -> float:
        return float(max(1, round(ttl)))  # the lease of the lock itself

    @asynccontextmanager
    async def _hold(self, name: str, ttl: int) -> AsyncIterator[object]:
        lock = self._client.lock(f"{ROOT}/{name}".encode(), ttl=ttl)
        await lock.acquire()
        try:
            yield lock
        finally:
            await lock.release()
