"""Scenario 1: one caller, acquire + release of a free lock, cycle after cycle.

Given the raw floor too (asynchronous libraries), the cycles alternate in blocks of
``BLOCK``: floor, library, floor, library... in the same process and event loop, so both see
the same machine at the same moments, and ``ratio_p50`` / ``ratio_mean`` compare them paired.
A busy neighbour on a shared machine then slows both alike instead of skewing the ratio.
"""

from __future__ import annotations

import math
import time

from ..adapters.base import AsyncAdapter, SyncAdapter
from ..stats import summary_ms

__all__ = ["BLOCK", "run_async", "run_sync"]

BLOCK = 100


def _result(latencies: list[float]) -> dict[str, object]:
    stats = summary_ms(latencies)
    return {**stats, "per_second": 1e3 / stats["mean"] if stats["mean"] else 0.0}


async def _cycles(adapter: AsyncAdapter, name: str, count: int, ttl: float) -> list[float]:
    clock = time.perf_counter
    latencies = []
    for _ in range(count):
        start = clock()
        async with adapter.hold(name, ttl=ttl):
            pass
        latencies.append(clock() - start)
    return latencies


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
        await _cycles(adapter, name, warmup, ttl)
        return _result(await _cycles(adapter, name, cycles, ttl))
    await _cycles(floor, f"{name}-floor", warmup, ttl)
    await _cycles(adapter, name, warmup, ttl)
    mine: list[float] = []
    theirs: list[float] = []
    for _ in range(math.ceil(cycles / BLOCK)):
        theirs += await _cycles(floor, f"{name}-floor", BLOCK, ttl)
        mine += await _cycles(adapter, name, BLOCK, ttl)
    result, base = _result(mine), summary_ms(theirs)
    return {
        **result,
        "floor_p50": base["p50"],
        "floor_mean": base["mean"],
        "ratio_p50": result["p50"] / base["p50"],  # type: ignore[operator]
        "ratio_mean": result["mean"] / base["mean"],  # type: ignore[operator]
    }


def run_sync(
    adapter: SyncAdapter, name: str, *, cycles: int, warmup: int, ttl: float
) -> dict[str, object]:
    clock = time.perf_counter
    latencies = []
    for i in range(warmup + cycles):
        start = clock()
        with adapter.hold(name, ttl=ttl):
            pass
        if i >= warmup:
            latencies.append(clock() - start)
    return _result(latencies)
