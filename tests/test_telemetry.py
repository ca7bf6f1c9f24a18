"""Observability: log records carry the lock, and OpenTelemetry sees acquisitions and holds.

Logs are checked with caplog (logger ``aiodlock.locks``); spans and metrics with the
OpenTelemetry SDK's in-memory exporter and reader, installed once as the global providers
(OpenTelemetry allows that once per process). Each test uses a namespace of its own, so the
cumulative counters are read per namespace. Without OpenTelemetry installed, a subprocess
shows that locks work and log as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import aiodlock
from aiodlock.testing.conformance import SLACK_TTL

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
LOGGER = "aiodlock.locks"


def fresh_namespace() -> str:
    return f"obs{uuid.uuid4().hex[:10]}"


def records(caplog: pytest.LogCaptureFixture, namespace: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == LOGGER and getattr(r, "aiodlock_namespace", None) == namespace
    ]


def fields(record: logging.LogRecord) -> tuple[Any, Any, Any]:
    return (
        getattr(record, "aiodlock_name", None),
        getattr(record, "aiodlock_kind", None),
        getattr(record, "aiodlock_token", None),
    )


# ---------------------------------------------------------------------- logs


@pytest.mark.memory
async def test_grants_and_releases_are_debug_records_carrying_the_lock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiodlock")
    ns = fresh_namespace()
    async with aiodlock.connect("memory://", namespace=ns) as locks:
        async with locks.lock("order:42") as lease:
            pass
        async with locks.semaphore("pool", limit=2) as permit:
            pass
    acquired, released, sem_acquired, sem_released = records(caplog, ns)
    assert [r.levelno for r in (acquired, released)] == [logging.DEBUG] * 2
    assert acquired.getMessage().startswith("acquired lock 'order:42' (token ")
    assert released.getMessage().startswith("released lock 'order:42' (token ")
    assert fields(acquired) == fields(released) == ("order:42", "mutex", lease.fencing_token)
    assert fields(sem_acquired) == ("pool", "semaphore", permit.fencing_token)
    assert sem_released.levelno == logging.DEBUG


@pytest.mark.memory
async def test_a_lost_lease_is_a_warning_and_a_timeout_a_debug_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiodlock")
    ns = fresh_namespace()
    async with (
        aiodlock.connect("memory://", namespace=ns) as locks,
        aiodlock.connect("memory://", namespace=ns) as other,
    ):
        with pytest.raises(aiodlock.LockLostError):
            # Not lost to a late renewal before the break: the loss is the break, told at once.
            async with locks.write_lock("catalog", ttl=SLACK_TTL) as lease:
                with pytest.raises(aiodlock.LockTimeoutError):
                    await other.write_lock("catalog").acquire(timeout=0.01)
                assert await other.break_lock("catalog", kind="write") == 1
                await asyncio.sleep(5)  # cancelled when the break is told
    timeout, lost = [r for r in records(caplog, ns) if r.getMessage().split()[0] != "acquired"]
    assert timeout.levelno == logging.DEBUG
    assert timeout.getMessage().startswith("timed out waiting for write lock 'catalog' after ")
    assert fields(timeout) == ("catalog", "write", None)
    assert lost.levelno == logging.WARNING
    assert lost.getMessage().startswith(f"lost write lock 'catalog' (token {lease.fencing_token})")
    assert "reported it gone (broken" in lost.getMessage()
    assert fields(lost) == ("catalog", "write", lease.fencing_token)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    from tests.servers import RedisServer

    with RedisServer() as server:
        yield server


@pytest.mark.redis
async def test_failed_renewals_are_one_warning_per_streak_then_the_loss(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A paused server: the first failed renewal is a WARNING, the retries are quiet, and the
    loss at the validity deadline is a WARNING; both carry the lock."""
    caplog.set_level(logging.DEBUG, logger="aiodlock")
    ns = fresh_namespace()
    async with aiodlock.connect(own_redis.url, namespace=ns, socket_timeout=0.2) as locks:
        try:
            with pytest.raises(aiodlock.LockLostError):
                async with locks.lock("job", ttl=1.5) as lease:
                    await asyncio.to_thread(own_redis.pause)
                    await asyncio.sleep(10)
        finally:
            await asyncio.to_thread(own_redis.resume)
    warnings = [r for r in records(caplog, ns) if r.levelno == logging.WARNING]
    failed, lost = warnings
    assert failed.getMessage().startswith(
        f"renewing lock 'job' (token {lease.fencing_token}) failed"
    )
    assert lost.getMessage().startswith(f"lost lock 'job' (token {lease.fencing_token})")
    assert fields(failed) == fields(lost) == ("job", "mutex", lease.fencing_token)


