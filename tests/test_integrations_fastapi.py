"""``aiodlock.integrations.fastapi``: lifespan, the ``hold()`` dependency, the status mapping.

In-process through ``httpx.ASGITransport`` (lifespan included) on ``memory://`` and on Redis,
and under a real uvicorn with two worker processes against a real Redis.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import httpx
import pytest
from fastapi import Depends, FastAPI

import aiodlock
from aiodlock.backends import Kind, LockSpec
from aiodlock.integrations.fastapi import default_detail, hold, lifespan
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


def own_words(exc: aiodlock.LockError) -> str:
    """A ``detail=`` hook: its own words for a busy order, the default for the rest."""
    if isinstance(exc, aiodlock.LockTimeoutError):
        return "this order is being changed; try again"
    return "lock trouble: " + default_detail(exc)


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

    @app.post("/worded/{item_id}")
    async def worded(
        item_id: int,
        lease: Annotated[aiodlock.Lease, hold("item:{item_id}", timeout=0.2, detail=own_words)],
    ) -> dict[str, Any]:
        return {"name": lease.name}

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
        assert busy.json() == {"detail": "locked"}
        assert (await client.post("/items/7")).status_code == 200  # free again


@pytest.mark.memory
async def test_a_detail_hook_chooses_the_body_and_keeps_retry_after() -> None:
    app = app_with()
    async with serving(app) as client:
        busy = await while_held(app.state.locks, "item:8", client.post("/worded/8"))
        assert busy.status_code == 423
        assert busy.headers["Retry-After"] == "1"
        assert busy.json() == {"detail": "this order is being changed; try again"}
        assert (await client.post("/worded/8")).json() == {"name": "item:8"}


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
        assert answer.json() == {"detail": "lock lost while handling the request"}
        assert app.state.finished is False
        assert app.state.lease.lost.is_set()
        assert (await client.post("/items/1")).status_code == 200  # the app serves on


@pytest.mark.redis
async def test_lock_service_down_is_503_telling_the_log_not_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The body is the generic words: no URL, no driver error; those are one WARNING line."""
    from tests.servers import RedisServer

    with RedisServer() as redis, caplog.at_level(logging.INFO, "aiodlock.integrations"):
        app = app_with(redis.url, connect_timeout=0.5)
        async with serving(app) as client:
            assert (await client.post("/items/1")).status_code == 200
            redis.stop()
            answer = await client.post("/items/1")
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "1"
            assert answer.json() == {"detail": "lock service unavailable"}
            worded = await client.post("/worded/1")
            assert worded.status_code == 503, worded.text
            assert worded.json() == {"detail": "lock trouble: lock service unavailable"}
            redis.start()
    records = [r for r in caplog.records if r.name == "aiodlock.integrations"]
    assert [r.levelno for r in records] == [logging.WARNING] * 2, records
    first = records[0]
    assert first.exc_info is None
    assert "\n" not in first.getMessage()
    assert first.getMessage().startswith("POST /items/1: 503 (lock service unavailable): ")
    assert f"127.0.0.1:{redis.port}" in first.getMessage()  # the service's own error


@pytest.mark.memory
async def test_a_busy_lock_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    app = app_with()
    with caplog.at_level(logging.INFO, "aiodlock.integrations"):
        async with serving(app) as client:
            busy = await while_held(app.state.locks, "item:9", client.post("/items/9"))
    assert busy.status_code == 423
    records = [r for r in caplog.records if r.name == "aiodlock.integrations"]
    assert [r.levelno for r in records] == [logging.INFO], records
    assert records[0].getMessage().startswith("POST /items/9: 423 (locked): LockTimeoutError")


@pytest.mark.redis
async def test_a_stopped_lock_service_answers_within_the_handlers_timeout() -> None:
    """The server stops answering (SIGSTOP): eight requests at once on a handler with
    ``timeout=0.2`` each answer 423 or 503 within 0.2 s + 100 ms (+ a loaded machine's
    slack), though they share the app's two connections."""
    from tests.servers import RedisServer

    with RedisServer() as redis:
        app = app_with(redis.url)
        async with serving(app) as client:
            assert (await client.post("/items/1")).status_code == 200
            loop = asyncio.get_running_loop()

            async def timed(item: int) -> tuple[float, int]:
                started = loop.time()
                answer = await client.post(f"/items/{item}")
                return loop.time() - started, answer.status_code

            redis.pause()
            try:
                answers = await asyncio.gather(*(timed(item) for item in range(8)))
            finally:
                redis.resume()
        assert all(status in (423, 503) for _, status in answers), answers
        assert max(took for took, _ in answers) <= 0.2 + 0.1 + 0.15, answers


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


