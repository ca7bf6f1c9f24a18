"""aioredlock (on aioredis 1.x): ``lock()`` tries 3 times, 0.1-0.3 s apart, then raises.

A caller that must wait catches its ``LockError`` and calls again, as its README suggests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from aioredlock import Aioredlock, LockError  # type: ignore[import-untyped]  # untyped

from .base import AsyncAdapter

__all__ = ["AioredlockAdapter"]


class AioredlockAdapter(AsyncAdapter):
    """``await manager.lock(name, lock_timeout=ttl)``, retried on ``LockError``."""

    backend = "redis"
    _manager: Any = None

    async def open(self) -> None:
        # One master, or every master of a redlock:// endpoint.
        self._manager = Aioredlock([{"host": h, "port": p} for h, p in self.endpoint.nodes])

    async def close(self) -> None:
        if self._manager is not None:
            await self._manager.destroy()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        return self._hold(name, ttl)

    @asynccontextmanager
    async def _hold(self, name: str, ttl: float) -> AsyncIterator[object]:
        while True:
            try:
                lock = await self._manager.lock(name, lock_timeout=ttl)
            except LockError:
                continue
            break
        try:
            yield lock
        finally:
            await self._manager.unlock(lock)

    def server_key(self, name: str) -> str | None:
        return name
