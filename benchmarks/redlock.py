"""Redlock(3), uncontended: aiodlock ``redlock://`` beside pottery's ``AIORedlock`` and
aioredlock, on the same three independent redis-server masters, with the floor they share.

Run from the repository root (a separate script for now; not yet a row of ``run.py``)::

    python benchmarks/redlock.py [--cycles 2000] [--loop asyncio|uvloop]

The floor is what any Redlock acquire + release costs at least: the acquire script fanned out
to the three masters in parallel and awaited until the slowest of a quorum (two) answered,
then the release script likewise (two quorum round trips, as the single-node floor is SET NX
PX + EVALSHA). aiodlock adds one more quorum round trip: the fencing token's write.
The cycles alternate in blocks of 100 (floor, then each library), in one process and event
loop, so a busy neighbour slows every row alike; the report gives p50/p99 in milliseconds and
each p50 as a multiple of the floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiodlock  # noqa: E402
from tests.servers import RedisServer  # noqa: E402

BLOCK = 100


def _ms(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return (
        statistics.median(values) * 1e3,
        values[min(len(values) - 1, int(len(values) * 0.99))] * 1e3,
    )


async def _floor(masters: list[Any]) -> Callable[[], Awaitable[None]]:
    from aiodlock.backends import Kind, LockSpec
    from aiodlock.backends.redis import _scripts as lua
    from aiodlock.backends.redis._keys import keys_for
    from aiodlock.backends.redis._redlock_rounds import acquire_call, release_call

    for r in masters:
        await lua.load_all(r)
    stragglers: list[asyncio.Future[Any]] = []

    async def quorum(futures: list[asyncio.Future[Any]]) -> None:
        for done, fut in enumerate(asyncio.as_completed(futures), start=1):
            await fut
            if done == len(futures) // 2 + 1:
                break
        stragglers.extend(futures)

    async def once() -> None:
        # The third master's replies of the last cycle (long done by now).
        await asyncio.gather(*stragglers)
        stragglers.clear()
        # The library's own scripts, keys and arguments: the floor moves with them.
        spec = LockSpec("floor", uuid.uuid4().hex, Kind.MUTEX)
        keys = keys_for(spec.namespace, spec.name)
        script, script_keys, args = acquire_call(
            spec, keys, "o", 1000, client_id="c", fence_ms=1000, identity=b"bench"
        )
        await quorum(
            [asyncio.ensure_future(lua.run(r, script, script_keys, *args)) for r in masters]
        )
        script, script_keys, args = release_call(spec, keys)
        await quorum(
            [
                asyncio.ensure_future(lua.run(r, script, script_keys, "o", "p", *args))
                for r in masters
            ]
        )

    return once


@contextlib.asynccontextmanager
async def _libraries(
    servers: list[RedisServer],
) -> AsyncIterator[dict[str, Callable[[], Awaitable[None]]]]:
    import redis.asyncio as aioredis

    url = "redlock://" + ",".join(f"{s.host}:{s.port}" for s in servers) + "/0"
    rows: dict[str, Callable[[], Awaitable[None]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        raws = [aioredis.Redis(host=s.host, port=s.port) for s in servers]
        for r in raws:
            stack.push_async_callback(r.aclose)
        rows["floor: acquire + release, 2 quorum RTTs"] = await _floor(raws)
        locks = await stack.enter_async_context(aiodlock.connect(url, namespace="bench"))

        async def aiodlock_cycle() -> None:
            async with locks.lock("uncontended", ttl=10):
                pass

        rows["aiodlock redlock://"] = aiodlock_cycle
        try:
            from pottery import AIORedlock

            async def pottery_cycle() -> None:
                async with AIORedlock(key="uncontended", masters=set(raws), auto_release_time=10):
                    pass

            rows["pottery AIORedlock"] = pottery_cycle
        except ImportError as exc:
            print(f"pottery unavailable: {exc}")
        try:
            from aioredlock import Aioredlock  # type: ignore[import-untyped]

            manager = Aioredlock([{"host": s.host, "port": s.port} for s in servers])
            stack.push_async_callback(manager.destroy)

            async def aioredlock_cycle() -> None:
                lock = await manager.lock("uncontended-ar", lock_timeout=10)
                await manager.unlock(lock)

            rows["aioredlock"] = aioredlock_cycle
        except Exception as exc:  # aioredis 1.x may fail to import on a new Python
            print(f"aioredlock unavailable: {type(exc).__name__}: {exc}")
        yield rows


async def measure(servers: list[RedisServer], cycles: int) -> dict[str, list[float]]:
    clock = time.perf_counter
    async with _libraries(servers) as rows:
        for run in rows.values():  # warm up: connections, scripts
            for _ in range(20):
                await run()
        latencies: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(max(1, cycles // BLOCK)):
            for name, run in rows.items():
                for _ in range(BLOCK):
                    start = clock()
                    await run()
                    latencies[name].append(clock() - start)
        return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(RedisServer()) for _ in range(3)]
        if args.loop == "uvloop":
            import uvloop

            results = uvloop.run(measure(servers, args.cycles))
        else:
            results = asyncio.run(measure(servers, args.cycles))
    floor = _ms(next(iter(results.values())))[0]
    print(f"Redlock(3) uncontended acquire+release, {args.loop}, {args.cycles} cycles each")
    print(f"{'row':45} {'p50 ms':>8} {'p99 ms':>8} {'p50/floor':>10}")
    for name, values in results.items():
        p50, p99 = _ms(values)
        print(f"{name:45} {p50:8.3f} {p99:8.3f} {p50 / floor:10.2f}")


if __name__ == "__main__":
    main()
