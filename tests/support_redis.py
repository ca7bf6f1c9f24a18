"""The redis backend's probe: a plain redis-py client beside the library.

Imported only by the Redis test modules' fixtures (it imports the redis driver).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

import aiodlock

SIGNAL_TTL_MS = 5000  # aiodlock's BLPOP wake tokens live this long (restated: private)
COURTESY_MS = 30  # and a mutex's courtesy after a release to waiting others
RUN_MS = 10  # and a client's run of grants while others wait

__all__ = ["RedisClusterProbe", "RedisProbe"]


class RedisProbe:
    """Breaks locks and lists leftovers with its own connection (never through aiodlock)."""

    def __init__(self, url: str) -> None:
        self.raw: Any = aioredis.Redis.from_url(url)

    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        keys = [
            k
            async for k in self.raw.scan_iter(match=f"*{{{namespace}:{_glob(name)}}}*", count=1000)
            if not k.endswith(b":fence")
        ]
        assert keys, "nothing to break"
        await self.raw.delete(*keys)

    async def leftovers(self, namespace: str) -> list[str]:
        keys = []
        async for key in self.raw.scan_iter(match=f"*{{{namespace}:*", count=1000):
            if key.endswith(b":fence"):
                continue
            pttl = await self.raw.pttl(key)
            if pttl == -2:
                continue  # expired since SCAN listed it
            # PTTL is 0, not -2, in a key's last millisecond: Redis expires it only once the
            # clock is past its deadline.
            if key.endswith(b"signal") and 0 <= pttl <= SIGNAL_TTL_MS:
                # An unconsumed BLPOP wake token: short-lived by design (it expires within
                # SIGNAL_TTL_MS). Rarely one is left after a storm of cancelled waiters: a
                # known race, tracked as an issue; bounded, so not an orphan.
                continue
            if key.endswith(b":yield") and 0 <= pttl <= COURTESY_MS:
                continue  # a releaser's courtesy to other clients: expires within 30 ms
            if key.endswith(b":run") and 0 <= pttl <= RUN_MS:
                continue  # a client's run of grants while others wait: expires within 10 ms
            keys.append(bytes(key).decode())
        channels = await self.channels(f"*{{{namespace}:*")
        return keys + [f"channel {c!r}" for c in channels]

    async def channels(self, pattern: str) -> list[bytes]:
        """Channels with a subscriber, matching ``pattern``."""
        return list(await self.raw.pubsub_channels(pattern))

    async def aclose(self) -> None:
        await self.raw.aclose()


def _glob(text: str) -> str:
    """Escape glob metacharacters for SCAN MATCH."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


class RedisClusterProbe(RedisProbe):
    """:class:`RedisProbe` on a Redis Cluster: keys on every master (SCAN on each, as
    ``RedisCluster.scan_iter`` does), plain and sharded channels on every node."""

    def __init__(self, seed: str) -> None:
        self.raw = aioredis.RedisCluster.from_url(seed)

    async def channels(self, pattern: str) -> list[bytes]:
        found: list[bytes] = []
        for node in self.raw.get_nodes():
            for command in ("CHANNELS", "SHARDCHANNELS"):
                found += await self.raw.execute_command(
                    "PUBSUB", command, pattern, target_nodes=node
                )
        return found