@pytest.mark.mysql
async def test_records_never_show_the_password(
    mysql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease lost on MySQL (its session killed by break): the WARNING names the server, never
    its password."""
    from aiodlock.backends import parse_url

    password = parse_url(mysql_url).password
    assert password
    caplog.set_level(logging.DEBUG, logger="aiodlock")
    ns = fresh_namespace()
    async with (
        aiodlock.connect(mysql_url, namespace=ns) as locks,
        aiodlock.connect(mysql_url, namespace=ns) as operator,
    ):
        with pytest.raises(aiodlock.LockLostError):
            async with locks.lock("secretive"):
                assert await operator.break_lock("secretive") == 1
                await asyncio.sleep(10)
    ours = records(caplog, ns)
    assert any(r.levelno == logging.WARNING for r in ours)
    for record in caplog.records:
        assert password not in record.getMessage()
        assert password not in str(vars(record))


@pytest.mark.memory
def test_without_opentelemetry_locks_work_and_log() -> None:
    """OpenTelemetry made unimportable: the same program runs, logs, and imports none of it."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "import asyncio, logging, aiodlock\n"
        "logging.basicConfig(level=logging.DEBUG, format='%(name)s %(message)s')\n"
        "async def main():\n"
        "    async with aiodlock.connect() as locks, locks.lock('x'):\n"
        "        pass\n"
        "asyncio.run(main())\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.')]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "aiodlock.locks acquired lock 'x'" in result.stderr
    assert "aiodlock.locks released lock 'x'" in result.stderr


# ---------------------------------------------------------------------- OpenTelemetry


@dataclass
class OTel:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def finished(self, namespace: str) -> list[ReadableSpan]:
        return [
            span
            for span in self.spans.get_finished_spans()
            if (span.attributes or {}).get("aiodlock.namespace") == namespace
        ]

    def counts(self, namespace: str) -> dict[str, float]:
        """Sum of each aiodlock metric's data points for ``namespace`` (counters: the count,
        histograms: how many values were recorded)."""
        totals: dict[str, float] = {}
        data = self.metrics.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        if (point.attributes or {}).get("aiodlock.namespace") != namespace:
                            continue
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count  # type: ignore[union-attr]
                        totals[metric.name] = totals.get(metric.name, 0) + value
        return totals


_OTEL: OTel | None = None


@pytest.fixture
def otel() -> OTel:
    """The SDK's in-memory exporter and reader as the global providers (set once)."""
    global _OTEL
    if _OTEL is None:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _OTEL = OTel(exporter, reader)
    return _OTEL


async def check_otel(otel: OTel, url: str) -> None:
    """A waited grant, a timeout and a loss: their spans and counters."""
    ns = fresh_namespace()
    loop = asyncio.get_running_loop()
    async with (
        aiodlock.connect(url, namespace=ns) as locks,
        aiodlock.connect(url, namespace=ns) as other,
    ):
        first = await locks.lock("job").acquire()
        called_ns = time.time_ns()  # the waiter's acquire() begins after this
        waiting = asyncio.create_task(other.lock("job").acquire(timeout=10))
        with pytest.raises(aiodlock.LockTimeoutError):
            await other.lock("job").acquire(timeout=0.05)
        started = loop.time()
        started_ns = time.time_ns()  # ...and before this (it ran while the timeout waited)
        await asyncio.sleep(0.1)  # the waiter waits at least this long
        released_ns = time.time_ns()  # it is granted after this
        await first.release()
        second = await waiting
        granted_ns = time.time_ns()  # ...and before this
        waited = loop.time() - started
        await second.release()
        with pytest.raises(aiodlock.LockLostError):
            async with other.lock("job", ttl=0.6):
                assert await locks.break_lock("job") == 1
                await asyncio.sleep(10)

    spans = otel.finished(ns)
    acquires = [s for s in spans if s.name == "aiodlock.acquire"]
    holds = [s for s in spans if s.name == "aiodlock.hold"]
    assert len(acquires) == 4  # first, the timeout, the waiter, the last holder
    assert len(holds) == 3
    timeout = next(s for s in acquires if s.status.status_code.name == "ERROR")
    assert [e.name for e in timeout.events] == ["aiodlock.timeout"]
    timeout_wait = (timeout.attributes or {})["aiodlock.wait_seconds"]
    assert isinstance(timeout_wait, float) and 0.04 <= timeout_wait < 5  # uvloop: ms timers
    granted = [s for s in acquires if s.status.status_code.name != "ERROR"]
    tokens = [(s.attributes or {})["aiodlock.fencing_token"] for s in granted]
    assert second.fencing_token in tokens and first.fencing_token in tokens
    waiter = next(
        s for s in granted if (s.attributes or {})["aiodlock.fencing_token"] == second.fencing_token
    )
    assert waiter.attributes is not None
    assert waiter.attributes["aiodlock.name"] == "job"
    assert waiter.attributes["aiodlock.kind"] == "mutex"
    wait = waiter.attributes["aiodlock.wait_seconds"]
    assert isinstance(wait, float) and waited <= wait < waited + 5
    assert waiter.end_time is not None and waiter.start_time is not None
    # The span sits where the wait happened on the wall clock: it began with the call (the
    # loop's clock rounds to whole ms on uvloop, hence the 2 ms) and ended at the grant.
    assert called_ns - 2_000_000 <= waiter.start_time <= started_ns
    assert released_ns <= waiter.end_time <= granted_ns
    lost = [s for s in holds if s.status.status_code.name == "ERROR"]
    assert len(lost) == 1
    assert [e.name for e in lost[0].events] == ["aiodlock.lost"]
    assert otel.counts(ns) == {
        "aiodlock.grants": 3,
        "aiodlock.timeouts": 1,
        "aiodlock.losses": 1,
        "aiodlock.wait": 3,
    }


@pytest.mark.memory
async def test_opentelemetry_spans_and_counters_on_memory(otel: OTel) -> None:
    await check_otel(otel, "memory://")


@pytest.mark.redis
async def test_opentelemetry_spans_and_counters_on_redis(otel: OTel, redis_url: str) -> None:
    await check_otel(otel, redis_url)


@pytest.mark.memory
def test_the_opentelemetry_example_of_docs_operations_runs() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    (example,) = [b for b in blocks if "opentelemetry" in b]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", example],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert '"name": "aiodlock.acquire"' in result.stdout
    assert '"name": "aiodlock.hold"' in result.stdout
