"""The performance issue's targets (issue 35), checked against one run's medians (never used
to tune anything)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

TIMES = "\N{MULTIPLICATION SIGN}"

__all__ = ["ROWS", "check"]

_REDIS_INCUMBENTS = ("redis-py", "python-redis-lock", "pottery-sync", "pottery-async", "aioredlock")
_REDLOCK_INCUMBENTS = ("pottery-async-redlock", "pottery-sync-redlock", "aioredlock-redlock")
_ZOOKEEPER_INCUMBENTS = ("aiozk", "kazoo")

ROWS: frozenset[tuple[str, str]] = frozenset(
    {
        ("aiodlock-redlock", "uncontended"),
        *((key, "contended_procs") for key in ("aiodlock-redlock", *_REDLOCK_INCUMBENTS)),
        *(
            (f"{key}{suffix}", scenario)
            for key in ("aiodlock-zookeeper", *_ZOOKEEPER_INCUMBENTS)
            for suffix in ("", "-ensemble")
            for scenario in ("contended", "contended_procs")
        ),
        *(
            (key, "contended")
            for key in ("fenced-asyncio-lock", "aiodlock-redis-pubsub", "aiodlock-redis-blpop")
        ),
        *(
            (key, "contended_procs")
            for key in (
                "aiodlock-redis-pubsub",
                "aiodlock-redis-fair",
                "pubsub-baton",
                *_REDIS_INCUMBENTS,
            )
        ),
        *(
            (f"{kind}-{backend}", "uncontended")
            for kind in ("aiodlock", "fenced-floor")
            for backend in ("mysql", "postgres")
        ),
        *(
            (f"aiodlock-zookeeper{variant}", "storm")
            for variant in ("", "-fair", "-semaphore")
        ),
    }
)
"""The cells (library, scenario) the targets read: what ``--quick`` runs."""

Row = Mapping[str, Any]
Finder = Callable[[str, str, str], Row | None]


def _num(row: Row | None, field: str) -> float:
    if row is None:
        return math.nan
    value = row["median"].get(field)
    return float(value) if isinstance(value, int | float) else math.nan


def check(
    results: Sequence[Row], loops: list[str], *, seconds: float | None = None, quick: bool = False
) -> list[dict[str, object]]:
    """One entry per (target, subject): what was measured and whether it meets the target
    (``seconds``: the run's length, checked when it was a ``--quick`` run)."""
    table = {(r["library"], r["scenario"], r["loop"]): r for r in results if r["median"]}

    def find(library: str, scenario: str, loop: str) -> Row | None:
        return table.get((library, scenario, loop))

    entries = [
        *_redlock(find, loops),
        *_zookeeper(find, loops),
        *_redis(find, loops),
        *_processes(find, loops),
        *_sql(find, loops),
        *_storm(find, loops),
        *_quick(seconds, quick),
    ]
    # A backend that was not run (--only) or a row that failed has nothing to check.
    return [e for e in entries if e["met"] is not None or "nan" not in str(e["measured"])]


def _ratio(a: float, b: float) -> float:
    """``a / b``, NaN when either is missing or ``b`` is 0 (a row that failed)."""
    return a / b if b and not math.isnan(b) else math.nan


def _quick(seconds: float | None, quick: bool) -> Iterator[dict[str, object]]:
    if quick and seconds is not None:
        yield _entry("nox -s bench -- --quick ≤ 5 minutes", "the whole run",
                     f"{seconds:.0f} s", seconds <= 300)  # fmt: skip


def _entry(target: str, subject: str, value: str, ok: bool | None) -> dict[str, object]:
    return {"target": target, "subject": subject, "measured": value, "met": ok}


def _uncontended(find: Finder, library: str, floor: str, loop: str, label: str,
                 backend: str, limit: float = 1.15) -> dict[str, object]:
    row = find(library, "uncontended", loop)
    mine, raw, ratio = _num(row, "p50"), _num(row, "floor_p50"), _num(row, "ratio_p50")
    if math.isnan(ratio):  # not paired: the floor's own cell
        raw = _num(find(floor, "uncontended", loop), "p50")
        ratio = mine / raw
    # The same commands with a fencing token taken in the acquire's round trip, where measured.
    fenced = _num(find(floor.replace("raw-", "fenced-floor-", 1), "uncontended", loop),
                  "ratio_p50")
    also = "" if math.isnan(fenced) else f"; fenced floor {fenced:.2f}{TIMES}"
    cpu = _num(row, "cpu_ratio")  # the client's own CPU per cycle, paired with the floor's
    if not math.isnan(cpu):
        also += f"; client CPU {cpu:.2f}{TIMES} the floor's"
    return _entry(f"{backend} uncontended ≤ {limit:g}{TIMES} raw floor (p50, paired)",
                  f"{label} [{loop}]",
                  f"{ratio:.2f}{TIMES} ({mine:.3f} vs {raw:.3f} ms{also})",
                  None if math.isnan(ratio) else ratio <= limit)  # fmt: skip


def _incumbent_best(find: Finder, incumbents: tuple[str, ...], field: str, loop: str,
                    scenario: str = "contended") -> tuple[float, str, Row | None]:
    """The best value of ``field`` among the incumbents, whose it is, and its row (each
    incumbent's row on ``loop``, else where it ran: asyncio, or threads)."""
    best, who, found = -math.inf, "", None
    for key in incumbents:
        for cell_loop in (loop, "asyncio", "threads"):
            row = find(key, scenario, cell_loop)
            value = _num(row, field)
            if not math.isnan(value):
                if value > best:
                    best, who, found = value, key, row
                break
    return best, who, found


def _served(row: Row | None) -> str:
    """What a processes row's throughput came with: how evenly the processes were served
    (fewest to most grants) and the longest wait. A lock that lets its holder take it back
    while others wait is faster, and starves processes; this says which it was."""
    low, high = _num(row, "grants_min"), _num(row, "grants_max")
    spread = "" if math.isnan(low) else f"{low:.0f} to {high:.0f} grants per process, "
    return f"{spread}wait max {_num(row, 'wait_max'):,.0f} ms"


def _redis(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    """Redis in one process: ≥ 0.9 of the fencing ceiling (asyncio.Lock + one INCR a grant)."""
    for loop in loops:
        fenced_row = find("fenced-asyncio-lock", "contended", loop)
        ceiling = _num(fenced_row, "throughput")
        for key, label in (("aiodlock-redis-pubsub", "pub/sub"), ("aiodlock-redis-blpop", "blpop")):
            row = find(key, "contended", loop)
            thr = _num(row, "throughput")
            share = _ratio(thr, ceiling)
            yield _entry("Redis in one process (10 tasks, 1 ms): ≥ 0.9 of the fencing ceiling",
                         f"aiodlock {label} [{loop}]",
                         f"{share:.2f} ({thr:.0f} vs {ceiling:.0f}/s; client CPU per grant "
                         f"{_num(row, 'cpu_per_grant_us'):.0f} vs "
                         f"{_num(fenced_row, 'cpu_per_grant_us'):.0f} µs)",
                         None if math.isnan(share) else share >= 0.9)  # fmt: skip


def _processes(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    """Redis across 10 processes (the processes scenario runs on the first loop)."""
    loop = loops[0]
    row = find("aiodlock-redis-pubsub", "contended_procs", loop)
    thr, worst = _num(row, "throughput"), _num(row, "wait_max")
    best, who, theirs = _incumbent_best(find, _REDIS_INCUMBENTS, "throughput", loop,
                                        "contended_procs")  # fmt: skip
    ok = None if math.isnan(thr) else thr >= best and worst <= 250
    cpu, their_cpu = _num(row, "cpu_per_grant_us"), _num(theirs, "cpu_per_grant_us")
    baton_row = find("pubsub-baton", "contended_procs", loop)
    # The baton serves every process in turn: no lock that does so can pass it.
    ceiling = _num(baton_row, "throughput")
    fair = "" if math.isnan(ceiling) else f"; the fair ceiling (baton) {ceiling:.0f}/s"
    yield _entry("Redis across 10 processes: ≥ the best incumbent, wait max ≤ 250 ms",
                 f"aiodlock pub/sub [{loop}]",
                 f"{thr:.0f}/s ({_served(row)}) vs {who} {best:.0f}/s ({_served(theirs)})"
                 f"{fair}; client CPU per grant {cpu:.0f} vs {their_cpu:.0f} µs",
                 ok)  # fmt: skip
    row = find("aiodlock-redis-fair", "contended_procs", loop)
    eff, worst = _num(row, "efficiency"), _num(row, "wait_max")
    baton = _num(baton_row, "efficiency")
    share = _ratio(eff, baton)
    yield _entry("Redis fair=True across 10 processes: ≥ 0.9 of the baton ceiling, "
                 "wait max ≤ 60 ms", f"aiodlock fair [{loop}]",
                 f"{share:.2f} ({eff:.0%} vs the baton's {baton:.0%}); max {worst:.0f} ms",
                 None if math.isnan(share) else share >= 0.9 and worst <= 60)  # fmt: skip


def _redlock(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    for loop in loops:
        yield _uncontended(find, "aiodlock-redlock", "raw-redlock", loop, "aiodlock redlock",
                           "Redlock(3)", 1.3)  # fmt: skip
    loop = loops[0]
    row = find("aiodlock-redlock", "contended_procs", loop)
    thr, cpu = _num(row, "throughput"), _num(row, "cpu_per_grant_us")
    best, who, theirs = _incumbent_best(find, _REDLOCK_INCUMBENTS, "throughput", loop,
                                        "contended_procs")  # fmt: skip
    yield _entry("Redlock(3) across 10 processes: ahead of pottery and aioredlock",
                 f"aiodlock redlock [{loop}]",
                 f"{thr:.0f}/s ({_served(row)}) vs {who} {best:.0f}/s ({_served(theirs)})",
                 None if math.isnan(thr) else thr > best)  # fmt: skip
    single = _num(find("aiodlock-redis-pubsub", "contended_procs", loop), "cpu_per_grant_us")
    yield _entry("Redlock(3) across 10 processes: client CPU per grant ≤ 2" + TIMES
                 + " the single-Redis lock's", f"aiodlock redlock [{loop}]",
                 f"{_ratio(cpu, single):.1f}{TIMES} ({cpu:.0f} vs {single:.0f} µs)",
                 None if math.isnan(_ratio(cpu, single)) else cpu <= 2 * single)  # fmt: skip


def _zookeeper(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    """Ahead of aiozk and kazoo in every contended row: one process and 10 processes,
    standalone and the 3-node ensemble."""
    for suffix, label in (("", "standalone"), ("-ensemble", "ensemble")):
        incumbents = tuple(f"{key}{suffix}" for key in _ZOOKEEPER_INCUMBENTS)
        for scenario, what, cell_loops in (("contended", "10 tasks in one process", loops),
                                           ("contended_procs", "10 processes", loops[:1])):
            for loop in cell_loops:
                row = find(f"aiodlock-zookeeper{suffix}", scenario, loop)
                thr = _num(row, "throughput")
                best, who, theirs = _incumbent_best(find, incumbents, "throughput", loop,
                                                    scenario)  # fmt: skip
                if math.isinf(best):
                    continue  # no incumbent row of this kind (aiozk skips some on the ensemble)
                measured = f"{thr:.0f}/s vs {who} {best:.0f}/s"
                if scenario == "contended_procs":
                    measured = (f"{thr:.0f}/s ({_served(row)}) vs {who} {best:.0f}/s "
                                f"({_served(theirs)})")  # fmt: skip
                yield _entry(f"ZooKeeper {label}, {what}: ahead of aiozk and kazoo",
                             f"aiodlock zookeeper{suffix} [{loop}]", measured,
                             None if math.isnan(thr) else thr > best)  # fmt: skip


def _sql(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    """Uncontended at most 1.15 times the fenced floor (the same statements with the token
    taken in the grant's round trip), both loops: each cell's p50 is paired with the raw
    floor's, so the two ratios divide."""
    for backend, label in (("mysql", "MySQL"), ("postgres", "PostgreSQL")):
        for loop in loops:
            mine = _num(find(f"aiodlock-{backend}", "uncontended", loop), "ratio_p50")
            fenced = _num(find(f"fenced-floor-{backend}", "uncontended", loop), "ratio_p50")
            ratio = _ratio(mine, fenced)
            cpu = _num(find(f"aiodlock-{backend}", "uncontended", loop), "cpu_ratio")
            yield _entry(f"{label} uncontended ≤ 1.15{TIMES} the fenced floor (p50)",
                         f"aiodlock {backend} [{loop}]",
                         f"{ratio:.2f}{TIMES} ({mine:.2f}{TIMES} raw floor, fenced floor "
                         f"{fenced:.2f}{TIMES}; client CPU {cpu:.2f}{TIMES} the raw floor's)",
                         None if math.isnan(ratio) else ratio <= 1.15)  # fmt: skip


def _storm(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    """ZooKeeper under the cancellation storm: ≥ 300 grants in 10 s (30/s) for the mutex and
    the semaphore, free again within the lease; ``fair=True`` within 2x of the unfair mutex."""
    loop = loops[0]
    rows = {variant: find(f"aiodlock-zookeeper{variant}", "storm", loop)
            for variant in ("", "-semaphore", "-fair")}  # fmt: skip
    for variant, label in (("", "mutex"), ("-semaphore", "semaphore, limit 3")):
        row = rows[variant]
        thr, free = _num(row, "throughput"), _num(row, "free_after_ms")
        ok = thr >= 30 and _num(row, "violations") == 0 and free < _num(row, "lease_ms")
        yield _entry("ZooKeeper cancellation storm: ≥ 300 grants in 10 s, free again within "
                     "the lease", f"aiodlock zookeeper {label} [{loop}]",
                     f"{thr * 10:.0f} per 10 s ({_num(row, 'grants'):.0f} grants, "
                     f"{_num(row, 'grants_min'):.0f} to {_num(row, 'grants_max'):.0f} per "
                     f"process); free after {free:.0f} ms; overlaps "
                     f"{_num(row, 'violations'):.0f}",
                     None if math.isnan(thr) else ok)  # fmt: skip
    fair, unfair = _num(rows["-fair"], "throughput"), _num(rows[""], "throughput")
    share = _ratio(fair, unfair)
    yield _entry("ZooKeeper cancellation storm: fair=True within 2" + TIMES
                 + " of the unfair mutex", f"aiodlock zookeeper fair=True [{loop}]",
                 f"{share:.2f} of the unfair mutex's grants ({fair * 10:.0f} vs "
                 f"{unfair * 10:.0f} per 10 s); free after "
                 f"{_num(rows['-fair'], 'free_after_ms'):.0f} ms",
                 None if math.isnan(share) else share >= 0.5)  # fmt: skip
