"""Where the oversell demo keeps its stock: the data the lock protects, not aiodlock's.

One product's stock record: the stock, the sales made from it, the writes refused, and the
newest fencing token that wrote it. A write that carries an older token is refused: that check,
made by the data store rather than by the lock, is what makes a paused holder whose lease has
run out harmless.

* :class:`MemoryStock`: a Python object guarded by :class:`aiodlock.FencingGuard`, for
  ``memory://`` (one process).
* :class:`RedisStock`: Redis keys through redis-py, for ``redis://``, ``rediss://`` and
  ``unix://`` (shared by every process of the demo); the fenced write is the Lua
  compare-and-set in :data:`FENCED_WRITE`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiodlock

if TYPE_CHECKING:
    import redis.asyncio

__all__ = [
    "DATA_CONNECTIONS",
    "FENCED_WRITE",
    "MemoryStock",
    "RedisStock",
    "StockStore",
    "Totals",
    "data_url",
]

DATA_CONNECTIONS: Final = 32
"""Connections per process for the stock in Redis."""


@dataclass(frozen=True, slots=True)
class Totals:
    """The stock record after a run."""

    stock: int
    sold: int
    refused: int
    """Fenced writes refused because their token was older than the newest one written."""
    newest_token: int


class StockStore(Protocol):
    """The stock of one product, and the sales made from it."""

    async def reset(self, quantity: int) -> None:
        """Put ``quantity`` items in stock; forget sales, refusals and tokens."""
        ...

    async def read(self) -> int:
        """The stock now."""
        ...

    async def sell(self, remaining: int, *, token: int | None) -> bool:
        """Write ``remaining`` as the new stock and count one sale.

        With a fencing ``token``, only if it is not older than the newest token written so
        far; a refused write changes nothing and returns False.
        """
        ...

    async def totals(self) -> Totals:
        """Stock, sales, refused writes and the newest token, as stored."""
        ...

    async def aclose(self) -> None:
        """Drop connections (the data stays)."""
        ...


class MemoryStock:
    """The stock as a Python object, for ``memory://``: one process only."""

    def __init__(self) -> None:
        self._stock = 0
        self._sold = 0
        self._refused = 0
        self._guard = aiodlock.FencingGuard()

    async def reset(self, quantity: int) -> None:
        self._stock, self._sold, self._refused = quantity, 0, 0
        self._guard = aiodlock.FencingGuard()

    async def read(self) -> int:
        return self._stock

    async def sell(self, remaining: int, *, token: int | None) -> bool:
        if token is not None:
            try:
                self._guard.check(token)  # a newer holder has written: refuse
            except aiodlock.StaleTokenError:
                self._refused += 1
                return False
        self._stock = remaining
        self._sold += 1
        return True

    async def totals(self) -> Totals:
        return Totals(self._stock, self._sold, self._refused, self._guard.newest)

    async def aclose(self) -> None:
        pass


FENCED_WRITE: Final = """
-- The fenced write: the data store, not the lock, has the last word.
-- KEYS[1] stock, KEYS[2] newest fencing token written, KEYS[3] sales, KEYS[4] refused writes
-- ARGV[1] the new stock, ARGV[2] the writer's fencing token
-- A writer whose token is older than the newest one written here held the lock once but has
-- lost it since (it was paused while its lease ran out, and another buyer got the lock): its
-- write is refused. Otherwise the token is remembered with the data, atomically.
local newest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) < newest then
    redis.call('INCR', KEYS[4])
    return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[3])
return 1
"""


class RedisStock:
    """The stock in Redis keys, for ``redis://``: shared by every process of the demo.

    The keys are ``NAMESPACE:{run}:FIELD``. They share the hash tag ``{run}``, so the
    fenced-write script touches one slot (it would run on Redis Cluster too), and every run of
    the demo has keys of its own.
    """

    def __init__(self, url: str, run: str, *, namespace: str) -> None:
        try:
            import redis.asyncio
        except ImportError:  # pragma: no cover - the redis:// backend needs it anyway
            raise ImportError(
                "the demo keeps its stock in Redis with redis-py: pip install 'aiodlock[redis]'"
            ) from None
        # A bounded pool that makes commands wait for a free connection (redis-py's default
        # pool raises "Too many connections" instead when hundreds of buyers read at once).
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            data_url(url), max_connections=DATA_CONNECTIONS
        )
        self._redis: redis.asyncio.Redis = redis.asyncio.Redis.from_pool(pool)
        prefix = f"{namespace}:{{{run}}}"
        self._stock, self._newest, self._sold, self._refused = (
            f"{prefix}:{field}" for field in ("stock", "newest-token", "sold", "refused")
        )
        self._fenced_write = self._redis.register_script(FENCED_WRITE)

    @property
    def keys(self) -> list[str]:
        return [self._stock, self._newest, self._sold, self._refused]

    async def reset(self, quantity: int) -> None:
        await self._redis.mset(
            {self._stock: quantity, self._newest: 0, self._sold: 0, self._refused: 0}
        )

    async def read(self) -> int:
        return int(await self._redis.get(self._stock) or 0)

    async def sell(self, remaining: int, *, token: int | None) -> bool:
        if token is None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self._stock, remaining)
                pipe.incr(self._sold)
                await pipe.execute()
            return True
        written = await self._fenced_write(keys=self.keys, args=[remaining, token])
        return bool(written)

    async def totals(self) -> Totals:
        values = await self._redis.mget(self.keys)
        stock, newest, sold, refused = (int(v or 0) for v in values)
        return Totals(stock, sold, refused, newest)

    async def delete(self) -> None:
        """Remove this run's keys; best effort, so as not to hide why a run failed."""
        from redis.exceptions import RedisError

        with contextlib.suppress(RedisError, OSError):
            await self._redis.delete(*self.keys)

    async def aclose(self) -> None:
        await self._redis.aclose()


def data_url(url: str) -> str:
    """The lock URL as a redis-py URL: aiodlock's query options dropped, ``db`` kept."""
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "db"]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), parts.fragment))
