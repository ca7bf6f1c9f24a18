"""Deadlines hold whatever the server does, on every backend: a stopped server (SIGSTOP), a
blackholed link and a crawling one (every chunk 2 s late, each way), through
:class:`tests.faults.Relay`.

Such a server keeps its connections open and answers nothing in time, the hardest of the
gray failures for a client: nothing fails, everything waits. Eight callers share one client
(more than its connections), so a caller that queued behind a stalled connection must still
leave at its own deadline:

- ``acquire(timeout=T)`` ends (grant, ``LockTimeoutError`` or ``BackendError``) within
  ``T`` + 100 ms;
- ``try_acquire()`` ends within ``request_timeout``;
- ``release()`` returns or raises within ``request_timeout``; a release it could not confirm
  goes on in the background and the lease is reported lost.

``SCHEDULING_SLACK`` is added to every bound: the suite runs beside other workers on a small
machine, where the event loop itself may run late by that much.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import pytest

import aiodlock
from tests.faults import Relay
from tests.servers import LOOPBACK, ServerProcess

TIMEOUT: Final = 1.0
REQUEST_TIMEOUT: Final = 1.0
DEADLINE_SLACK: Final = 0.1  # what the issue allows past a deadline
SCHEDULING_SLACK: Final = 0.15  # a loaded test machine's late timers
CALLERS: Final = 8
CRAWL: Final = 2.0  # seconds each chunk is held back in the crawling case
FAULTS: Final = ["stopped", "blackholed", "crawling"]

BACKENDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("zookeeper", marks=pytest.mark.zookeeper),
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("mysql", marks=pytest.mark.mysql),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
_SERVER_FIXTURES: Final = {
    "redis": "redis_server",
    "zookeeper": "zookeeper_server",
    "etcd": "etcd_server",
    "mysql": "mariadb_server",
    "postgres": "postgres_server",
}


@pytest.fixture(autouse=True)
def quiet_under_failure(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A fault is a state change, logged as one WARNING, never an ERROR per request (nor a
    "Future exception was never retrieved" for a failed request nobody awaited)."""
    caplog.set_level(logging.WARNING)
    yield
    gc.collect()  # an unretrieved exception is logged when its future is collected
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


@pytest.fixture(params=BACKENDS)
def server(request: pytest.FixtureRequest) -> ServerProcess:
    found: ServerProcess = request.getfixturevalue(_SERVER_FIXTURES[request.param])
    return found


@pytest.fixture(params=FAULTS)
def fault(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Faulted:
    """A client's way to ``server`` (through a relay unless the server itself is stopped),
    and :meth:`during`, which applies the fault."""

    def __init__(self, server: ServerProcess, fault: str, relay: Relay | None) -> None:
        self.server, self.fault, self.relay = server, fault, relay
        url: str = server.url  # type: ignore[attr-defined]
        if relay is not None:
            url = url.replace(f"{LOOPBACK}:{server.port}", f"{relay.host}:{relay.port}")
        self.url = url

    def connect(self, **options: Any) -> aiodlock.LockClient:
        namespace = f"deadline-{uuid.uuid4().hex[:8]}"
        return aiodlock.connect(self.url, namespace=namespace, **options)

    @contextlib.asynccontextmanager
    async def during(self) -> AsyncIterator[None]:
        if self.relay is None:
            self.server.pause()
        elif self.fault == "blackholed":
            self.relay.blackhole()
        else:
            self.relay.latency(CRAWL)
        try:
            yield
        finally:
            if self.relay is None:
                self.server.resume()
            else:
                await self.relay.heal()


@contextlib.asynccontextmanager
async def faulted(server: ServerProcess, fault: str) -> AsyncIterator[Faulted]:
    """Entered in the test's own task: the relay's task group belongs to it."""
    if fault == "stopped":
        yield Faulted(server, fault, None)
        return
    async with Relay(LOOPBACK, server.port) as relay:
        yield Faulted(server, fault, relay)


async def timed(work: Any) -> tuple[float, BaseException | None]:
    """How long ``work`` took, and what it raised."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await work
    except Exception as exc:
        return loop.time() - started, exc
    return loop.time() - started, None


async def warm(locks: aiodlock.LockClient) -> None:
    """Connections made, tables and paths created: what follows waits only on the stall."""
    for name in ("warm-1", "warm-2"):
        async with locks.lock(name):
            pass


async def test_acquires_end_at_their_deadline(server: ServerProcess, fault: str) -> None:
    async with faulted(server, fault) as way, way.connect() as locks:
        await warm(locks)
        async with way.during():
            # Half on one name (they queue behind each other locally), half on names of
            # their own (they queue for the client's connections).
            names = ["same"] * (CALLERS // 2) + [f"own-{i}" for i in range(CALLERS // 2)]
            outcomes = await asyncio.gather(
                *(timed(locks.lock(name).acquire(timeout=TIMEOUT)) for name in names)
            )
        for took, error in outcomes:
            assert error is None or isinstance(
                error, aiodlock.LockTimeoutError | aiodlock.BackendError
            ), repr(error)
            assert took <= TIMEOUT + DEADLINE_SLACK + SCHEDULING_SLACK, outcomes
        assert all(error is not None for _, error in outcomes), outcomes  # nobody answered


async def test_try_acquire_ends_within_request_timeout_however_many_callers(
    server: ServerProcess, fault: str
) -> None:
    async with (
        faulted(server, fault) as way,
        way.connect(request_timeout=REQUEST_TIMEOUT) as locks,
    ):
        await warm(locks)
        async with way.during():
            outcomes = await asyncio.gather(
                *(timed(locks.lock(f"try-{i}").try_acquire()) for i in range(CALLERS))
            )
        for took, error in outcomes:
            assert error is None or isinstance(error, aiodlock.BackendError), repr(error)
            assert took <= REQUEST_TIMEOUT + SCHEDULING_SLACK, outcomes


async def test_leaving_the_block_never_waits_past_request_timeout(
    server: ServerProcess, fault: str
) -> None:
    async with (
        faulted(server, fault) as way,
        way.connect(request_timeout=REQUEST_TIMEOUT) as locks,
    ):
        await warm(locks)
        lease = await locks.lock("left").acquire(timeout=5)
        async with way.during():
            took, error = await timed(lease.release())
        assert took <= REQUEST_TIMEOUT + SCHEDULING_SLACK, (took, error)
        if error is not None:
            # Unconfirmed: reported lost, so the holder knows its end ran unprotected.
            assert isinstance(error, aiodlock.LockError), repr(error)
            assert lease.lost.is_set()
