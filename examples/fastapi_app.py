"""A FastAPI app that serialises updates to one order with a distributed lock.

``POST /orders/{order_id}/items`` adds an item to an order: it reads the order, does some
slow work (pricing, stock checks...), and writes the order back. Two requests for the same
order at the same moment — from two browser tabs, two uvicorn workers, two pods — would
otherwise both read the same order and one item would be lost. The handler does::

    async with request.app.state.locks.lock(f"order:{order_id}", timeout=5) as lease:
        ...read, work, write with lease.fencing_token...

The lock client is opened in the app's ``lifespan`` and closed when the app stops. The write
passes the lease's fencing token to the table, which refuses a token older than the newest one
it has stored (a database does it in the UPDATE's WHERE clause), so a request that stalled
past its lease cannot overwrite a newer one. ``AIODLOCK_URL`` selects the backend (default
``memory://``; use ``redis://HOST:PORT/DB`` when several worker processes serve the app).

Serve it (``pip install uvicorn``)::

    uvicorn examples.fastapi_app:app
    curl -X POST localhost:8000/orders/42/items

Or run the file to fire 50 concurrent requests at one order in-process, through httpx, and
check that all 50 items landed (exit 0) or not (exit 1)::

    python examples/fastapi_app.py

The "database" is a dict so that the example is self-contained; with several processes it
would be your real database, and the lock is what makes the read-modify-write safe.
"""

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from fastapi import FastAPI, HTTPException, Request

import aiodlock

URL = os.environ.get("AIODLOCK_URL", "memory://")


@dataclass(frozen=True)
class Order:
    items: int = 0
    fencing_token: int = 0  # the newest fencing token that wrote this row


class OrderTable:
    """Stands in for a database table (with the same race a real one has)."""

    def __init__(self) -> None:
        self._rows: dict[int, Order] = {}

    async def load(self, order_id: int) -> Order:
        await asyncio.sleep(0)  # a round trip to the database
        return self._rows.get(order_id, Order())

    async def save(self, order_id: int, order: Order, *, fencing_token: int) -> None:
        """Write the order, unless a newer lock holder has written it already.

        In SQL: ``UPDATE orders SET items = :items, fencing_token = :token
        WHERE id = :id AND fencing_token <= :token`` — and 0 rows updated means stale.
        """
        await asyncio.sleep(0)
        stored = self._rows.get(order_id, Order())
        if fencing_token < stored.fencing_token:
            raise aiodlock.StaleTokenError(
                f"order {order_id}: token {fencing_token} < stored {stored.fencing_token}"
            )
        self._rows[order_id] = replace(order, fencing_token=fencing_token)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with aiodlock.connect(URL, namespace="shop") as locks:
        app.state.locks = locks
        app.state.orders = OrderTable()
        yield


app = FastAPI(title="aiodlock example: orders", lifespan=lifespan)


@app.post("/orders/{order_id}/items")
async def add_item(order_id: int, request: Request) -> dict[str, int]:
    orders: OrderTable = request.app.state.orders
    try:
        async with request.app.state.locks.lock(f"order:{order_id}", timeout=5) as lease:
            order = await orders.load(order_id)
            await asyncio.sleep(0.002)  # price the item, check the stock...
            order = replace(order, items=order.items + 1)
            await orders.save(order_id, order, fencing_token=lease.fencing_token)
    except aiodlock.LockTimeoutError:
        raise HTTPException(503, f"order {order_id} is busy; try again") from None
    except aiodlock.LockLostError:
        raise HTTPException(503, f"lost the lock on order {order_id}; try again") from None
    except aiodlock.StaleTokenError as exc:
        raise HTTPException(409, str(exc)) from None
    return {"order_id": order_id, "items": order.items, "fencing_token": lease.fencing_token}


@app.get("/orders/{order_id}")
async def get_order(order_id: int, request: Request) -> dict[str, int]:
    orders: OrderTable = request.app.state.orders
    order = await orders.load(order_id)
    return {"order_id": order_id, "items": order.items, "fencing_token": order.fencing_token}


async def self_check(requests: int = 50) -> int:
    """Fire ``requests`` concurrent POSTs at one order; 0 if every item landed, else 1."""
    import httpx  # only the self-check needs it

    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://shop") as client,
    ):
        answers = await asyncio.gather(*(client.post("/orders/42/items") for _ in range(requests)))
        statuses = sorted({answer.status_code for answer in answers})
        tokens = {answer.json()["fencing_token"] for answer in answers}
        order = (await client.get("/orders/42")).json()
    print(f"{requests} concurrent POST /orders/42/items -> statuses {statuses}")
    print(f"order 42 has {order['items']} items (expected {requests})")
    print(f"{len(tokens)} distinct fencing tokens, newest {order['fencing_token']}")
    ok = statuses == [200] and order["items"] == requests and len(tokens) == requests
    print("OK" if ok else "FAILED: an update was lost")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(self_check()))
