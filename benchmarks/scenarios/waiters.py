"""Scenario 3: 1000 waiters in one process on one held lock.

A holder (a second client of the same library, in this process) takes the lock. Then one
client starts ``count`` waiters (tasks, or threads for a blocking library) and, once they have
all asked and ``settle`` seconds have passed, we read what they cost: the server's client
connections (peak during the settle minus the count before the waiters' client was opened)
and this process's resident memory. The holder then releases; each waiter takes the lock and
releases it at once. ``drain`` is the time from that release until the last waiter is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Callable

import psutil  # type: ignore[import-untyped]  # no stubs in the dev environment

from ..adapters.base import AsyncAdapter, SyncAdapter
from .probes import ConnectionCounter

__all__ = ["run_async", "run_threads"]

_SAMPLE = 0.1


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


async def _settle(counter: ConnectionCounter, started: Callable[[], int], count: int,
                  settle: float, limit: float) -> int:
    """Wait for every waiter to have asked, then ``settle`` s; the peak connection count."""
    clock = time.perf_counter
    deadline = clock() + limit
    peak = await counter.count()
    while started() < count and clock() < deadline:
        await asyncio.sleep(_SAMPLE)
        peak = max(peak, await counter.count())
    until = clock() + settle
    while clock() < until:
        await asyncio.sleep(_SAMPLE)
        peak = max(peak, await counter.count())
    return peak


def _result(count: int, done: list[float], released: float, conns: int, rss: int,
            timeout: float) -> dict[str, object]:
    return {
        "waiters": count,
        "connections": conns,
        "rss_mib": rss / 2**20,
        "rss_kib_per_waiter": rss / 1024 / count,
        "drained": len(done),
        "drain_s": (max(done) - released) if len(done) == count else timeout,
        "complete": len(done) == count,
    }


async def run_async(
    make: Callable[[], AsyncAdapter],
    name: str,
    *,
    count: int,
    settle: float,
    timeout: float,
    ttl: float,
) -> dict[str, object]:
    counter = ConnectionCounter(make().endpoint)
    await counter.open()
    holder, waiters = make(), make()
    await holder.open()
    try:
        held = holder.hold(name, ttl=ttl)
        await held.__aenter__()
        gc.collect()
        base_conns, base_rss = await counter.count(), _rss()
        await waiters.open()
        started = 0
        done: list[float] = []

        async def wait_once() -> None:
            nonlocal started
            started += 1
            async with waiters.hold(name, ttl=ttl):
                done.append(time.perf_counter())

        tasks = [asyncio.create_task(wait_once()) for _ in range(count)]
        peak = await _settle(counter, lambda: started, count, settle, timeout)
        rss = _rss() - base_rss
        released = time.perf_counter()
        await held.__aexit__(None, None, None)
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        failed = [t.exception() for t in tasks if not t.cancelled() and t.exception()]
        if failed:
            raise RuntimeError(f"{len(failed)} waiters failed, first: {failed[0]!r}")
        return _result(count, done, released, peak - base_conns, rss, timeout)
    finally:
        await waiters.close()
        await holder.close()
        await counter.close()


async def run_threads(
    make: Callable[[], SyncAdapter],
    name: str,
    *,
    count: int,
    settle: float,
    timeout: float,
    ttl: float,
) -> dict[str, object]:
    """The same with one thread per waiter (the holder acts from this thread)."""
    counter = ConnectionCounter(make().endpoint)
    await counter.open()
    holder, waiters = make(), make()
    holder.open()
    try:
        held = holder.hold(name, ttl=ttl)
        held.__enter__()
        gc.collect()
        base_conns, base_rss = await counter.count(), _rss()
        waiters.open()
        guard = threading.Lock()
        started = finished = 0
        done: list[float] = []
        errors: list[BaseException] = []
        loop = asyncio.get_running_loop()
        all_done = asyncio.Event()

        def wait_once() -> None:
            nonlocal started, finished
            with guard:
                started += 1
            try:
                with waiters.hold(name, ttl=ttl):
                    done.append(time.perf_counter())
            except BaseException as exc:
                errors.append(exc)
            with guard:
                finished += 1
                if finished == count:
                    loop.call_soon_threadsafe(all_done.set)

        threads = [threading.Thread(target=wait_once, daemon=True) for _ in range(count)]
        for thread in threads:
            thread.start()
        peak = await _settle(counter, lambda: started, count, settle, timeout)
        rss = _rss() - base_rss
        released = time.perf_counter()
        held.__exit__(None, None, None)
        with contextlib.suppress(TimeoutError):  # the waiters stamp their own times
            await asyncio.wait_for(all_done.wait(), timeout)
        if errors:
            raise RuntimeError(f"{len(errors)} waiters failed, first: {errors[0]!r}")
        return _result(count, done, released, peak - base_conns, rss, timeout)
    finally:
        await asyncio.to_thread(waiters.close)
        await asyncio.to_thread(holder.close)
        await counter.close()
