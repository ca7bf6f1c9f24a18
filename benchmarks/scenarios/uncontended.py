"""Scenario 1: one caller, acquire + release of a free lock, cycle after cycle.

Given the raw floor too (asynchronous libraries), the cycles alternate in blocks of
``BLOCK``: floor, library, floor, library... in the same process and event loop, so both see
the same machine at the same moments, and ``ratio_p50`` / ``ratio_mean`` compare them paired.
A busy neighbour on a shared machine then slows both alike instead of skewing the ratio.

``cpu_us`` is the client's own CPU time per cycle (``time.process_time``: this process, user
and system), and ``cpu_ratio`` the same paired against the floor's: the part of a cycle the
library itself computes, apart from the time it waits for the server. Where a machine halts
an idle CPU between request and reply (virtual machines do), the wall-clock ratio also
carries that wake-up, which differs from cycle to cycle; the CPU figures carry at most the
part of it charged to the process (a busy host's steal can inflate both alike, so compare
the ratio, not the absolute CPU).
"""

from __future__ import annotations

import math
import time

from ..adapters.base import AsyncAdapter, SyncAdapter
from ..stats import summary_ms

__all__ = ["BLOCK", "run_async", "run_sync"]

BLOCK = 100


def _result(latencies: list[float], cpu: float) -> dict[str, object]:
    stats = summary_ms(latencies)
    return {
        **stats,
        "per_second": 1e3 / stats["mean"] if stats["mean"] else 0.0,
        "cpu_us": 1e6 * cpu / len(latencies),
    }


async def _cycles(
    adapter: AsyncAdapter, name: str, count: int, ttl: float, latencies: list[float]
) -> float:
    """Run ``count`` cycles, appending each one's latency; return the CPU time they took."""
    clock = time.perf_counter
    cpu = time.process_time()
    for _ in range(count):
        start = clock()
        async with adapter.hold(name, ttl=ttl):
            pass
        latencies.append(clock() - start)
    return time.process_time() - cpu


async def run_async(
    adapter: AsyncAdapter,
    name: str,
    *,
    cycles: int,
    warmup: int,
    ttl: float,
    floor: AsyncAdapter | None = None,
) -> dict[str, object]:
    if floor is None:
        await _cycles(adapter, name, warmup, ttl, [])
        latencies: list[float] = []
        return _result(latencies, await _cycles(adapter, name, cycles, ttl, latencies))
    await _cycles(floor, f"{name}-floor", warmup, ttl, [])
    await _cycles(adapter, name, warmup, ttl, [])
    mine: list[float] = []
    theirs: list[float] = []
    my_cpu = their_cpu = 0.0
    for _ in range(math.ceil(cycles / BLOCK)):
        their_cpu += await _cycles(floor, f"{name}-floor", BLOCK, ttl, theirs)
        my_cpu += await _cycles(adapter, name, BLOCK, ttl, mine)
    result, base = _result(mine, my_cpu), _result(theirs, their_cpu)
    return {
        **result,
        "floor_p50": base["p50"],
        "floor_mean": base["mean"],
        "floor_cpu_us": base["cpu_us"],
        "ratio_p50": result["p50"] / base["p50"],  # type: ignore[operator]
        "ratio_mean": result["mean"] / base["mean"],  # type: ignore[operator]
        "cpu_ratio": my_cpu / their_cpu if their_cpu else math.nan,
    }


def run_sync(
    adapter: SyncAdapter, name: str, *, cycles: int, warmup: int, ttl: float
) -> dict[str, object]:
    clock = time.perf_counter
    latencies = []
    cpu = 0.0
    for i in range(warmup + cycles):
        if i == warmup:
            cpu = time.process_time()
        start = clock()
        with adapter.hold(name, ttl=ttl):
            pass
        if i >= warmup:
            latencies.append(clock() - start)
    return _result(latencies, time.process_time() - cpu)
