"""Scenario 2: K workers in one process take turns on one lock, each holding it ``section`` s.

Runs for ``duration`` seconds. Throughput counts grants inside that window; the wait of every
acquisition started inside the window is recorded, including those granted after it closed
(leaving them out would flatter an unfair library). Efficiency = throughput * section (the
fraction of the window the lock was doing useful work; 1.0 is the ideal). Holders are counted
in-process, so an overlap of two holders here is reported as a violation. ``cpu_per_grant_us``
is the CPU time the workers' process(es) used from the start until the last worker finished
(``time.process_time``), per hold: what one grant costs the clients, apart from the servers.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise

from ..adapters.base import AsyncAdapter, SyncAdapter
from ..stats import summary_ms

__all__ = ["Tally", "run_async", "run_threads"]


@dataclass
class Tally:
    """What the workers of one run saw; merged across processes by :meth:`merge`."""

    start: float
    end: float
    grants: int = 0
    waits: list[float] = field(default_factory=list)
    inside: int = 0
    violations: int = 0
    stalled: bool = False
    # Every hold's (grant, end) on one monotonic clock: overlaps, and the handover between
    # one holder's end and the next holder's grant.
    holds: list[tuple[float, float]] = field(default_factory=list)
    per_process: list[int] = field(default_factory=list)
    # How long each critical section really took: a loop's timers may fire late or early.
    held: list[float] = field(default_factory=list)
    cpu: float = 0.0  # seconds of client CPU (every process's) over the run

    def result(self, section: float) -> dict[str, object]:
        throughput = self.grants / (self.end - self.start)
        out: dict[str, object] = {
            "grants": self.grants,
            "throughput": throughput,
            "efficiency": throughput * section,
            **{f"wait_{k}": v for k, v in summary_ms(self.waits).items()},
            "violations": self.violations + _overlaps(self.holds),
            "stalled": self.stalled,
            "hold_mean": summary_ms(self.held)["mean"],
            "handover_p50": summary_ms(_handovers(self.holds))["p50"],
            "cpu_per_grant_us": 1e6 * self.cpu / len(self.holds) if self.holds else math.nan,
        }
        if self.per_process:
            out["grants_min"] = min(self.per_process)
            out["grants_max"] = max(self.per_process)
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "grants": self.grants,
            "waits": self.waits,
            "stalled": self.stalled,
            "holds": self.holds,
            "held": self.held,
            "violations": self.violations,
            "cpu": self.cpu,
        }

    def merge(self, other: dict[str, object]) -> None:
        """Add one process's tally; holds of different processes are checked for overlaps."""
        grants, waits, holds = other["grants"], other["waits"], other["holds"]
        assert isinstance(grants, int)
        assert isinstance(waits, list)
        assert isinstance(holds, list)
        self.grants += grants
        self.per_process.append(grants)
        self.waits.extend(waits)
        self.holds.extend((float(a), float(b)) for a, b in holds)
        held = other.get("held", [])
        assert isinstance(held, list)
        self.held.extend(float(h) for h in held)
        self.violations += int(other["violations"])  # type: ignore[call-overload]
        self.stalled = self.stalled or bool(other["stalled"])
        self.cpu += float(other.get("cpu", 0.0))  # type: ignore[arg-type]


def _handovers(holds: list[tuple[float, float]]) -> list[float]:
    """From each hold's end to the next hold's grant: the lock's idle time per grant, which
    the library costs (what ``sleep`` and the loop cost shows in the hold time instead)."""
    ordered = sorted(holds)
    return [b[0] - a[1] for a, b in pairwise(ordered) if b[0] >= a[1]]


def _overlaps(holds: list[tuple[float, float]]) -> int:
    """How many holds began before an earlier one ended (one shared monotonic clock).

    Each hold is recorded inside the lock (after the grant, before the release), so an
    overlap here is two holders at once, not a measurement artefact.
    """
    count, latest_end = 0, float("-inf")
    for begin, end in sorted(holds):
        if begin < latest_end:
            count += 1
        latest_end = max(latest_end, end)
    return count


async def run_async(
    adapter: AsyncAdapter,
    name: str,
    *,
    workers: int,
    duration: float,
    section: float,
    ttl: float,
    start: float | None = None,
    grace: float = 10.0,
) -> Tally:
    """``workers`` tasks from ``start`` (default: now) for ``duration`` seconds."""
    clock = time.perf_counter
    begin = clock() if start is None else start
    tally = Tally(begin, begin + duration)

    async def worker() -> None:
        while (requested := clock()) < tally.end:
            async with adapter.hold(name, ttl=ttl):
                granted = clock()
                tally.inside += 1
                if tally.inside > 1:
                    tally.violations += 1
                tally.waits.append(granted - requested)
                if granted < tally.end:
                    tally.grants += 1
                await asyncio.sleep(section)
                tally.inside -= 1
                ended = clock()
                tally.held.append(ended - granted)
                tally.holds.append((granted, ended))

    if begin > clock():
        await asyncio.sleep(begin - clock())
    cpu = time.process_time()
    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, tally.end - clock()) + grace)
    for task in pending:
        task.cancel()
    tally.stalled = bool(pending)
    await asyncio.gather(*tasks, return_exceptions=True)
    tally.cpu = time.process_time() - cpu
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return tally


def run_threads(
    adapter: SyncAdapter,
    name: str,
    *,
    workers: int,
    duration: float,
    section: float,
    ttl: float,
    start: float | None = None,
    grace: float = 10.0,
) -> Tally:
    """``workers`` threads from ``start`` (default: now) for ``duration`` seconds (daemon
    threads: a stall cannot hang us)."""
    clock = time.perf_counter
    begin = clock() if start is None else start
    tally = Tally(begin, begin + duration)
    guard = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while (requested := clock()) < tally.end:
                with adapter.hold(name, ttl=ttl):
                    granted = clock()
                    with guard:
                        tally.inside += 1
                        if tally.inside > 1:
                            tally.violations += 1
                        tally.waits.append(granted - requested)
                        if granted < tally.end:
                            tally.grants += 1
                    time.sleep(section)
                    ended = clock()
                    with guard:
                        tally.inside -= 1
                        tally.held.append(ended - granted)
                        tally.holds.append((granted, ended))
        except BaseException as exc:
            errors.append(exc)

    if begin > clock():
        time.sleep(begin - clock())
    cpu = time.process_time()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, tally.end + grace - clock()))
    tally.stalled = any(thread.is_alive() for thread in threads)
    tally.cpu = time.process_time() - cpu
    if errors:
        raise errors[0]
    return tally
