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
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.probes", "tests.support_zookeeper", "tests.support_mysql")

# ruff: noqa: E402 - the modules above must be registered for assertion rewriting first
import aiodlock
from aiodlock._url import load_backend
from aiodlock.backends import Capability
from tests import support_mysql, support_zookeeper
from tests.probes import MemoryProbe, Probe, RedisProbe
from tests.servers import RedisServer

pytest_plugins = ["tests.support_zookeeper", "tests.support_mysql"]


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


def capabilities_of(backend_name: str) -> frozenset[Capability]:
    return frozenset(load_backend(SCHEMES[backend_name]).capabilities)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (never skip) a test whose backend does not declare what it needs.

    A test states its needs with ``@pytest.mark.requires(Capability.X, ...)``, or through the
    ``make`` fixture's lock kind. test_capabilities.py checks, for every backend, that each
    kind it does not declare fails with UnsupportedError at construction, so deselection
    cannot hide a missing feature.
    """
    kept, dropped = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        backend = params.params.get("backend_name") if params else None
        needed: set[Capability] = set()
        for mark in item.iter_markers("requires"):
            needed.update(mark.args)
        kind = params.params.get("make") if params else None
        if kind is not None:
            needed.update(KIND_NEEDS[kind])
        if backend is not None and not needed <= capabilities_of(backend):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# What each conformance lock kind (the ``make`` fixture's ids) needs from a backend.
KIND_NEEDS: dict[str, frozenset[Capability]] = {
    "mutex": frozenset({Capability.EXCLUSIVE}),
    "reentrant": frozenset({Capability.EXCLUSIVE}),
    "fair": frozenset({Capability.EXCLUSIVE, Capability.FAIR}),
    "write": frozenset({Capability.SHARED}),
    "semaphore1": frozenset({Capability.COUNTING}),
}


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
    """One backend under test: how to connect, and a probe to look behind the library's back."""

    name: str
    url: str
    namespace: str
    options: dict[str, Any]
    probe: Probe

    def connect(self, **options: Any) -> aiodlock.LockClient:
        return aiodlock.connect(self.url, namespace=self.namespace, **{**self.options, **options})

    async def break_lock(self, client: aiodlock.LockClient, name: str) -> None:
        """Destroy the lock's state under its holder (as an operator or an expiry would)."""
        await self.probe.break_lock(client, self.namespace, name)

    async def leftovers(self) -> list[str]:
        """State this test's namespace left behind, apart from the fencing counters."""
        return await self.probe.leftovers(self.namespace)


async def _memory_target(request: pytest.FixtureRequest, namespace: str) -> Target:
    return Target("memory", f"memory://{namespace}", namespace, {}, MemoryProbe())


async def _redis_target(request: pytest.FixtureRequest, namespace: str) -> Target:
    url = request.getfixturevalue("redis_url")
    return Target("redis", url, namespace, {"wakeup": "pubsub"}, RedisProbe(url))


async def _redis_blpop_target(request: pytest.FixtureRequest, namespace: str) -> Target:
    url = request.getfixturevalue("redis_url")
    return Target("redis-blpop", url, namespace, {"wakeup": "blpop"}, RedisProbe(url))


# name -> how to reach it. A backend joins the whole suite by adding itself here (the
# ZooKeeper and MySQL ones live in their own support modules, which are also pytest plugins
# for their server fixtures).
TARGETS: dict[str, Callable[[pytest.FixtureRequest, str], Awaitable[Target]]] = {
    "memory": _memory_target,
    "redis": _redis_target,
    "redis-blpop": _redis_blpop_target,
    **support_zookeeper.TARGETS,
    **support_mysql.TARGETS,
}
# name -> URL scheme, to read the backend's declared capabilities at collection time.
SCHEMES: dict[str, str] = {
    "memory": "memory",
    "redis": "redis",
    "redis-blpop": "redis",
    **support_zookeeper.SCHEMES,
    **support_mysql.SCHEMES,
}
BACKENDS = tuple(TARGETS)
SERVER_BACKENDS = tuple(name for name in TARGETS if name != "memory")


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def target(backend_name: str, request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    made = await TARGETS[backend_name](request, namespace)
    try:
        yield made
    finally:
        await made.probe.aclose()


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
