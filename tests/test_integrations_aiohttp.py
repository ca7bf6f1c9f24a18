"""``aiodlock.integrations.aiohttp``: ``setup()`` and ``hold()``, on a real aiohttp server
listening on a loopback TCP port (``aiohttp.test_utils.TestServer``), against a real Redis."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import aiodlock
from aiodlock.integrations.aiohttp import LOCKS, default_detail, hold, setup
from aiodlock.testing.conformance import SLACK_TTL

pytestmark = pytest.mark.redis

COUNTER = web.AppKey("counter", dict)
SLOW = web.AppKey("slow", dict)


def own_words(exc: aiodlock.LockError) -> str:
    """A ``detail=`` hook: its own words for a busy report, the default for the rest."""
    if isinstance(exc, aiodlock.LockTimeoutError):
        return "this report is being built; try again"
    return "lock trouble: " + default_detail(exc)


def make_app(url: str, namespace: str) -> web.Application:
    app = web.Application()
    setup(app, url, namespace=namespace)
    app[COUNTER] = {}
    app[SLOW] = {"entered": asyncio.Event(), "finished": False}

    @hold("counter:{name}", timeout=10)
    async def increment(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        counters = request.app[COUNTER]
        name = request.match_info["name"]
        value = counters.get(name, 0)
        await asyncio.sleep(0.002)  # read, work, write: a lost update would show
        counters[name] = value + 1
        return web.json_response({"value": value + 1, "token": lease.fencing_token})

    @hold("report:{day}", timeout=0.2, retry_after=7)
    async def report(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        return web.json_response({"name": lease.name})

    @hold("report:{day}", timeout=0.2, retry_after=7, detail=own_words)
    async def worded(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        return web.json_response({"name": lease.name})

    # Outlives a late renewal: it is lost to the operator's delete, not to the machine's load.
    @hold("slow:{key}", ttl=SLACK_TTL, timeout=1)
    async def slow(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        state = request.app[SLOW]
        state["lease"] = lease
        state["entered"].set()
        await asyncio.sleep(30)  # cancelled when the lease is lost
        state["finished"] = True
        return web.json_response({})

    @hold("shelf:{shelf}", kind="read", timeout=0.2)
    async def shelf(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        return web.json_response({"name": lease.name})

    app.router.add_post("/counters/{name}", increment)
    app.router.add_post("/reports/{day}", report)
    app.router.add_post("/worded/{day}", worded)
    app.router.add_post("/slow/{key}", slow)
    app.router.add_get("/shelves/{shelf}", shelf)
    return app


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    server = TestServer(app, host="127.0.0.1")
    client: TestClient[web.Request, web.Application] = TestClient(server)
    async with client:
        yield client


def namespace() -> str:
    return f"aio{os.urandom(5).hex()}"


async def test_setup_opens_one_client_for_the_app_and_closes_it(redis_url: str) -> None:
    app = make_app(redis_url, namespace())
    async with served(app):
        locks = app[LOCKS]
        assert isinstance(locks, aiodlock.LockClient)
    assert "closed" in repr(locks)


async def test_concurrent_requests_keep_a_read_sleep_write_counter_exact(redis_url: str) -> None:
    async with served(make_app(redis_url, namespace())) as client:
        answers = await asyncio.gather(*(client.post("/counters/c") for _ in range(30)))
        values = [(await answer.json())["value"] for answer in answers]
    assert [a.status for a in answers] == [200] * 30
    assert sorted(values) == list(range(1, 31))


async def test_two_servers_share_the_lock_through_redis(redis_url: str) -> None:
    """Two apps (as two processes would be), one counter dict shared in this test: the lock,
    not the event loop, keeps them apart."""
    ns = namespace()
    first, second = make_app(redis_url, ns), make_app(redis_url, ns)
    shared: dict[str, int] = {}
    first[COUNTER] = second[COUNTER] = shared
    async with served(first) as a, served(second) as b:
        answers = await asyncio.gather(*(client.post("/counters/both") for client in [a, b] * 15))
    assert [r.status for r in answers] == [200] * 30
    assert shared == {"both": 30}


async def test_busy_past_timeout_is_423_with_retry_after(redis_url: str) -> None:
    ns = namespace()
    async with (
        served(make_app(redis_url, ns)) as client,
        aiodlock.connect(redis_url, namespace=ns) as other,
    ):
        async with other.lock("report:monday"):
            busy = await client.post("/reports/monday")
            assert busy.status == 423
            assert busy.headers["Retry-After"] == "7"
            assert await busy.json() == {"detail": "locked"}
            worded = await client.post("/worded/monday")
            assert worded.status == 423
            assert worded.headers["Retry-After"] == "7"
            assert await worded.json() == {"detail": "this report is being built; try again"}
        assert (await client.post("/reports/monday")).status == 200
        async with other.write_lock("shelf:s"):
            assert (await client.get("/shelves/s")).status == 423


async def test_a_stopped_lock_service_answers_within_the_handlers_timeout() -> None:
    """The server stops answering (SIGSTOP): eight requests at once on a handler with
    ``timeout=0.2`` each answer 423 or 503 within 0.2 s + 100 ms (+ a loaded machine's
    slack), though they share the app's connections."""
    from tests.servers import RedisServer

    with RedisServer() as redis:
        async with served(make_app(redis.url, namespace())) as client:
            assert (await client.post("/reports/monday")).status == 200
            loop = asyncio.get_running_loop()

            async def timed(day: int) -> tuple[float, int]:
                started = loop.time()
                answer = await client.post(f"/reports/{day}")
                return loop.time() - started, answer.status

            redis.pause()
            try:
                answers = await asyncio.gather(*(timed(day) for day in range(8)))
            finally:
                redis.resume()
    assert all(status in (423, 503) for _, status in answers), answers
    assert max(took for took, _ in answers) <= 0.2 + 0.1 + 0.15, answers


