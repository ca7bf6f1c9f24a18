"""The issue's targets, checked against one run's medians (never used to tune anything)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

TIMES = "\N{MULTIPLICATION SIGN}"

__all__ = ["check"]

Row = Mapping[str, Any]
Finder = Callable[[str, str, str], Row | None]


def _num(row: Row | None, field: str) -> float:
    if row is None:
        return math.nan
    value = row["median"].get(field)
    return float(value) if isinstance(value, int | float) else math.nan


def check(results: Sequence[Row], loops: list[str]) -> list[dict[str, object]]:
    """One entry per (target, subject): what was measured and whether it meets the target."""
    table = {(r["library"], r["scenario"], r["loop"]): r for r in results if r["median"]}

    def find(library: str, scenario: str, loop: str) -> Row | None:
        return table.get((library, scenario, loop))

    entries = [
        *_redis(find, loops),
        *_processes(find, loops),
        *_ceiling(find, loops),
        *_redlock(find, loops),
        *_zookeeper(find, loops),
        *_etcd(find, loops),
        *_mysql(find, loops),
        *_postgres(find, loops),
    ]
    # A backend that was not run (--only) or a row that failed has nothing to check.
    return [e for e in entries if e["met"] is not None or "nan" not in str(e["measured"])]


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


_REDIS_INCUMBENTS = ("redis-py", "python-redis-lock", "pottery-sync", "pottery-async", "aioredlock")


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


def _redis(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    variants = (("aiodlock-redis-pubsub", "pub/sub"), ("aiodlock-redis-blpop", "blpop"))
    for loop in loops:
        for key, label in variants:
            yield _uncontended(find, key, "raw-redis", loop, f"aiodlock {label}", "Redis")
    for loop in loops:
        for key, label in variants:
            row = find(key, "contended", loop)
            eff = _num(row, "efficiency")
            best, who, _ = _incumbent_best(find, _REDIS_INCUMBENTS, "throughput", loop)
            thr = _num(row, "throughput")
            ok = None if math.isnan(eff) else eff >= 0.85 and thr > best
            yield _entry(
                "Redis contended efficiency ≥ 85 % (10 tasks, 1 ms), ahead of every incumbent",
                f"aiodlock {label} [{loop}]",
                f"{eff:.0%}; {thr:.0f}/s vs best incumbent {who} {best:.0f}/s",
                ok,
            )
    for loop in loops:
        conns = _num(find("aiodlock-redis-pubsub", "waiters", loop), "connections")
        yield _entry("Redis 1000 waiters with ≤ 3 connections (pub/sub)",
                     f"aiodlock pub/sub [{loop}]", f"{conns:.0f} connections",
                     None if math.isnan(conns) else conns <= 3)  # fmt: skip
    for loop in loops:
        for key, label in variants:
            row = find(key, "handoff", loop)
            worst = _num(row, "handoff_max")
            yield _entry("Redis expiry handoff within 10 ms of the key's expiry (worst trial)",
                         f"aiodlock {label} [{loop}]",
                         f"p50 {_num(row, 'handoff_p50'):.1f} ms, max {worst:.1f} ms",
                         None if math.isnan(worst) else worst <= 10.0)  # fmt: skip


def _zookeeper(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    for loop in loops:
        thr = _num(find("aiodlock-zookeeper", "contended", loop), "throughput")
        others = {key: _num(find(key, "contended", lp), "throughput")
                  for key, lp in (("aiozk", loops[0]), ("kazoo", "threads"))}  # fmt: skip
        best = max(others.values())
        ok = None if math.isnan(thr) or math.isnan(best) else thr >= 2 * best
        shown = ", ".join(f"{k} {v:.0f}/s" for k, v in others.items())
        yield _entry(f"ZooKeeper contended throughput ≥ 2{TIMES} aiozk and kazoo",
                     f"aiodlock zookeeper [{loop}]", f"{thr:.0f}/s vs {shown}", ok)  # fmt: skip
    for loop in loops:
        yield _uncontended(find, "aiodlock-zookeeper", "raw-zookeeper", loop,
                           "aiodlock zookeeper", "ZooKeeper")  # fmt: skip
    for loop in loops:
        row = find("aiodlock-zookeeper", "waiters", loop)
        drain = _num(row, "drain_s")
        done = bool(row and row["median"].get("complete"))
        yield _entry("ZooKeeper 1000 waiters drain ≤ 2 s", f"aiodlock zookeeper [{loop}]",
                     f"{drain:.2f} s" if done else f"incomplete after {drain:.1f} s",
                     None if math.isnan(drain) else done and drain <= 2.0)  # fmt: skip


def _mysql(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    for loop in loops:
        yield _uncontended(find, "aiodlock-mysql", "raw-mysql", loop, "aiodlock mysql", "MySQL")


def _postgres(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    for loop in loops:
        yield _uncontended(find, "aiodlock-postgres", "raw-postgres", loop, "aiodlock postgres",
                           "PostgreSQL")  # fmt: skip


def _processes(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    """Issue 9's cross-process targets (the processes scenario runs on the first loop)."""
    loop = loops[0]
    row = find("aiodlock-redis-pubsub", "contended_procs", loop)
    thr, worst = _num(row, "throughput"), _num(row, "wait_max")
    low, grants = _num(row, "grants_min"), _num(row, "grants")
    processes = _num(row, "processes")
    fairest = low / (grants / processes) if grants > 0 else math.nan  # NaN stays NaN
    best, who, theirs = _incumbent_best(find, _REDIS_INCUMBENTS, "throughput", loop,
                                        "contended_procs")
    ok = None if math.isnan(thr) else thr >= best and worst <= 500 and fairest >= 0.25
    cpu, their_cpu = _num(row, "cpu_per_grant_us"), _num(theirs, "cpu_per_grant_us")
    yield _entry("Redis across 10 processes: grants/s ≥ best incumbent, wait max ≤ 500 ms, "
                 "no process below 25 % of the mean", f"aiodlock pub/sub [{loop}]",
                 f"{thr:.0f}/s vs {who} {best:.0f}/s; max {worst:.0f} ms; "
                 f"min/mean {fairest:.2f}; client CPU per grant {cpu:.0f} vs {their_cpu:.0f} µs",
                 ok)  # fmt: skip
    row = find("aiodlock-redis-fair", "contended_procs", loop)
    eff, worst = _num(row, "efficiency"), _num(row, "wait_max")
    baton = _num(find("pubsub-baton", "contended_procs", loop), "efficiency")
    yield _entry("Redis fair=True across 10 processes: efficiency ≥ 70 %, wait max ≤ 60 ms",
                 f"aiodlock fair [{loop}]", f"{eff:.0%}; max {worst:.0f} ms "
                 f"(the one-message handover ceiling here: {baton:.0%})",
                 None if math.isnan(eff) else eff >= 0.70 and worst <= 60)  # fmt: skip


