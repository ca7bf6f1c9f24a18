"""The child process that measures one cell: one library, one scenario, one event loop.

``python -m benchmarks.worker '<job as JSON>'`` prints one JSON line: ``{"ok": true,
"metrics": {...}}`` or ``{"ok": false, "error": "..."}``. Running each cell in a fresh process
keeps the memory measurement clean, lets a library that does not import fail alone, and lets
each cell pick its event loop. Two helper modes serve other cells: ``member`` (one process of
the multi-process contended scenario) and ``holder`` (the crashing holder of the handoff
scenario).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from .adapters import by_key
from .adapters.base import AsyncAdapter, Endpoint, SyncAdapter
from .scenarios import contended, contended_procs, handoff, storm, uncontended, waiters

__all__ = ["main"]

T = TypeVar("T")
Job = Mapping[str, Any]


def _runner(loop: str) -> asyncio.Runner:
    if loop == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return asyncio.Runner(loop_factory=factory)
    return asyncio.Runner()


def _build(job: Job, *, session_timeout: float = 10.0) -> AsyncAdapter | SyncAdapter:
    endpoint = Endpoint(**job["endpoint"])
    return by_key(job["library"]).build(endpoint, session_timeout=session_timeout)


async def _opened(adapter: AsyncAdapter | SyncAdapter) -> None:
    if isinstance(adapter, AsyncAdapter):
        await asyncio.wait_for(adapter.open(), 30)
    else:
        await asyncio.to_thread(adapter.open)


async def _closed(adapter: AsyncAdapter | SyncAdapter) -> None:
    if isinstance(adapter, AsyncAdapter):
        await asyncio.wait_for(adapter.close(), 30)
    else:
        await asyncio.to_thread(adapter.close)


async def _with_adapter(
    job: Job, body: Callable[[AsyncAdapter | SyncAdapter], Awaitable[T]]
) -> T:
    adapter = _build(job)
    await _opened(adapter)
    try:
        return await body(adapter)
    finally:
        await _closed(adapter)


async def _cell(job: Job) -> dict[str, object]:
    p: Mapping[str, Any] = job["params"]
    scenario, name, ttl = job["scenario"], job["name"], p["ttl"]

    if scenario == "uncontended":

        async def uncontended_body(a: AsyncAdapter | SyncAdapter) -> dict[str, object]:
            kw = {"cycles": p["cycles"], "warmup": p["warmup"], "ttl": ttl}
            if not isinstance(a, AsyncAdapter):
                return await asyncio.to_thread(uncontended.run_sync, a, name, **kw)
            floor = _floor_of(job)
            if floor is None:
                return await uncontended.run_async(a, name, **kw)
            await _opened(floor)
            try:
                return await uncontended.run_async(a, name, floor=floor, **kw)
            finally:
                await _closed(floor)

        return await _with_adapter(job, uncontended_body)

    if scenario == "contended":

        async def contended_body(a: AsyncAdapter | SyncAdapter) -> dict[str, object]:
            kw = {"workers": p["workers"], "duration": p["duration"], "section": p["section"],
                  "ttl": ttl}  # fmt: skip
            if isinstance(a, AsyncAdapter):
                tally = await contended.run_async(a, name, **kw)
            else:
                tally = await asyncio.to_thread(contended.run_threads, a, name, **kw)
            return tally.result(p["section"])

        return await _with_adapter(job, contended_body)

    if scenario == "contended_procs":
        tally = await asyncio.to_thread(
            contended_procs.run, job, processes=p["workers"], duration=p["duration"],
            section=p["section"], ttl=ttl,
        )  # fmt: skip
        return {"processes": p["workers"], **tally.result(p["section"])}

    if scenario == "waiters":
        library = by_key(job["library"])
        kw = {"count": p["waiters"], "settle": p["settle"], "timeout": p["drain_timeout"],
              "ttl": ttl}  # fmt: skip
        if library.asynchronous:
            return await waiters.run_async(lambda: _async(_build(job)), name, **kw)
        return await waiters.run_threads(lambda: _sync(_build(job)), name, **kw)

    if scenario == "handoff":

        async def handoff_body(a: AsyncAdapter | SyncAdapter) -> dict[str, object]:
            return await handoff.run(
                job, a, name, trials=p["trials"], ttl=p["handoff_ttl"],
                session_timeout=p["session_timeout"],
                timeout=p["handoff_ttl"] + p["session_timeout"] + 15,
            )  # fmt: skip

        return await _with_adapter(job, handoff_body)

    if scenario == "storm":
        session_timeout = p["storm_session_timeout"]
        adapter = _async(_build(job, session_timeout=session_timeout))
        await _opened(adapter)
        try:
            return await storm.run(
                {**job, "session_timeout": session_timeout}, adapter,
                processes=p["storm_processes"], tasks=p["storm_tasks"],
                duration=p["storm_duration"], ttl=p["storm_ttl"],
            )  # fmt: skip
        finally:
            await _closed(adapter)

    raise ValueError(f"unknown scenario {scenario!r}")


def _floor_of(job: Job) -> AsyncAdapter | None:
    """The raw floor of the job's backend, to pair with an asynchronous library's cycles."""
    library = by_key(job["library"])
    if library.role == "floor" or library.backend == "none":
        return None
    floor = by_key(f"raw-{library.backend}").build(Endpoint(**job["endpoint"]))
    assert isinstance(floor, AsyncAdapter)
    return floor


def _async(adapter: AsyncAdapter | SyncAdapter) -> AsyncAdapter:
    assert isinstance(adapter, AsyncAdapter)
    return adapter


def _sync(adapter: AsyncAdapter | SyncAdapter) -> SyncAdapter:
    assert isinstance(adapter, SyncAdapter)
    return adapter


async def _member(job: Job) -> dict[str, object]:
    """One process of ``contended_procs``: ready, then run between the given times."""

    async def body(a: AsyncAdapter | SyncAdapter) -> dict[str, object]:
        print("ready", flush=True)
        start, duration = map(float, (await asyncio.to_thread(sys.stdin.readline)).split())
        kw = {"workers": 1, "duration": duration, "section": job["section"], "ttl": job["ttl"],
              "start": start}  # fmt: skip
        if isinstance(a, AsyncAdapter):
            tally = await contended.run_async(a, job["name"], **kw)
        else:  # a blocking library: its one worker is a thread, as in its own cells
            tally = await asyncio.to_thread(contended.run_threads, a, job["name"], **kw)
        return tally.to_json()

    return await _with_adapter(job, body)


async def _storm_member(job: Job) -> dict[str, object]:
    """One process of the cancellation storm: ready, storm, report, then keep the client
    open until told to exit (what the storm left must still be there for the probe)."""
    adapter = _async(_build(job, session_timeout=job["session_timeout"]))
    await _opened(adapter)
    try:
        print("ready", flush=True)
        start, duration = map(float, (await asyncio.to_thread(sys.stdin.readline)).split())
        answer = await storm.member(adapter, job["name"], tasks=job["tasks"], start=start,
                                    duration=duration, ttl=job["ttl"])  # fmt: skip
        print(json.dumps(answer), flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # "exit"
        return answer
    finally:
        await _closed(adapter)


async def _holder(job: Job) -> None:
    """Take the lock, say so, and die without releasing it (``os._exit``: a crash)."""
    adapter = _build(job, session_timeout=job["session_timeout"])
    await _opened(adapter)
    # Keep the context manager referenced: a generator-based one that is collected runs its
    # `finally` (the release) -- which is exactly what a crash must not do.
    if isinstance(adapter, AsyncAdapter):
        held = adapter.hold(job["name"], ttl=job["ttl"])
        await held.__aenter__()
    else:
        kept = adapter.hold(job["name"], ttl=job["ttl"])
        kept.__enter__()
    print("held", flush=True)
    os._exit(0)


def _run(loop: str, coro: Coroutine[Any, Any, T]) -> T:
    with _runner(loop) as runner:
        return runner.run(coro)


def main(argv: list[str]) -> int:
    job: Job = json.loads(argv[1])
    mode = job.get("mode", "cell")
    loop = job.get("loop", "asyncio")
    if mode == "holder":
        _run(loop, _holder(job))
        return 1  # not reached: the holder exits without cleaning up
    if mode == "member":
        print(json.dumps(_run(loop, _member(job))), flush=True)
        return 0
    if mode == "storm-member":
        _run(loop, _storm_member(job))
        return 0
    started = time.perf_counter()
    try:
        metrics = _run(loop, _cell(job))
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(exc)).strip()
        traceback.print_exc(file=sys.stderr)
        print(json.dumps({"ok": False, "error": detail}), flush=True)
        return 0
    metrics["seconds"] = time.perf_counter() - started
    print(json.dumps({"ok": True, "metrics": metrics}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
