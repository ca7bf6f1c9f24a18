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
        *_zookeeper(find, loops),
        *_mysql(find, loops),
        *_postgres(find, loops),
    ]
    # A backend that was not run (--only) or a row that failed has nothing to check.
    return [e for e in entries if e["met"] is not None or "nan" not in str(e["measured"])]


def _entry(target: str, subject: str, value: str, ok: bool | None) -> dict[str, object]:
    return {"target": target, "subject": subject, "measured": value, "met": ok}


def _uncontended(find: Finder, library: str, floor: str, loop: str, label: str,
                 backend: str) -> dict[str, object]:
    row = find(library, "uncontended", loop)
    mine, raw, ratio = _num(row, "p50"), _num(row, "floor_p50"), _num(row, "ratio_p50")
    if math.isnan(ratio):  # not paired: the floor's own cell
        raw = _num(find(floor, "uncontended", loop), "p50")
        ratio = mine / raw
    return _entry(f"{backend} uncontended ≤ 1.15{TIMES} raw floor (p50, paired)",
                  f"{label} [{loop}]",
                  f"{ratio:.2f}{TIMES} ({mine:.3f} vs {raw:.3f} ms)", None if math.isnan(ratio)
                  else ratio <= 1.15)  # fmt: skip


_REDIS_INCUMBENTS = ("redis-py", "python-redis-lock", "pottery-sync", "pottery-async", "aioredlock")


def _incumbent_best(find: Finder, incumbents: tuple[str, ...], field: str,
                    loop: str) -> tuple[float, str]:
    best, who = -math.inf, ""
    for key in incumbents:
        for cell_loop in (loop, "asyncio", "threads"):
            value = _num(find(key, "contended", cell_loop), field)
            if not math.isnan(value):
                if value > best:
                    best, who = value, key
                break
    return best, who


def _redis(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    variants = (("aiodlock-redis-pubsub", "pub/sub"), ("aiodlock-redis-blpop", "blpop"))
    for loop in loops:
        for key, label in variants:
            yield _uncontended(find, key, "raw-redis", loop, f"aiodlock {label}", "Redis")
    for loop in loops:
        for key, label in variants:
            row = find(key, "contended", loop)
            eff = _num(row, "efficiency")
            best, who = _incumbent_best(find, _REDIS_INCUMBENTS, "throughput", loop)
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


def _mysql(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    for loop in loops:
        yield _uncontended(find, "aiodlock-mysql", "raw-mysql", loop, "aiodlock mysql", "MySQL")


def _postgres(find: Finder, loops: list[str]) -> Iterator[dict[str, object]]:
    for loop in loops:
        yield _uncontended(find, "aiodlock-postgres", "raw-postgres", loop, "aiodlock postgres",
                           "PostgreSQL")  # fmt: skip