def _ceiling(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    """In one process, 10 tasks: ≥ 85 % of asyncio.Lock's grants per second (beside each, the
    share of that ceiling left once each grant pays one fencing write on that server)."""
    subjects = (("aiodlock-redis-pubsub", "Redis", "fenced-asyncio-lock"),
                ("aiodlock-zookeeper", "ZooKeeper", "fenced-asyncio-lock-zookeeper"),
                ("aiodlock-mysql", "MySQL", "fenced-asyncio-lock-mysql"))  # fmt: skip
    for loop in loops:
        ceiling = _num(find("asyncio-lock", "contended", loop), "throughput")
        for key, label, fenced_key in subjects:
            row = find(key, "contended", loop)
            thr = _num(row, "throughput")
            share = thr / ceiling
            fenced_row = find(fenced_key, "contended", loop)
            fenced = _num(fenced_row, "throughput") / ceiling
            also = "" if math.isnan(fenced) else f"; with one fencing write per grant: {fenced:.0%}"
            cpu = _num(row, "cpu_per_grant_us")
            if not math.isnan(cpu):  # one loop does it all: its CPU per grant bounds grants/s
                also += (f"; client CPU per grant {cpu:.0f} µs, "
                         f"that ceiling's {_num(fenced_row, 'cpu_per_grant_us'):.0f} µs")
            yield _entry("in one process (10 tasks, 1 ms): ≥ 85 % of the asyncio.Lock ceiling",
                         f"aiodlock {label} [{loop}]",
                         f"{share:.0%} ({thr:.0f} vs {ceiling:.0f}/s{also})",
                         None if math.isnan(share) else share >= 0.85)  # fmt: skip


_REDLOCK_INCUMBENTS = ("pottery-async-redlock", "pottery-sync-redlock", "aioredlock-redlock")
# (scenario, metric, True when larger is better)
# (Waiters: how many of them were granted within the drain timeout, which tells the
# libraries apart where none drains them all.)
_REDLOCK_ROWS = (("uncontended", "p50", False), ("contended", "throughput", True),
                 ("contended_procs", "throughput", True), ("waiters", "drained", True),
                 ("handoff", "handoff_p50", False))  # fmt: skip


def _redlock(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    for loop in loops:
        yield _uncontended(find, "aiodlock-redlock", "raw-redlock", loop, "aiodlock redlock",
                           "Redlock(3)", 1.3)  # fmt: skip
    loop = loops[0]
    for scenario, metric, larger in _REDLOCK_ROWS:
        mine = _num(find("aiodlock-redlock", scenario, loop), metric)
        theirs = {}
        for key in _REDLOCK_INCUMBENTS:
            for cell_loop in (loop, "threads"):
                value = _num(find(key, scenario, cell_loop), metric)
                if not math.isnan(value):
                    theirs[key] = value
                    break
        if not theirs:
            continue
        best = max(theirs.values()) if larger else min(theirs.values())
        ok = None if math.isnan(mine) else (mine > best if larger else mine < best)
        if scenario == "waiters" and mine == best:  # all drained: the faster one is ahead
            drains = {k: _num(find(k, scenario, lp), "drain_s") for k, lp in
                      ((k, loop) for k in _REDLOCK_INCUMBENTS)}  # fmt: skip
            own = _num(find("aiodlock-redlock", scenario, loop), "drain_s")
            ok = all(own < d for d in drains.values() if not math.isnan(d))
        shown = ", ".join(f"{k} {v:.3g}" for k, v in theirs.items())
        yield _entry(f"Redlock(3) {scenario}: ahead of pottery and aioredlock ({metric})",
                     f"aiodlock redlock [{loop}]", f"{mine:.3g} vs {shown}", ok)  # fmt: skip


def _etcd(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    for loop in loops:
        yield _uncontended(find, "aiodlock-etcd", "raw-etcd", loop, "aiodlock etcd", "etcd",
                           1.2)  # fmt: skip
