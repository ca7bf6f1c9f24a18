"""Looking behind the library's back: each backend's probe breaks locks and finds leftovers.

A probe talks to the service with its own plain client (never through aiodlock), so a test
can destroy a lock under its holder the way an operator, an expiry or a failover would, and
check that nothing — key, channel, znode, connection — was left behind.
"""

from __future__ import annotations

from typing import Protocol

import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends import memory


class Probe(Protocol):
    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        """Destroy every holder's state of ``name``; fail if there was nothing to destroy."""
        ...

    async def leftovers(self, namespace: str) -> list[str]:
        """Everything ``namespace`` still has on the service, fencing counters excepted."""
        ...

    async def aclose(self) -> None: ...


class MemoryProbe:
    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        backend = client._backend
        assert isinstance(backend, memory.MemoryBackend)
        assert backend.break_lock(namespace, name) > 0, "nothing to break"

    async def leftovers(self, namespace: str) -> list[str]:
        return [
            repr(key)
            for store in memory._STORES.values()
            for key in store.entries
            if key[0] == namespace
        ]

    async def aclose(self) -> None:
        pass


class RedisProbe:
    def __init__(self, url: str) -> None:
        self.raw = aioredis.Redis.from_url(url)

    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        keys = [
            k
            async for k in self.raw.scan_iter(match=f"*{{{namespace}:{_glob(name)}}}*")
            if not k.endswith(b":fence")
        ]
        assert keys, "nothing to break"
        await self.raw.delete(*keys)

    async def leftovers(self, namespace: str) -> list[str]:
        keys = [
            bytes(k).decode()
            async for k in self.raw.scan_iter(match=f"*{{{namespace}:*")
            if not k.endswith(b":fence")
        ]
        channels = await self.raw.pubsub_channels(f"*{{{namespace}:*")
        return keys + [f"channel {c!r}" for c in channels]

    async def aclose(self) -> None:
        await self.raw.aclose()


def _glob(text: str) -> str:
    """Escape glob metacharacters for SCAN MATCH."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
