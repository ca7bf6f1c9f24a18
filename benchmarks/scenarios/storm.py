"""Scenario 6: a cancellation storm. K processes of T tasks each loop on one lock for
``duration`` seconds; every acquisition is cut off by a timeout drawn from 0-50 ms at whatever
await point it reached (queueing, listing, watching, waiting, holding, releasing), and a
granted task holds the lock 0-2 ms.

This process starts K members (``python -m benchmarks.worker`` in ``storm-member`` mode), gives
them one start on the shared monotonic clock, and counts their grants. The members keep their
clients open after the storm, so what a cancelled acquisition left behind is still there:
then this process asks for the lock with a client of its own, and *free after* is how long
that took (it must be within the lease, and it is short when the storm left nothing). Every
hold's start and end are compared across processes: more holders at once than the lock allows
is a violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Mapping

from ..adapters.base import AsyncAdapter

__all__ = ["member", "run"]

_READY_TIMEOUT = 60.0
_CUT_OFF = 0.05  # the longest timeout an acquisition is given
_HOLD = 0.002  # the longest hold
_PAST_LEASE = 1.0  # how long past the lease the probe waits for the lock
_LINE_LIMIT = 1 << 26  # a member's answer is one line with every hold: thousands of them


async def member(
    adapter: AsyncAdapter, name: str, *, tasks: int, start: float, duration: float, ttl: float
) -> dict[str, object]:
    """``tasks`` tasks of one process, from ``start`` for ``duration`` seconds."""
    clock = time.perf_counter
    end = start + duration
    holds: list[tuple[float, float]] = []

    async def contender() -> None:
        while clock() < end:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(random.uniform(0, _CUT_OFF)):
                    async with adapter.hold(name, ttl=ttl):
                        granted = clock()
                        try:
                            await asyncio.sleep(random.uniform(0, _HOLD))
                        finally:
                            if granted < end:
                                holds.append((granted, clock()))

    await asyncio.sleep(max(0.0, start - clock()))
    cpu = time.process_time()
    async with asyncio.TaskGroup() as group:
        for _ in range(tasks):
            group.create_task(contender())
    return {"holds": holds, "cpu": time.process_time() - cpu}


async def run(
    job: Mapping[str, object],
    adapter: AsyncAdapter,
    *,
    processes: int,
    tasks: int,
    duration: float,
    ttl: float,
) -> dict[str, object]:
    """The storm across ``processes`` members, then one acquisition of ``adapter``'s."""
    spec = {**job, "mode": "storm-member", "tasks": tasks, "ttl": ttl}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.worker",
            json.dumps(spec),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_LINE_LIMIT,
        )
        for _ in range(processes)
    ]
    try:
        for proc in procs:
            if (await _line(proc)) != "ready":
                raise RuntimeError("a storm member did not start")
        start = time.perf_counter() + 0.2
        for proc in procs:
            await _say(proc, f"{start!r} {duration!r}")
        answers = [json.loads(await _line(proc)) for proc in procs]
        # The members' clients are still open: what the storm left behind is still there.
        asked = time.perf_counter()
        free_after = ttl + _PAST_LEASE  # not free within it: shown as this, and missed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ttl + _PAST_LEASE):
                async with adapter.hold(str(job["name"]), ttl=ttl):
                    free_after = time.perf_counter() - asked
        for proc in procs:
            await _say(proc, "exit")
        for proc in procs:
            async with asyncio.timeout(_READY_TIMEOUT):
                if await proc.wait() != 0:
                    raise RuntimeError(f"a storm member failed (exit {proc.returncode})")
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    grants = [len(a["holds"]) for a in answers]
    holds = [(float(b), float(e)) for a in answers for b, e in a["holds"]]
    return {
        "processes": processes,
        "tasks": tasks,
        "grants": sum(grants),
        "grants_min": min(grants),
        "grants_max": max(grants),
        "throughput": sum(grants) / duration,
        "free_after_ms": 1000 * free_after,
        "lease_ms": 1000 * ttl,
        "violations": _excess(holds, adapter.holders),
        # No grant, no figure (the CPU went somewhere, but not into grants).
        "cpu_per_grant_us": 1e6 * sum(float(a["cpu"]) for a in answers) / len(holds)
        if holds
        else None,
    }


async def _line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(_READY_TIMEOUT):  # a member that hangs fails the cell
        line = await proc.stdout.readline()
    return line.decode().strip()


async def _say(proc: asyncio.subprocess.Process, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line.encode() + b"\n")
    await proc.stdin.drain()


def _excess(holds: list[tuple[float, float]], limit: int) -> int:
    """How many holds began while ``limit`` others were held (one shared monotonic clock)."""
    # At one instant an end sorts before a start: a handover is not an overlap.
    events = sorted([(b, 1) for b, _ in holds] + [(e, -1) for _, e in holds])
    count = inside = 0
    for _, step in events:
        inside += step
        if step == 1 and inside > limit:
            count += 1
    return count
