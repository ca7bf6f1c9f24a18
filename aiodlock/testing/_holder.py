"""A lock holder in a process of its own, driven by the conformance suite's process tests.

    python -m aiodlock.testing._holder LOOP URL OPTIONS NAMESPACE hold NAME TTL
        acquire, print "acquired <token>", then keep working until the lease is lost:
        print "lost ..." and exit 3 (exit 0 is never expected: the parent stops or kills us).
    python -m aiodlock.testing._holder LOOP URL OPTIONS NAMESPACE write NAME TTL
        acquire, print "acquired <token>", then every 10 ms check ``lease.assert_held()`` and
        print "wrote <time.monotonic()>" (a write the resource would accept) until the lease
        is lost: print "lost ..." and exit 3.
    python -m aiodlock.testing._holder LOOP URL OPTIONS NAMESPACE count NAME ROUNDS FILE
        ROUNDS times: under the lock, read the number in FILE, sleep, write it + 1; print
        each hold as a JSON line (aiodlock.testing.Hold) for the parent's history check.

LOOP is ``asyncio`` or ``uvloop`` (the parent's loop); OPTIONS is a JSON object of extra
``aiodlock.connect()`` options.
"""

# ruff: noqa: ASYNC240 - a tiny test program: its counter file is meant to be read and written
# in the middle of the critical section, blocking and all

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiodlock

from ._history import History


async def hold(locks: aiodlock.LockClient, name: str, ttl: float) -> int:
    try:
        async with locks.lock(name, ttl=ttl) as lease:
            print(f"acquired {lease.fencing_token}", flush=True)
            await asyncio.Event().wait()  # "work" until the lease is lost
    except aiodlock.LockLostError as exc:
        print(f"lost {exc}", flush=True)
    return 3


async def write(locks: aiodlock.LockClient, name: str, ttl: float) -> int:
    try:
        async with locks.lock(name, ttl=ttl) as lease:
            print(f"acquired {lease.fencing_token}", flush=True)
            while True:
                await asyncio.sleep(0.01)
                lease.assert_held()  # what a careful holder does right before each write
                print(f"wrote {time.monotonic()}", flush=True)
    except aiodlock.LockLostError as exc:
        print(f"lost {exc}", flush=True)
    return 3


async def count(locks: aiodlock.LockClient, name: str, rounds: int, path: str) -> int:
    history = History()
    counter = Path(path)
    for _ in range(rounds):
        async with locks.lock(name, timeout=30) as lease:
            with history.hold(f"pid{os.getpid()}", lease.fencing_token):
                value = int(counter.read_text() or 0) if counter.exists() else 0
                await asyncio.sleep(random.uniform(0, 0.003))
                counter.write_text(str(value + 1))
    for record in history.holds:
        print(record.to_json(), flush=True)
    return 0


async def run(url: str, options: dict[str, Any], namespace: str, mode: str, rest: list[str]) -> int:
    async with aiodlock.connect(url, namespace=namespace, **options) as locks:
        if mode == "hold":
            return await hold(locks, rest[0], float(rest[1]))
        if mode == "write":
            return await write(locks, rest[0], float(rest[1]))
        return await count(locks, rest[0], int(rest[1]), rest[2])


def main(argv: list[str]) -> int:
    loop, url, options, namespace, mode, *rest = argv
    if mode not in ("hold", "write", "count"):
        raise SystemExit(f"unknown mode {mode!r}")
    coro = run(url, json.loads(options), namespace, mode, rest)
    if loop == "uvloop":
        import uvloop

        return int(uvloop.run(coro))
    return asyncio.run(coro)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
