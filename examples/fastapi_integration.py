"""FastAPI with ``aiodlock.integrations.fastapi``: the lifespan and the lock as a dependency.

The same job as ``examples/fastapi_app.py`` with none of the glue written by hand: the client
is opened by ``lifespan()``, and each handler declares the lock it needs with ``hold()``,
named from its path parameters. Busy past the timeout is ``423 Locked`` with ``Retry-After``,
a lost lease or a lock-service outage ``503``.

``POST /counters/{name}/increment`` reads a counter, works a little, and writes it back: a
lost update would show without the lock. Under ``AIODLOCK_URL=redis://...`` the counters live
in Redis too, so it is exact across worker processes::

    AIODLOCK_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_integration:app --workers 2

Run the file to fire 30 concurrent increments in-process (through httpx) and check the count
and the 423 of a busy counter (exit 0 when both hold)::

    python examples/fastapi_integration.py
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Annotated, Protocol, TypeVar

from fastapi import FastAPI

import aiodlock
from aiodlock.integrations.fastapi import hold, lifespan

URL = os.environ.get("AIODLOCK_URL", "memory://")
T = TypeVar("T")


class Counters(Protocol):
    async def get(self, name: str) -> int: ...
    async def set(self, name: str, value: int) -> None: ...
    async def aclose(self) -> None: ...


class MemoryCounters:
    """Counters in a dict: for ``memory://``, one process only."""

    def __init__(self) -> None:
        self._values: dict[str, int] = {}

    async def get(self, name: str) -> int:
        await asyncio.sleep(0)  # a round trip to the database
        return self._values.get(name, 0)

    async def set(self, name: str, value: int) -> None:
        await asyncio.sleep(0)
        self._values[name] = value

    async def aclose(self) -> None:
        pass


class RedisCounters:
    """Counters in Redis strings ``counter:NAME``, shared by every worker process."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(url.partition("?")[0])

    async def get(self, name: str) -> int:
        return int(await self._redis.get(f"counter:{name}") or 0)

    async def set(self, name: str, value: int) -> None:
        await self._redis.set(f"counter:{name}", value)

    async def aclose(self) -> None:
        await self._redis.aclose()


@asynccontextmanager
async def counters_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The app's own lifespan: runs inside aiodlock's, with ``app.state.locks`` open."""
    counters = RedisCounters(URL) if URL.startswith("redis") else MemoryCounters()
    app.state.counters = counters
    try:
        yield
    finally:
        await counters.aclose()


app = FastAPI(
    title="aiodlock example: counters",
    lifespan=lifespan(URL, namespace="counters", inner=counters_lifespan),
)


@app.post("/counters/{name}/increment")
async def increment(
    name: str, lease: Annotated[aiodlock.Lease, hold("counter:{name}", timeout=10)]
) -> dict[str, int]:
    counters: Counters = app.state.counters
    value = await counters.get(name)
    await asyncio.sleep(0.002)  # some slow work between the read and the write
    await counters.set(name, value + 1)
    return {"value": value + 1, "fencing_token": lease.fencing_token}


@app.get("/counters/{name}")
async def read(name: str) -> dict[str, int]:
    counters: Counters = app.state.counters
    return {"value": await counters.get(name), "worker": os.getpid()}


@app.post("/reports/{day}")
async def build_report(
    day: str, lease: Annotated[aiodlock.Lease, hold("report:{day}", timeout=0.2)]
) -> dict[str, str | int]:
    """A report that must not be built twice at once: a second request waits 0.2 s, then
    gets 423 Locked with Retry-After."""
    await asyncio.sleep(0.01)
    return {"day": day, "fencing_token": lease.fencing_token}


async def while_held(locks: aiodlock.LockClient, name: str, request: Awaitable[T]) -> T:
    """Await ``request`` while another task holds the lock ``name`` (someone else's report)."""
    held, done = asyncio.Event(), asyncio.Event()

    async def someone_else() -> None:
        async with locks.lock(name):
            held.set()
            await done.wait()

    async with asyncio.TaskGroup() as group:
        group.create_task(someone_else())
        await held.wait()
        try:
            return await request
        finally:
            done.set()


async def self_check(requests: int = 30) -> int:
    """``requests`` concurrent increments land exactly; a busy report is 423. 0 if both."""
    import httpx  # only the self-check needs it

    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://counters") as client,
    ):
        before = (await client.get("/counters/demo")).json()["value"]
        answers = await asyncio.gather(
            *(client.post("/counters/demo/increment") for _ in range(requests))
        )
        after = (await client.get("/counters/demo")).json()["value"]
        busy = await while_held(
            app.state.locks, "report:2024-01-01", client.post("/reports/2024-01-01")
        )
    statuses = sorted({answer.status_code for answer in answers})
    print(f"{requests} concurrent increments -> statuses {statuses}, counter +{after - before}")
    print(f"a busy report -> {busy.status_code}, Retry-After {busy.headers.get('retry-after')}")
    ok = statuses == [200] and after - before == requests and busy.status_code == 423
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(self_check()))
