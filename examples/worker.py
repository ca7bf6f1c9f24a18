"""Background workers that must not run the same job twice at once.

Four workers, each with its own client (as if each were a separate process), show three
patterns:

1. **Take turns** — ``locks.run_exclusive("nightly-report", build_report, ...)``: every worker
   wants to run the report; the lock runs them one at a time, each waiting its turn.
2. **Skip if busy** — ``async with locks.lock("cache-refresh", timeout=0.05)``: whoever gets
   the lock refreshes the cache; the others give up quickly (``LockTimeoutError``) and skip
   this round instead of refreshing again right after.
3. **Find out when the lock is lost** — a job that hangs past ``max_hold`` loses its lease:
   inside ``async with`` its body is cancelled and ``LockLostError`` is raised; a lease taken
   with ``acquire()`` sets ``lease.lost`` instead, which the job checks between steps.

Run it (finishes in about two seconds)::

    python examples/worker.py
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/worker.py

It exits 0 when no two workers ever ran a job at the same time and both loss cases were
reported, and 1 otherwise.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field

import aiodlock

URL = os.environ.get("AIODLOCK_URL", "memory://")
WORKERS = 4


@dataclass
class Job:
    """Who ran a job, and how many ran it at the same time (must never exceed 1)."""

    running: int = 0
    max_running: int = 0
    runs: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)

    async def run(self, worker: str, seconds: float) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(seconds)  # the work itself
        finally:
            self.running -= 1
        self.runs.append(worker)


# ---------------------------------------------------------------------- 1. take turns


async def build_report(worker: str, report: Job) -> None:
    await report.run(worker, 0.05)


async def report_worker(worker: str, report: Job) -> None:
    async with aiodlock.connect(URL, namespace="worker-example") as locks:
        for _ in range(2):
            await locks.run_exclusive("nightly-report", build_report, worker, report, timeout=5)


# ---------------------------------------------------------------------- 2. skip if busy


async def refresh_worker(worker: str, cache: Job, start: asyncio.Barrier) -> None:
    async with aiodlock.connect(URL, namespace="worker-example") as locks:
        await start.wait()  # everyone tries at the same moment, like a timer firing
        try:
            async with locks.lock("cache-refresh", timeout=0.05):
                await cache.run(worker, 0.2)
        except aiodlock.LockTimeoutError:
            cache.skips.append(worker)  # somebody else is refreshing: nothing to do


# ---------------------------------------------------------------------- 3. lease lost


async def hung_export(locks: aiodlock.LockClient) -> bool:
    """``async with``: the body is cancelled when the lease is lost; True if that happened."""
    finished = False
    try:
        # max_hold: the watchdog stops renewing after 0.4 s, so a hung job cannot keep the
        # lock forever. The lease then runs out (ttl) and the body below is cancelled.
        async with locks.lock("export", ttl=0.3, max_hold=0.4, timeout=5) as lease:
            print(f"export: holding the lock (fencing token {lease.fencing_token}), then hanging")
            await asyncio.sleep(30)  # stuck on a dead connection, say
            finished = True
    except aiodlock.LockLostError as exc:
        print(f"export: LockLostError, the job was cancelled: {exc}")
        return not finished
    return False


async def chunked_import(locks: aiodlock.LockClient) -> bool:
    """``acquire()``: check ``lease.lost`` between steps; True if the loss was seen."""
    lease = await locks.lock("import", ttl=0.3, max_hold=0.3).acquire(timeout=5)
    chunks = 0
    try:
        while chunks < 100:  # far more work than the lease allows
            if lease.lost.is_set():
                print(f"import: lease.lost is set after {chunks} chunks; stopping here")
                break
            await asyncio.sleep(0.05)  # one chunk of work
            chunks += 1
    finally:
        try:
            await lease.release()
        except aiodlock.LockNotOwnedError:
            print("import: release() says the lease was already lost (LockNotOwnedError)")
    return lease.lost.is_set() and chunks < 100


# ---------------------------------------------------------------------- main


async def main() -> int:
    names = [f"worker-{i}" for i in range(1, WORKERS + 1)]

    report = Job()
    async with asyncio.TaskGroup() as group:
        for name in names:
            group.create_task(report_worker(name, report))
    print(
        f"nightly-report: {len(report.runs)} runs ({', '.join(report.runs)}); "
        f"at most {report.max_running} at a time"
    )

    cache = Job()
    start = asyncio.Barrier(WORKERS)
    async with asyncio.TaskGroup() as group:
        for name in names:
            group.create_task(refresh_worker(name, cache, start))
    print(
        f"cache-refresh: ran by {', '.join(cache.runs) or 'nobody'}; "
        f"skipped by {', '.join(cache.skips) or 'nobody'}; at most {cache.max_running} at a time"
    )

    async with aiodlock.connect(URL, namespace="worker-example") as locks:
        export_cancelled = await hung_export(locks)
        import_stopped = await chunked_import(locks)

    ok = (
        report.max_running == 1
        and len(report.runs) == 2 * WORKERS
        and cache.max_running == 1
        and len(cache.runs) >= 1
        and export_cancelled
        and import_stopped
    )
    print("OK" if ok else "FAILED: a job overlapped, or a lost lease went unnoticed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
