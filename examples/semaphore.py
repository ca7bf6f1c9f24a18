"""A distributed semaphore: at most 3 calls to a partner API at once, across all processes.

Ten tasks, each with its own client (as if each were a separate process), call a slow API
under ``locks.semaphore("api", limit=3)``. The program prints the highest number of calls
that were ever in flight together: 3, never more — and not fewer, or it would be a mutex.

Run it::

    python examples/semaphore.py
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/semaphore.py

It exits 0 when the maximum concurrency observed equals the limit, and 1 otherwise.
"""

from __future__ import annotations

import asyncio
import os
import sys

import aiodlock

URL = os.environ.get("AIODLOCK_URL", "memory://")
LIMIT = 3
CALLS = 10


class Meter:
    """Counts the calls in flight and remembers the most ever seen at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0

    async def call_api(self) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.05)  # the partner API is slow
        finally:
            self.in_flight -= 1


async def caller(meter: Meter) -> None:
    async with (
        aiodlock.connect(URL, namespace="semaphore-example") as locks,
        locks.semaphore("api", limit=LIMIT, timeout=10),
    ):
        await meter.call_api()


async def main() -> int:
    meter = Meter()
    async with asyncio.TaskGroup() as group:
        for _ in range(CALLS):
            group.create_task(caller(meter))
    print(f"{CALLS} calls with limit={LIMIT}: max concurrency observed: {meter.most}")
    if meter.most != LIMIT:
        print(f"FAILED: expected exactly {LIMIT} calls in flight at the busiest moment")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
