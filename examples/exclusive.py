"""``@locks.exclusive``: a coroutine function that never runs twice at once for one argument.

``build_report(day)`` must not run twice for the same day at the same time (two cron hosts,
a retry racing the original...), but reports of different days may run side by side. The
decorator names the lock from the call's arguments: ``"report:{day}"``. Run it::

    python examples/exclusive.py
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/exclusive.py

Four workers (each with its own client, as if in four processes) build the reports of two
days; it exits 0 when no day's report was ever built twice at once.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter

import aiodlock

URL = os.environ.get("AIODLOCK_URL", "memory://")
NAMESPACE = f"exclusive-example-{os.getpid()}"
running: Counter[str] = Counter()
overlaps: list[str] = []


async def worker(number: int) -> None:
    async with aiodlock.connect(URL, namespace=NAMESPACE) as locks:

        @locks.exclusive("report:{day}", timeout=10)
        async def build_report(day: str, *, pages: int = 3) -> None:
            running[day] += 1
            if running[day] > 1:
                overlaps.append(day)
            try:
                await asyncio.sleep(0.01 * pages)  # render the pages
            finally:
                running[day] -= 1
            print(f"worker {number}: built the report of {day}")

        await asyncio.gather(build_report("2024-06-01"), build_report("2024-06-02", pages=2))


async def main() -> int:
    async with asyncio.TaskGroup() as group:
        for number in range(4):
            group.create_task(worker(number))
    print("OK: no report was built twice at once" if not overlaps else f"FAILED: {overlaps}")
    return 0 if not overlaps else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
