"""aiozk's own ``recipes.Lock`` (asyncio)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from aiozk import ZKClient

from .base import AsyncAdapter, Endpoint

__all__ = ["AiozkLockAdapter"]

ROOT = "/bench-aiozk"


class AiozkLockAdapter(AsyncAdapter):
    """``lock = client.recipes.Lock(path); await lock.acquire(); ...; await lock.release()``.

    A new recipe object per acquisition: aiozk refuses concurrent acquires on one object.
    """

    backend = "zookeeper"

    def __init__(self, endpoint: Endpoint, *, session_timeout: float = 10.0) -> None:
        super().__init__(endpoint)
        self._session_timeout = session_timeout
        self._client: Any = None

    async def open(self) -> None:
        client = ZKClient(self.endpoint.hosts, session_timeout=self._session_timeout)
        await client.start()
        self._client = client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name)

    @asynccontextmanager
    async def _hold(self, name: str) -> AsyncIterator[object]:
        lock = self._client.recipes.Lock(f"{ROOT}/{name}")
        await lock.acquire()
        try:
            yield lock
        finally:
            await lock.release()
