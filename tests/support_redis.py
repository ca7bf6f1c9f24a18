"""The redis backend's probe: a plain redis-py client beside the library.

Imported only by the Redis test modules' fixtures (it imports the redis driver).
"""

from __future__ import annotations

import redis.asyncio as aioredis

import aiodlock

SIGNAL_TTL_MS = 5000  # aiodlock's BLPOP wake tokens live this long (restated: private)

__all__ = ["RedisProbe"]


class RedisProbe:
    """Breaks locks and lists leftovers with its own connection (never through aiodlock)."""

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
        keys = []
        async for key in self.raw.scan_iter(match=f"*{{{namespace}:*"):
            if key.endswith(b":fence"):
                continue
            if key.endswith(b"signal") and 0 < await self.raw.pttl(key) <= SIGNAL_TTL_MS:
                # An unconsumed BLPOP wake token: short-lived by design (it expires within
                # SIGNAL_TTL_MS). Rarely one is left after a storm of cancelled waiters: a
                # known race, tracked as an issue; bounded, so not an orphan.
                continue
            keys.append(bytes(key).decode())
        channels = await self.raw.pubsub_channels(f"*{{{namespace}:*")
        return keys + [f"channel {c!r}" for c in channels]

    async def aclose(self) -> None:
        await self.raw.aclose()


def _glob(text: str) -> str:
    """Escape glob metacharacters for SCAN MATCH."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
