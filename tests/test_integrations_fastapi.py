"""``aiodlock.integrations.fastapi``: lifespan, the ``hold()`` dependency, the status mapping.

In-process through ``httpx.ASGITransport`` (lifespan included) on ``memory://`` and on Redis,
and under a real uvicorn with two worker processes against a real Redis.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import httpx
import pytest
from fastapi import FastAPI

import aiodlock
from aiodlock.backends import Kind, LockSpec
from aiodlock.integrations.fastapi import hold, lifespan
from aiodlock.testing.conformance import SLACK_TTL
from tests.test_examples import ROOT, every_worker_answers, run, succeeded, uvicorn_workers

T = TypeVar("T")


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as client,
    ):
        yield client


async def while_held(locks: aiodlock.LockClient, name: str, request: Awaitable[T]) -> T:
    """Await ``request`` while another task holds the mutex ``name``."""
    held, done = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with locks.lock(name):
            held.set()
            await done.wait()

    async with asyncio.TaskGroup() as group:
        group.create_task(holder())
        await held.wait()
        try:
            return await request
        finally:
            done.set()


def app_with(url: str = "memory://", **options: Any) -> FastAPI:
    """Routes for each case: a counter, a busy report, a handler that waits to be cancelled."""
    app = FastAPI(lifespan=lifespan(url, **options))
    app.state.entered = asyncio.Event()
    app.state.finished = False

    @app.post("/items/{item_id}")
    async def add(
        item_id: int, lease: Annotated[aiodlock.Lease, hold("item:{item_id}", timeout=0.2)]
    ) -> dict[str, Any]:
        return {"name": lease.name, "token": lease.fencing_token, "held": lease.held}

    # Outlives a late renewal: it is lost to the break, not to the machine's load.
    @app.post("/slow/{key}")
    async def slow(
        key: str, lease: Annotated[aiodlock.Lease, hold("slow:{key}", ttl=SLACK_TTL, timeout=1)]
    ) -> dict[str, str]:
        app.state.lease = lease
        app.state.entered.set()
        await asyncio.sleep(30)  # cancelled when the lease is lost
        app.state.finished = True
        return {}

    @app.get("/read/{shelf}")
    async def read(
        shelf: str,
        lease: Annotated[aiodlock.Lease, hold("shelf:{shelf}", kind="read", timeout=0.2)],
    ) -> dict[str, str]:
        return {"name": lease.name}

    @app.get("/quota/{partner}")
    async def quota(
        partner: str,
        lease: Annotated[
            aiodlock.Lease, hold("quota:{partner}", kind="semaphore", limit=2, timeout=0.2)
        ],
    ) -> dict[str, str]:
        return {"name": lease.name}

    return app


@pytest.mark.memory
async def test_hold_names_the_lock_from_path_parameters() -> None:
    app = app_with()
    async with serving(app) as client:
        answer = await client.post("/items/42")
        assert answer.status_code == 200, answer.text
        assert answer.json()["name"] == "item:42"
        assert answer.json()["held"] is True
        assert (await client.get("/read/a b")).json() == {"name": "shelf:a b"}
        assert (await client.get("/quota/acme")).json() == {"name": "quota:acme"}
        assert app.state.locks.statistics().leases == 0  # released after each request


@pytest.mark.memory
async def test_busy_past_timeout_is_423_with_retry_after() -> None:
    app = app_with()
    async with serving(app) as client:
        busy = await while_held(app.state.locks, "item:7", client.post("/items/7"))
        assert busy.status_code == 423
        assert busy.headers["Retry-After"] == "1"
        assert "locked" in busy.json()["detail"]
        assert (await client.post("/items/7")).status_code == 200  # free again


@pytest.mark.memory
async def test_a_write_lock_excludes_hold_kind_read() -> None:
    app = app_with()
    async with serving(app) as client:
        held, done = asyncio.Event(), asyncio.Event()

        async def writer() -> None:
            async with app.state.locks.write_lock("shelf:s"):
                held.set()
                await done.wait()

        async with asyncio.TaskGroup() as group:
            group.create_task(writer())
            await held.wait()
            assert (await client.get("/read/s")).status_code == 423
            done.set()
        assert (await client.get("/read/s")).status_code == 200


@pytest.mark.memory
async def test_lost_lease_cancels_the_handler_and_answers_503() -> None:
    """The lock is broken under the handler: the dependency's ``async with`` cancels the
    handler (it never finishes) and the client gets 503 with Retry-After; the request task is
    left with no pending cancellation."""
    app = app_with()
    async with serving(app) as client:
        request = asyncio.create_task(client.post("/slow/x"))
        await app.state.entered.wait()
        spec = LockSpec("aiodlock", "slow:x", Kind.MUTEX)
        assert await app.state.locks.backend.break_lock(spec) == 1
        answer = await request
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == "1"
        assert "lock lost" in answer.json()["detail"]
        assert app.state.finished is False
        assert app.state.lease.lost.is_set()
        assert (await client.post("/items/1")).status_code == 200  # the app serves on


@pytest.mark.redis
async def test_lock_service_down_is_503(redis_url: str) -> None:
    from tests.servers import RedisServer

    with RedisServer() as redis:
        app = app_with(redis.url, connect_timeout=0.5)
        async with serving(app) as client:
            assert (await client.post("/items/1")).status_code == 200
            redis.stop()
            answer = await client.post("/items/1")
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "1"
            assert "unavailable" in answer.json()["detail"]
            redis.start()


@pytest.mark.memory
async def test_a_template_field_that_is_no_path_parameter_fails_at_startup() -> None:
    app = FastAPI(lifespan=lifespan())

    @app.post("/orders/{order}")
    async def handler(
        order: int, lease: Annotated[aiodlock.Lease, hold("order:{order_id}")]
    ) -> None: ...

    with pytest.raises(ValueError, match=r"\{order_id\} is not a path parameter of the route"):
        async with app.router.lifespan_context(app):
            pass


@pytest.mark.memory
async def test_without_the_lifespan_a_missing_field_fails_the_request_not_a_literal_lock() -> None:
    app = FastAPI()  # no aiodlock lifespan: nothing checked the routes at startup

    @app.post("/orders/{order}")
    async def handler(
        order: int, lease: Annotated[aiodlock.Lease, hold("order:{order_id}")]
    ) -> None: ...

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        with pytest.raises(RuntimeError, match=r"\{order_id\} is not a path parameter"):
            await client.post("/orders/1")


@pytest.mark.memory
async def test_no_lifespan_no_client_is_a_clear_error() -> None:
    app = FastAPI()

    @app.post("/orders/{order_id}")
    async def handler(
        order_id: int, lease: Annotated[aiodlock.Lease, hold("order:{order_id}")]
    ) -> None: ...

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        with pytest.raises(RuntimeError, match=r"no aiodlock client on app\.state\.locks"):
            await client.post("/orders/1")


@pytest.mark.memory
@pytest.mark.parametrize(
    ("template", "options", "error", "message"),
    [
        ("order:{}", {}, ValueError, "not a plain name"),
        ("order:{order.id}", {}, ValueError, "not a plain name"),
        ("order:{order_id", {}, ValueError, "bad lock name template"),
        ("", {}, ValueError, "name_template must not be empty"),
        ("x", {"kind": "exclusive"}, ValueError, "kind must be one of mutex, read"),
        ("x", {"kind": "semaphore"}, TypeError, "limit= is required"),
        ("x", {"limit": 3}, TypeError, "limit= is required"),
        ("x", {"retry_after": -1}, ValueError, "retry_after"),
    ],
)
def test_bad_hold_arguments_fail_when_declared(
    template: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        hold(template, **options)


@pytest.mark.memory
def test_bad_lifespan_arguments_fail_when_the_app_is_built() -> None:
    with pytest.raises(TypeError, match="unknown option 'nmespace'"):
        lifespan("memory://", nmespace="x")
    with pytest.raises(ValueError, match="unknown URL scheme"):
        lifespan("nonsense")


@pytest.mark.memory
async def test_lifespan_composes_with_the_apps_own() -> None:
    seen: list[str] = []

    @asynccontextmanager
    async def mine(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        assert isinstance(app.state.locks, aiodlock.LockClient)  # already open inside
        seen.append("start")
        yield {"db": "connected"}
        seen.append("stop")

    app = FastAPI(lifespan=lifespan(namespace="composed", inner=mine))

    async with app.router.lifespan_context(app) as state:
        assert state is not None
        assert state["db"] == "connected"
        assert state["locks"] is app.state.locks
        assert app.state.locks.namespace == "composed"
        locks = app.state.locks
    assert seen == ["start", "stop"]
    assert "closed" in repr(locks)
    assert not hasattr(app.state, "locks")


@pytest.mark.memory
def test_importing_aiodlock_imports_no_web_framework() -> None:
    code = (
        "import sys, aiodlock, aiodlock.integrations; "
        "bad = {'fastapi', 'starlette', 'aiohttp'} & set(sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


# ---------------------------------------------------------------------- the example, uvicorn

APP = "examples.fastapi_integration:app"


@pytest.mark.memory
def test_fastapi_integration_example_runs() -> None:
    assert "OK" in succeeded(run("examples/fastapi_integration.py"))


@pytest.mark.redis
def test_fastapi_integration_example_runs_on_redis(redis_url: str) -> None:
    assert "OK" in succeeded(run("examples/fastapi_integration.py", url=redis_url))


@pytest.mark.redis
async def test_two_uvicorn_workers_keep_a_read_sleep_write_counter_exact(redis_url: str) -> None:
    counter = f"/counters/c{os.urandom(6).hex()}"
    async with uvicorn_workers(redis_url, workers=2, app=APP, ready="/counters/ready") as base:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
            posts = await asyncio.gather(*(client.post(f"{counter}/increment") for _ in range(40)))
        assert [p.status_code for p in posts] == [200] * 40
        assert sorted(p.json()["value"] for p in posts) == list(range(1, 41))
        async with asyncio.timeout(30):
            reads = await every_worker_answers(base, counter, 2)
    assert [read["value"] for read in reads] == [40] * len(reads)


@pytest.mark.redis
async def test_two_uvicorn_workers_answer_423_while_the_lock_is_busy(redis_url: str) -> None:
    """Another process (this test, with its own client) holds the report's lock: every
    worker answers 423 with Retry-After after its 0.2 s timeout; once released, 200."""
    day = f"d{os.urandom(6).hex()}"
    async with uvicorn_workers(redis_url, workers=2, app=APP, ready="/counters/ready") as base:
        async with (
            aiodlock.connect(redis_url, namespace="counters") as locks,
            locks.lock(f"report:{day}"),
        ):
            for _ in range(4):
                async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                    busy = await client.post(f"/reports/{day}")
                assert busy.status_code == 423, busy.text
                assert busy.headers["Retry-After"] == "1"
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            done = await client.post(f"/reports/{day}")
        assert done.status_code == 200, done.text
