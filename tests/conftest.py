"""The backend matrix, real servers, and two independent clients per test.

Every conformance test runs once per backend in ``BACKENDS``. Server backends get a real
server started here (never the machine's own services); a server that cannot start is an
error, never a skip. With ``--require-all-backends`` (CI and the README's test command) a
skipped test is turned into a failure too, so a run that claims to cover every backend does.

``AIODLOCK_TEST_LOOP=uvloop`` runs every test under uvloop instead of the default loop.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends.memory import MemoryBackend
from tests.servers import RedisServer

BACKENDS = ("memory", "redis", "redis-blpop")
SERVER_BACKENDS = ("redis", "redis-blpop")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-all-backends",
        action="store_true",
        help="fail (not skip) when a backend cannot be tested: the CI setting",
    )


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    loop = os.environ.get("AIODLOCK_TEST_LOOP", "asyncio")
    if loop == "uvloop":
        import uvloop

        return {"uvloop": uvloop.new_event_loop}
    if loop != "asyncio":
        raise pytest.UsageError(f"AIODLOCK_TEST_LOOP must be asyncio or uvloop, not {loop!r}")
    return {"asyncio": asyncio.new_event_loop}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and item.config.getoption("--require-all-backends"):
        report.outcome = "failed"
        report.longrepr = f"skipped under --require-all-backends: {report.longrepr}"
    return report


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"aiodlock backends: {', '.join(BACKENDS)}; "
        f"loop: {os.environ.get('AIODLOCK_TEST_LOOP', 'asyncio')}"
    )


# ---------------------------------------------------------------------- servers


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One throwaway redis-server for the session (tests use unique namespaces)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


# ---------------------------------------------------------------------- backend matrix


@dataclass
class Target:
    """One backend under test: how to connect, and how to look behind the library's back."""

    name: str
    url: str
    namespace: str
    options: dict[str, Any]
    raw: aioredis.Redis | None = None

    def connect(self, **options: Any) -> aiodlock.LockClient:
        return aiodlock.connect(self.url, namespace=self.namespace, **{**self.options, **options})

    @property
    def is_redis(self) -> bool:
        return self.raw is not None

    async def break_lock(self, client: aiodlock.LockClient, name: str) -> None:
        """Delete the lock's state under its holder (as an operator or an expiry would)."""
        if self.raw is None:
            backend = client._backend
            assert isinstance(backend, MemoryBackend)
            assert backend.break_lock(self.namespace, name) > 0
            return
        keys = [k async for k in self.raw.scan_iter(match=f"*{{{self.namespace}:{name}}}*")]
        keys = [k for k in keys if not k.endswith(b":fence")]
        assert keys, "nothing to break"
        await self.raw.delete(*keys)

    async def leftovers(self) -> list[str]:
        """State this test's namespace left behind, apart from the fencing counters."""
        if self.raw is None:
            stores = [s for s in _memory_stores() if s]
            return [
                repr(key) for store in stores for key in store.entries if key[0] == self.namespace
            ]
        keys = [
            bytes(k).decode()
            async for k in self.raw.scan_iter(match=f"*{{{self.namespace}:*")
            if not k.endswith(b":fence")
        ]
        channels = await self.raw.pubsub_channels(f"*{{{self.namespace}:*")
        return keys + [f"channel {c!r}" for c in channels]


def _memory_stores() -> list[Any]:
    from aiodlock.backends import memory

    return list(memory._STORES.values())


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def target(backend_name: str, request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    if backend_name == "memory":
        yield Target(backend_name, f"memory://{namespace}", namespace, {})
        return
    url = request.getfixturevalue("redis_url")
    wakeup = "blpop" if backend_name == "redis-blpop" else "pubsub"
    raw = aioredis.Redis.from_url(url)
    try:
        yield Target(backend_name, url, namespace, {"wakeup": wakeup}, raw)
    finally:
        await raw.aclose()


@pytest.fixture
async def locks(target: Target) -> AsyncIterator[aiodlock.LockClient]:
    async with target.connect() as client:
        yield client


@pytest.fixture
async def other(target: Target) -> AsyncIterator[aiodlock.LockClient]:
    """A second, independent client: another process, as far as the service can tell."""
    async with target.connect() as client:
        yield client


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Wait for a condition that no event reports (a waiter queued on a remote service)."""
    async with asyncio.timeout(10):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but the condition
            await asyncio.sleep(0.001)


async def settle(*clients: aiodlock.LockClient) -> None:
    """Wait until the clients' background cleanups (compensating releases) are done."""
    for client in clients:
        while client._cleanups:
            await asyncio.gather(*client._cleanups)