async def test_lost_lease_cancels_the_handler_and_answers_503(redis_url: str) -> None:
    import redis.asyncio as redis

    ns = namespace()
    app = make_app(redis_url, ns)
    async with served(app) as client, redis.Redis.from_url(redis_url) as plain:
        request = asyncio.create_task(client.post("/slow/x"))
        await app[SLOW]["entered"].wait()
        assert await plain.delete(f"{{{ns}:slow:x}}") == 1  # an operator deletes the key
        answer = await request
        assert answer.status == 503
        assert answer.headers["Retry-After"] == "1"
        assert await answer.json() == {"detail": "lock lost while handling the request"}
        assert app[SLOW]["finished"] is False
        assert app[SLOW]["lease"].lost.is_set()


async def test_lock_service_down_is_503_telling_the_log_not_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The body is the generic words: no URL, no driver error; those are one WARNING line."""
    from tests.servers import RedisServer

    with RedisServer() as redis, caplog.at_level(logging.INFO, "aiodlock.integrations"):
        app = web.Application()
        setup(app, redis.url, namespace=namespace(), connect_timeout=0.5)

        @hold("report:{day}", timeout=0.2, detail=own_words)
        async def worded(request: web.Request, lease: aiodlock.Lease) -> web.Response:
            return web.json_response({"name": lease.name})

        app.router.add_post("/worded/{day}", worded)
        async with served(app) as client:
            assert (await client.post("/worded/monday")).status == 200
            redis.stop()
            answer = await client.post("/worded/monday")
            assert answer.status == 503
            assert answer.headers["Retry-After"] == "1"
            assert await answer.json() == {"detail": "lock trouble: lock service unavailable"}
            redis.start()
    records = [r for r in caplog.records if r.name == "aiodlock.integrations"]
    assert [r.levelno for r in records] == [logging.WARNING], records
    assert records[0].exc_info is None
    message = records[0].getMessage()
    assert "\n" not in message
    assert message.startswith("POST /worded/monday: 503 (lock trouble: lock service unavailable)")
    assert f"127.0.0.1:{redis.port}" in message  # the service's own error


async def test_a_template_field_missing_from_the_path_fails_at_startup(redis_url: str) -> None:
    app = web.Application()
    setup(app, redis_url)

    @hold("order:{order_id}")
    async def handler(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        return web.Response()

    app.router.add_post("/orders/{order}", handler)
    with pytest.raises(ValueError, match=r"\{order_id\} is not in the route's path"):
        async with TestServer(app, host="127.0.0.1"):
            pass


async def test_bad_setup_arguments_fail_at_once(redis_url: str) -> None:
    app = web.Application()
    options: dict[str, Any] = {"nmespace": "x"}
    with pytest.raises(TypeError, match="unknown option 'nmespace'"):
        setup(app, redis_url, **options)
    assert list(app.cleanup_ctx) == []


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"timeout": -1, "ttl": 0}, ValueError, "ttl must be > 0, not 0.0"),
        ({"timeout": -1}, ValueError, "timeout must be >= 0, not -1.0"),
        ({"max_hold": "1"}, TypeError, "max_hold must be a number of seconds, not str"),
        ({"tiemout": 5}, TypeError, "LockClient.lock() got an unexpected keyword argument"),
        ({"kind": "read", "fair": True}, TypeError, "LockClient.read_lock() got an unexpected"),
        ({"kind": "semaphore", "limit": 0}, ValueError, "limit must be >= 1, not 0"),
        ({"detail": "busy"}, TypeError, "detail must be a function"),
    ],
)
def test_bad_lock_options_fail_at_declaration(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        hold("order:{order_id}", **options)
    assert str(raised.value).startswith(message)


async def test_a_lock_the_backend_cannot_provide_fails_at_startup(
    request: pytest.FixtureRequest,
) -> None:
    """``fair=True`` on Redlock (no FIFO handoff): refused when the app starts, naming the
    route, not a 500 on every request."""
    app = web.Application()
    setup(app, str(request.getfixturevalue("redlock_masters").url))

    @hold("order:{order_id}", fair=True)
    async def handler(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        return web.Response()

    app.router.add_post("/orders/{order_id}", handler)
    with pytest.raises(aiodlock.UnsupportedError, match=r"on route '/orders/\{order_id\}'.*fair"):
        async with TestServer(app, host="127.0.0.1"):
            pass
