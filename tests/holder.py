"""A lock holder in its own process, driven by tests/test_processes.py.

    python -m tests.holder hold URL NAMESPACE NAME TTL
        acquire, print "acquired <token>", then keep working until the lease is lost:
        print "lost" and exit 3 (exit 0 is never expected: the parent stops or kills us).
    python -m tests.holder count URL NAMESPACE NAME ROUNDS COUNTER_FILE
        ROUNDS times: under the lock, read the number in COUNTER_FILE, sleep, write it + 1;
        print each hold as a JSON line (aiodlock.testing.Hold) for the parent's history check.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

import aiodlock
from aiodlock.testing import History


async def hold(url: str, namespace: str, name: str, ttl: float) -> int:
    async with aiodlock.connect(url, namespace=namespace) as locks:
        try:
            async with locks.lock(name, ttl=ttl) as lease:
                print(f"acquired {lease.fencing_token}", flush=True)
                await asyncio.Event().wait()  # "work" until the lease is lost
        except aiodlock.LockLostError as exc:
            print(f"lost {exc}", flush=True)
    return 3


async def count(url: str, namespace: str, name: str, rounds: int, path: str) -> int:
    history = History()
    counter = Path(path)
    async with aiodlock.connect(url, namespace=namespace) as locks:
        for _ in range(rounds):
            async with locks.lock(name, timeout=30) as lease:
                with history.hold(f"pid{os.getpid()}", lease.fencing_token):
                    value = int(counter.read_text() or 0) if counter.exists() else 0
                    await asyncio.sleep(random.uniform(0, 0.003))
                    counter.write_text(str(value + 1))
    for record in history.holds:
        print(record.to_json(), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if os.environ.get("AIODLOCK_TEST_LOOP") == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    mode, url, namespace, name, *rest = argv
    if mode == "hold":
        return asyncio.run(hold(url, namespace, name, float(rest[0])))
    return asyncio.run(count(url, namespace, name, int(rest[0]), rest[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
