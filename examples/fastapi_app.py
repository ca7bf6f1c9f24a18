"""A FastAPI app that serialises updates to one order with a distributed lock.

``POST /orders/{order_id}/items`` adds an item to an order: it reads the order, does some
slow work (pricing, stock checks...), and writes the order back. Two requests for the same
order at the same moment — from two browser tabs, two uvicorn workers, two pods — would
otherwise both read the same order and one item would be lost. The handler does::

    async with request.app.state.locks.lock(f"order:{order_id}", timeout=5) as lease:
        ...read, work, write with lease.fencing_token...

The lock client and the order store are opened in the app's ``lifespan`` and closed when the
app stops. The write passes the lease's fencing token to the store, which refuses a token older
than the newest one it has stored, so a request that stalled past its lease cannot overwrite a
newer one.

Where the orders live follows ``AIODLOCK_URL``:

* ``redis://HOST:PORT/DB`` (or ``rediss://``): the locks *and* the orders are in Redis, one
  hash per order, written by a Lua compare-and-set on the fencing token (the pattern of
  ``FENCED_WRITE`` in ``aiodlock/cli/_stock.py``). Every worker process sees the same orders:
  serve it with ``uvicorn examples.fastapi_app:app --workers 4``.
* ``memory://`` (the default): a dict in the process, locks in the process. **One process
  only** — under ``--workers 2`` each worker would have its own orders and its own locks.

Errors become answers, with one log line each instead of a traceback: the lock or data
service down (``aiodlock.BackendError``, a Redis error) is ``503`` with ``Retry-After``, so a
client or load balancer retries; a lease lost mid-request is ``503`` too; an order still busy
after the lock's ``timeout`` or a stale fencing token is ``409`` (retry later: that order is
contended, the service is fine).

Serve it (``pip install uvicorn``)::

    AIODLOCK_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_app:app --workers 2
    curl -X POST localhost:8000/orders/42/items

Or run the file to fire 50 concurrent requests at one order in-process, through httpx, and
check that all 50 items landed (exit 0) or not (exit 1)::

    python examples/fastapi_app.py
"""

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import aiodlock

URL = os.environ.get("AIODLOCK_URL", "memory://")
RETRY_AFTER = "1"  # seconds; a short outage (a Redis restart) is over by then, or soon
logger = logging.getLogger("orders")


@dataclass(frozen=True)
class Order:
    items: int = 0
    fencing_token: int = 0  # the newest fencing token that wrote this order


class StoreUnavailable(Exception):
    """The order store could not be reached (the client should retry)."""


class OrderStore(Protocol):
    async def load(self, order_id: int) -> Order: ...

    async def save(self, order_id: int, order: Order) -> None:
        """Write the order, unless a newer lock holder has written it already
        (``aiodlock.StaleTokenError``). In SQL: ``UPDATE orders SET items = :items,
        fencing_token = :token WHERE id = :id AND fencing_token <= :token``."""
        ...

    async def aclose(self) -> None: ...


class MemoryOrders:
    """Orders in a dict: for ``memory://``, one process only."""

    def __init__(self) -> None:
        self._rows: dict[int, Order] = {}

    async def load(self, order_id: int) -> Order:
        await asyncio.sleep(0)  # a round trip to the database
        return self._rows.get(order_id, Order())

    async def save(self, order_id: int, order: Order) -> None:
        await asyncio.sleep(0)
        stored = self._rows.get(order_id, Order())
        if order.fencing_token < stored.fencing_token:
            raise _stale(order_id, order.fencing_token, stored.fencing_token)
        self._rows[order_id] = order

    async def aclose(self) -> None:
        pass


# KEYS[1] the order's hash; ARGV[1] items, ARGV[2] the writer's fencing token.
# -> -1 written | the newer token stored (the write was refused: a newer holder wrote).
FENCED_WRITE = """
local stored = tonumber(redis.call('HGET', KEYS[1], 'fencing_token') or '0')
if tonumber(ARGV[2]) < stored then return stored end
redis.call('HSET', KEYS[1], 'items', ARGV[1], 'fencing_token', ARGV[2])
return -1
"""