BAD_LOCK_OPTIONS = [
    {"timeout": -1, "ttl": 0},  # the issue's: both bad, the client names the ttl first
    {"ttl": 0},
    {"ttl": 0.001},
    {"ttl": None},
    {"ttl": "5"},
    {"timeout": -1},
    {"timeout": float("nan")},
    {"max_hold": 0},
    {"reentrant": 1},
    {"fair": "yes"},
    {"tiemout": 5},
    {"kind": "read", "fair": True},
    {"kind": "read", "reentrant": True},
    {"kind": "semaphore", "limit": 0},
    {"kind": "semaphore", "limit": 2.5},
    {"kind": "semaphore", "limit": 2, "reentrant": True},
]


def client_error(options: dict[str, Any]) -> Exception:
    """What ``LockClient`` raises for these options (a memory client: no I/O, nothing held)."""
    options = dict(options)
    kind = options.pop("kind", "mutex")
    factory = {"mutex": "lock", "read": "read_lock", "semaphore": "semaphore"}[kind]

    async def build() -> None:
        async with aiodlock.connect("memory://") as locks:
            getattr(locks, factory)("order:1", **options)

    with pytest.raises((TypeError, ValueError)) as raised:
        asyncio.run(build())
    return raised.value


@pytest.mark.memory
@pytest.mark.parametrize("options", BAD_LOCK_OPTIONS, ids=repr)
def test_bad_lock_options_fail_at_declaration_with_the_clients_message(
    options: dict[str, Any],
) -> None:
    expected = client_error(options)
    with pytest.raises(type(expected)) as raised:
        hold("order:{order_id}", **options)
    assert str(raised.value) == str(expected)


@pytest.mark.memory
def test_a_detail_that_is_not_a_function_fails_at_declaration() -> None:
    with pytest.raises(TypeError, match="detail must be a function"):
        hold("order:{order_id}", detail="busy")  # type: ignore[arg-type]  # the mistake tested


@pytest.mark.memory
def test_depends_around_hold_fails_when_the_route_is_declared_saying_use_it_bare() -> None:
    app = FastAPI()
    wrapped = Depends(hold("order:{order_id}", timeout=1))
    with pytest.raises(TypeError, match=r"hold\(\) already returns the dependency.*use it bare"):

        @app.post("/orders/{order_id}")
        async def handler(order_id: int, lease: aiodlock.Lease = wrapped) -> None: ...


@pytest.mark.memory
async def test_hold_as_a_parameter_default_works() -> None:
    app = FastAPI(lifespan=lifespan())

    @app.post("/orders/{order_id}")
    async def handler(
        # FastAPI's own idiom for a dependency: a call in the default (B008 for ruff)
        order_id: int,
        lease: aiodlock.Lease = hold("order:{order_id}", timeout=1),  # noqa: B008
    ) -> dict[str, str]:
        return {"name": lease.name}

    async with serving(app) as client:
        assert (await client.post("/orders/3")).json() == {"name": "order:3"}


@pytest.mark.redis
async def test_a_lock_the_backend_cannot_provide_fails_at_startup(
    request: pytest.FixtureRequest,
) -> None:
    """``fair=True`` on Redlock (no FIFO handoff): refused when the app starts, naming the
    route, not a 500 on every request."""
    url = str(request.getfixturevalue("redlock_masters").url)
    app = FastAPI(lifespan=lifespan(url))

    @app.post("/orders/{order_id}")
    async def handler(
        order_id: int, lease: Annotated[aiodlock.Lease, hold("order:{order_id}", fair=True)]
    ) -> None: ...

    with pytest.raises(aiodlock.UnsupportedError, match=r"on route '/orders/\{order_id\}'.*fair"):
        async with app.router.lifespan_context(app):
            pass


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