class RedisOrders:
    """Orders in Redis hashes ``shop:order:ID``, shared by every worker process."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(url.partition("?")[0])  # drop aiodlock's options
        self._write = self._redis.register_script(FENCED_WRITE)

    async def load(self, order_id: int) -> Order:
        async with self._errors():
            row = await self._redis.hgetall(f"shop:order:{order_id}")
        return Order(int(row.get(b"items", 0)), int(row.get(b"fencing_token", 0)))

    async def save(self, order_id: int, order: Order) -> None:
        async with self._errors():
            keys, args = [f"shop:order:{order_id}"], [order.items, order.fencing_token]
            stored = int(await self._write(keys=keys, args=args))
        if stored >= 0:
            raise _stale(order_id, order.fencing_token, stored)

    async def aclose(self) -> None:
        await self._redis.aclose()

    @asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        from redis.exceptions import RedisError

        try:
            yield
        except RedisError as exc:
            raise StoreUnavailable(f"order store: {exc}") from exc


def _stale(order_id: int, token: int, stored: int) -> aiodlock.StaleTokenError:
    return aiodlock.StaleTokenError(f"order {order_id}: token {token} < stored {stored}")


def open_orders(url: str) -> OrderStore:
    """Orders where every worker sees them: Redis for a Redis URL, else this process."""
    return RedisOrders(url) if url.startswith(("redis://", "rediss://")) else MemoryOrders()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    orders = open_orders(URL)
    try:
        async with aiodlock.connect(URL, namespace="shop") as locks:
            app.state.locks, app.state.orders = locks, orders
            yield
    finally:
        await orders.aclose()


app = FastAPI(title="aiodlock example: orders", lifespan=lifespan)

# What each failure means to the client: (status, Retry-After or None). Most specific first.
ANSWERS: dict[type[Exception], tuple[int, str | None]] = {
    aiodlock.LockTimeoutError: (409, None),  # this order is busy: the service is fine
    aiodlock.StaleTokenError: (409, None),  # a newer request wrote the order first
    aiodlock.LockLostError: (503, RETRY_AFTER),  # the lease ran out mid-request
    aiodlock.BackendError: (503, RETRY_AFTER),  # the lock service is down
    StoreUnavailable: (503, RETRY_AFTER),  # the order store is down
}


async def answer_error(request: Request, exc: Exception) -> JSONResponse:
    """One log line and a clear status, instead of a traceback and a 500."""
    status, retry_after = next(a for t, a in ANSWERS.items() if isinstance(exc, t))
    logger.warning("%s %s -> %d: %s", request.method, request.url.path, status, exc)
    headers = {"Retry-After": retry_after} if retry_after else None
    return JSONResponse({"detail": str(exc)}, status, headers=headers)


for error in ANSWERS:
    app.add_exception_handler(error, answer_error)


@app.post("/orders/{order_id}/items")
async def add_item(order_id: int, request: Request) -> dict[str, int]:
    orders: OrderStore = request.app.state.orders
    async with request.app.state.locks.lock(f"order:{order_id}", timeout=5) as lease:
        order = await orders.load(order_id)
        await asyncio.sleep(0.002)  # price the item, check the stock...
        order = Order(order.items + 1, lease.fencing_token)
        await orders.save(order_id, order)
    return {"order_id": order_id, "items": order.items, "fencing_token": order.fencing_token}


@app.get("/orders/{order_id}")
async def get_order(order_id: int, request: Request) -> dict[str, int]:
    order = await request.app.state.orders.load(order_id)
    return {
        "order_id": order_id,
        "items": order.items,
        "fencing_token": order.fencing_token,
        "worker": os.getpid(),  # which process answered: under --workers N, any of them
    }


async def self_check(requests: int = 50) -> int:
    """Fire ``requests`` concurrent POSTs at one order; 0 if every item landed, else 1."""
    import httpx  # only the self-check needs it

    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://shop") as client,
    ):
        before = (await client.get("/orders/42")).json()["items"]  # Redis keeps earlier runs'
        answers = await asyncio.gather(*(client.post("/orders/42/items") for _ in range(requests)))
        statuses = sorted({answer.status_code for answer in answers})
        tokens = {answer.json()["fencing_token"] for answer in answers}
        order = (await client.get("/orders/42")).json()
    added = order["items"] - before
    print(f"{requests} concurrent POST /orders/42/items -> statuses {statuses}")
    print(f"order 42 got {added} items (expected {requests})")
    print(f"{len(tokens)} distinct fencing tokens, newest {order['fencing_token']}")
    ok = statuses == [200] and added == requests and len(tokens) == requests
    print("OK" if ok else "FAILED: an update was lost")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(self_check()))
