"""The results document (JSON) and its Markdown rendering."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import machine, targets
from .adapters import Library
from .config import Settings
from .servers import Server
from .stats import median_of

__all__ = ["brief", "build", "markdown", "rerender", "summary"]

Doc = Mapping[str, Any]
TIMES = "\N{MULTIPLICATION SIGN}"
DASH = "\N{EN DASH}"
ROLE_ORDER = {"floor": 0, "aiodlock": 1, "incumbent": 2, "reference": 3}
BACKEND_TITLES = {
    "redis": "Redis",
    "redis-cluster": "Redis Cluster",
    "redis-sentinel": "Redis Sentinel",
    "redlock": "Redlock (3 masters)",
    "zookeeper": "ZooKeeper",
    "zookeeper-ensemble": "ZooKeeper ensemble (3 nodes)",
    "etcd": "etcd",
    "mysql": "MySQL (MariaDB)",
    "postgres": "PostgreSQL",
}


def brief(answer: Mapping[str, object]) -> str:
    """One line for the progress log."""
    if not answer.get("ok"):
        return f"ERROR {answer.get('error')}"
    m = answer["metrics"]
    assert isinstance(m, dict)
    if "p50" in m:
        return f"p50 {m['p50']:.3f} ms  p99 {m['p99']:.3f} ms"
    if "free_after_ms" in m:
        return (f"{m['grants']} grants ({m['throughput']:.0f}/s)  free after "
                f"{m['free_after_ms']:.0f} ms  overlaps {m['violations']}")  # fmt: skip
    if "throughput" in m:
        return f"{m['throughput']:.0f}/s  wait p99 {m['wait_p99']:.1f} ms"
    if "connections" in m:
        return (f"{m['connections']} conns  {m['rss_mib']:.1f} MiB  "
                f"{m['drained']} drained in {m['drain_s']:.2f} s")  # fmt: skip
    if "handoff_p50" in m:
        return f"handoff p50 {m['handoff_p50']:.1f} ms  max {m['handoff_max']:.1f} ms"
    return str(m)


def _clean(value: Any) -> Any:
    """JSON has no NaN: None instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def build(
    cells: Sequence[tuple[Library, str, str]],
    runs: Mapping[tuple[str, str, str], list[dict[str, object]]],
    servers: Mapping[str, Server],
    settings: Settings,
    *,
    loops: list[str],
    seconds: float,
    quick: bool,
    load_before: float,
) -> dict[str, Any]:
    libraries = {lib.key: lib for lib, _, _ in cells}
    results = []
    for library, scenario, loop in cells:
        answers = runs.get((library.key, scenario, loop), [])
        good = [a["metrics"] for a in answers if a.get("ok")]
        results.append({
            "library": library.key,
            "scenario": scenario,
            "loop": loop,
            "runs": len(good),
            "errors": sorted({str(a.get("error")) for a in answers if not a.get("ok")}),
            "median": median_of([m for m in good if isinstance(m, dict)]),
        })
    dists = [d for lib in libraries.values() for d in lib.distributions]
    document = {
        "generated_by": "python benchmarks/run.py" + (" --quick" if quick else ""),
        "quick": quick,
        "machine": {**machine.describe(), "load_average_1m_before": round(load_before, 2)},
        "servers": {b: {"version": s.version, "error": s.error} for b, s in servers.items()},
        "versions": machine.versions([*dists, "uvloop"]),
        "libraries": {
            k: {
                "label": lib.label,
                "backend": lib.backend,
                "role": lib.role,
                "asynchronous": lib.asynchronous,
                "distributions": list(lib.distributions),
            }
            for k, lib in libraries.items()
        },
        "settings": settings.params(),
        "loops": loops,
        "total_seconds": round(seconds, 1),
        "results": results,
        "targets": targets.check(results, loops, seconds=seconds, quick=quick),
    }
    return dict(_clean(document))


# ---------------------------------------------------------------------- Markdown


def _f(value: Any, digits: int = 2, suffix: str = "") -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return DASH
    return f"{value:,.{digits}f}{suffix}"


def _rows(doc: Doc, backend: str, scenario: str) -> list[Mapping[str, Any]]:
    libs = doc["libraries"]
    rows = [r for r in doc["results"] if r["scenario"] == scenario
            and libs[r["library"]]["backend"] in (backend, "none")]  # fmt: skip
    return sorted(rows, key=lambda r: ROLE_ORDER[libs[r["library"]]["role"]])


def _label(doc: Doc, row: Mapping[str, Any]) -> str:
    lib = doc["libraries"][row["library"]]
    label = str(lib["label"])
    if row["scenario"] == "contended_procs":
        label += f" — {doc['settings']['workers']} processes"
    return f"**{label}**" if lib["role"] == "aiodlock" else label


def _failed(row: Mapping[str, Any]) -> str:
    return "failed: " + "; ".join(row["errors"])[:160] if row["errors"] else "no result"


def _table(header: Sequence[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out) + "\n"


def _section(
    doc: Doc,
    rows: list[Mapping[str, Any]],
    header: Sequence[str],
    cells: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]],
) -> str:
    """One table: a line per row, its library and loop, then ``cells(row, medians)`` (or
    why the row has no result)."""
    lines = []
    for r in rows:
        m = r["median"]
        rest = cells(r, m) if m else [_failed(r), *[""] * (len(header) - 3)]
        lines.append([_label(doc, r), r["loop"], *rest])
    return _table(header, lines)


def _floor_p50(doc: Doc, backend: str, loop: str) -> float:
    for r in doc["results"]:
        lib = doc["libraries"][r["library"]]
        if (
            lib["role"] == "floor"
            and lib["backend"] == backend
            and r["scenario"] == "uncontended"
            and (r["loop"] == loop or loop == "threads")
        ):
            value = r["median"].get("p50")
            if isinstance(value, int | float):
                return float(value)
    return math.nan


def _uncontended(doc: Doc, backend: str) -> str:
    def cells(r: Mapping[str, Any], m: Mapping[str, Any]) -> list[str]:
        if isinstance(m.get("ratio_p50"), int | float):
            ratio = _f(m["ratio_p50"], 2, TIMES)  # paired with the floor in the same process
        else:
            ratio = _f(m["p50"] / _floor_p50(doc, backend, r["loop"]), 2, TIMES + " *")
        cpu_ratio = _f(m["cpu_ratio"], 2, TIMES) if "cpu_ratio" in m else ""
        return [_f(m["p50"], 3), _f(m["p99"], 3), _f(m["per_second"], 0), ratio,
                _f(m.get("cpu_us", math.nan), 0), cpu_ratio]  # fmt: skip

    return _section(doc, _rows(doc, backend, "uncontended"),
                    ["library", "loop", "p50 ms", "p99 ms", "cycles/s", "p50 ÷ raw floor",
                     "client CPU µs", "CPU ÷ raw floor's"], cells)  # fmt: skip


def _contended(doc: Doc, backend: str) -> str:
    def cells(_: Mapping[str, Any], m: Mapping[str, Any]) -> list[str]:
        stall = " (stalled)" if m.get("stalled") else ""
        spread = ""
        if "grants_min" in m:
            spread = f"{_f(m['grants_min'], 0)} to {_f(m['grants_max'], 0)}"
        return [_f(m["throughput"], 0) + stall, _f(m["efficiency"] * 100, 0, " %"),
                _f(m.get("hold_mean", math.nan), 2), _f(m.get("handover_p50", math.nan), 3),
                _f(m.get("cpu_per_grant_us", math.nan), 0),
                _f(m["wait_p50"], 1), _f(m["wait_p99"], 1), _f(m["wait_max"], 1), spread,
                str(int(m["violations"])) if m.get("violations") else "0"]  # fmt: skip

    rows = _rows(doc, backend, "contended") + _rows(doc, backend, "contended_procs")
    return _section(doc, rows,
                    ["library", "loop", "grants/s", "efficiency", "hold ms", "handover p50 ms",
                     "client CPU µs per grant", "wait p50 ms", "wait p99 ms", "wait max ms",
                     "grants per process", "overlaps"], cells)  # fmt: skip


def _waiters(doc: Doc, backend: str) -> str:
    def cells(_: Mapping[str, Any], m: Mapping[str, Any]) -> list[str]:
        done = f"{m['drained']:.0f}/{m['waiters']:.0f}"
        drain = _f(m["drain_s"], 2) if m.get("complete") else f"> {_f(m['drain_s'], 0)}"
        return [_f(m["connections"], 0), _f(m["rss_mib"], 1), done, drain]

    return _section(doc, _rows(doc, backend, "waiters"),
                    ["library", "loop", "connections", "RSS MiB", "drained", "drain s"],
                    cells)  # fmt: skip


def _handoff(doc: Doc, backend: str) -> str:
    def cells(_: Mapping[str, Any], m: Mapping[str, Any]) -> list[str]:
        return [_f(m["handoff_p50"], 1), _f(m["handoff_max"], 1),
                f"± {_f(m['uncertainty_ms'], 1)}"]  # fmt: skip

    return _section(doc, _rows(doc, backend, "handoff"),
                    ["library", "loop", "p50 ms", "max ms", "measurement ±ms"],
                    cells)  # fmt: skip


def _storm(doc: Doc, backend: str) -> str:
    def cells(_: Mapping[str, Any], m: Mapping[str, Any]) -> list[str]:
        return [_f(m["grants"], 0), _f(m["throughput"], 0),
                f"{_f(m['grants_min'], 0)} to {_f(m['grants_max'], 0)}",
                _f(m["free_after_ms"], 1), _f(m["violations"], 0),
                _f(m["cpu_per_grant_us"], 0)]  # fmt: skip

    return _section(doc, _rows(doc, backend, "storm"),
                    ["library", "loop", "grants", "grants/s", "grants per process",
                     "free after ms", "overlaps", "client CPU µs per grant"],
                    cells)  # fmt: skip


def _versus(doc: Doc, backend: str) -> str:
    """aiodlock ÷ each incumbent, same run: the headline ratios."""
    libs = doc["libraries"]
    mine = [k for k, v in libs.items() if v["role"] == "aiodlock" and v["backend"] == backend]
    theirs = [k for k, v in libs.items() if v["role"] == "incumbent" and v["backend"] == backend]
    if not mine or not theirs:
        return "No incumbent library is measured here: the raw floor is the comparison.\n"
    cell = {(r["library"], r["scenario"], r["loop"]): r["median"] for r in doc["results"]}

    def value(key: str, scenario: str, field: str, loop: str) -> float:
        for lp in (loop, doc["loops"][0], "threads"):
            m = cell.get((key, scenario, lp))
            if not m or not isinstance(m.get(field), int | float):
                continue
            if scenario == "uncontended":  # in units of the raw floor: paired where possible
                if isinstance(m.get("ratio_p50"), int | float):
                    return float(m["ratio_p50"])
                return float(m[field]) / _floor_p50(doc, backend, lp)
            return float(m[field])
        return math.nan

    metrics = [
        ("uncontended", "p50", False,
         "uncontended p50 latency: incumbent ÷ aiodlock (each first divided by the raw floor "
         "of its own cell)"),
        ("contended", "throughput", True, "contended throughput: aiodlock ÷ incumbent"),
        ("contended", "wait_p99", False, "contended p99 wait: incumbent ÷ aiodlock"),
        ("handoff", "handoff_p50", False, "expiry/crash handoff p50: incumbent ÷ aiodlock"),
    ]
    parts = ["Ratios from the same run; **> 1 means aiodlock is better**. Incumbents run on "
             f"`{doc['loops'][0]}` (or threads).\n"]  # fmt: skip
    for scenario, field, higher_better, title in metrics:
        lines = []
        for key in mine:
            for loop in doc["loops"]:
                a = value(key, scenario, field, loop)
                if math.isnan(a):
                    continue
                ratios = []
                for other in theirs:
                    b = value(other, scenario, field, loop)
                    ratios.append(_f(a / b if higher_better else b / a, 2, TIMES))
                lines.append([f"{libs[key]['label']} [{loop}]", *ratios])
        if lines:
            header = ["aiodlock", *(libs[t]["label"] for t in theirs)]
            parts.append(f"*{title}*\n\n" + _table(header, lines))
    return "\n".join(parts)


def _targets(doc: Doc) -> str:
    mark = {True: "✅ met", False: "❌ missed", None: DASH}
    lines = [[t["target"], t["subject"], t["measured"], mark[t["met"]]] for t in doc["targets"]]
    return _table(["target", "subject", "measured (median of runs)", ""], lines)


def _storm_reading(s: Mapping[str, Any]) -> list[str]:
    """How to read the storm's table (nothing for a page measured before it existed)."""
    if "storm_processes" not in s:
        return []
    return [
        f"- **Cancellation storm** (aiodlock only: the incumbents have no comparable "
        f"recipe under cancellation): {s['storm_processes']} processes of "
        f"{s['storm_tasks']} tasks each loop on one lock for {s['storm_duration']:g} s (lease "
        f"{s['storm_ttl']:g} s; ZooKeeper session timeout {s['storm_session_timeout']:g} s); "
        "every acquisition is cut off by a timeout drawn from 0-50 ms at whatever await point "
        "it reached, and a granted task holds the lock 0-2 ms. *Free after*: with the storm's "
        "clients still open, how long a fresh client then took to get the lock (what a "
        "cancelled acquisition left behind would hold it up to the lease). *Overlaps*: more "
        "holders at once than the lock allows (must be 0).",
    ]


def markdown(doc: Doc) -> str:
    s, mach = doc["settings"], doc["machine"]
    out = [
        "# Benchmarks: aiodlock beside the incumbent lock libraries\n",
        f"Generated by `{doc['generated_by']}` on {mach['date']} in {doc['total_seconds']:.0f} s"
        + (" — **a --quick smoke run: small samples, read with care**." if doc["quick"] else ".")
        + f" Every number is the median of {s['repeat']} interleaved run(s); ratios compare "
        "cells of the same run, on the same servers.\n",
        "## The machine\n",
        _table(["", ""], [
            ["CPU", f"{mach['cpu']} — {mach['cores']} cores, {mach['memory_gib']} GiB"],
            ["OS / Python", f"{mach['os']} / {mach['python']}"],
            ["load average (1 min)", f"{mach['load_average_1m_before']} before the run, "
             f"{mach['load_average_1m']} after (above {mach['cores']}: other work competed)"],
            *([b, v["version"] or f"not started: {v['error']}"] for b, v in doc["servers"].items()),
            *([["raw floors against the previous page", _drift(doc["floor_drift"])]]
              if doc.get("floor_drift") else []),
            ["libraries", ", ".join(f"{k} {v}" for k, v in doc["versions"].items())],
        ]),
        "Client and servers share the machine's cores, and other work may run beside them: "
        "absolute times are noisy, the ratios within one run less so.\n",
        "## How to read this\n",
        f"- **Uncontended**: one task acquires and releases a free lock {s['cycles']} times "
        f"(after {s['warmup']} warm-up cycles); latency of one acquire + release. "
        "*p50 ÷ raw floor* compares with the same server commands sent by the same client "
        "with no library (Redis: `SET NX PX` + compare-and-delete `EVALSHA`, redis-py set up "
        "as aiodlock sets it up, through `RedisCluster` on a Cluster and on the master the "
        "sentinels name; Redlock: the same two commands sent to the three masters at once, "
        "each awaited until a quorum answered; ZooKeeper: create + get_children + delete "
        "with aiozk; etcd: a transaction putting the key if absent and listing the name's "
        "keys, then a delete, on aetcd's gRPC stubs; MySQL: "
        "`GET_LOCK` + `RELEASE_LOCK` with aiomysql; PostgreSQL: `pg_try_advisory_lock` + "
        "`pg_advisory_unlock` with asyncpg), same loop. For asyncio libraries the "
        "ratio is *paired*: the same process alternates blocks of 100 floor cycles and 100 "
        "library cycles, so both see the same machine at the same moments; a ratio marked * "
        "(blocking libraries, in a thread) compares separate cells instead. A *fenced floor* "
        "(Redis, MySQL, PostgreSQL) is the raw floor with a fencing token taken in the "
        "acquire's own round trip (Redis: `SET NX PX` and the token in one script; MySQL: "
        "`GET_LOCK` as the condition of the token's `INSERT ... ON DUPLICATE KEY UPDATE` on "
        "an InnoDB table; PostgreSQL: `pg_try_advisory_lock` and the token's `INSERT ... ON "
        "CONFLICT` in one statement): the least any lock that fences every grant sends. "
        "*Client CPU* is the measuring process's own CPU time per cycle (user + system, "
        "`time.process_time`), and *CPU ÷ raw floor's* the same paired with the floor's "
        "blocks: what the library computes, apart from waiting for the server. Where the "
        "machine halts an idle CPU while a reply is on its way (virtual machines do), the "
        "wall-clock ratio also carries that wake-up, which varies from cell to cell; the "
        "CPU figures carry at most the part of it charged to the process (a busy host's "
        "steal inflates both alike: compare the ratio, not the absolute CPU).",
        f"- **Contended**: {s['workers']} workers (asyncio tasks in one process; threads for "
        f"blocking libraries; the *processes* rows: {s['workers']} processes with one task "
        "(or thread) each, the case a distributed lock exists for) loop on one lock for "
        f"{s['duration']:g} s, holding it "
        f"`sleep({s['section'] * 1000:g} ms)`. *Efficiency* = grants/s {TIMES} 1 ms (100 % = "
        "the lock is never idle). The *asyncio.Lock* row is the in-process ceiling: what "
        "`sleep(1 ms)` and the event loop allow on this machine; *asyncio.Lock + one fencing "
        "write per grant* (Redis `INCR`, ZooKeeper `setData`, MySQL the token's upsert) is "
        "that ceiling for a lock that gives every grant a fencing token (one write to the "
        "server per grant, nothing else); the *baton* processes row is "
        "the ceiling of a fair handover across processes: a baton passed round them by "
        "`PUBLISH`, one message per handover and no lock state. *Hold* is how long that "
        "`sleep` really took inside the lock (mean): asyncio's selector waits in whole "
        "milliseconds, so a library whose replies wake the loop during the sleep stretches "
        "it (the rest is rounded up to 1 ms), and so does its CPU work run in the same loop "
        "step as the sleep began, while uvloop's timers may fire early; compare "
        "grants/s together with it. *Handover* is the lock's idle time per grant, from one "
        "holder's end to the next holder's grant (median): what the library itself costs a "
        "contended lock. *Client CPU per grant*: the CPU time of the workers' process (all "
        "of them, in the processes rows) from the start until the last worker finished, "
        "divided by the holds: in one process one event loop does all of it, so it bounds "
        "the grants per second. *Wait* is the time from "
        "asking to being granted, per acquisition: a low p50 with a huge p99/max means one "
        "worker keeps re-taking the lock while others starve (non-fair barging); when one "
        "worker takes nearly every grant, even the p99 stays low and only the max shows the "
        "starvation. *Grants per process* (processes rows): the fewest and the most "
        "grants one process got; a starved process shows as a small minimum. *Overlaps* "
        "counts two holders at once (must be 0); in the processes rows every hold's start "
        "and end, taken inside the lock on the shared monotonic clock, are compared across "
        "processes.",
        f"- **{s['waiters']} waiters**: one process, one client, {s['waiters']} tasks (threads "
        "for blocking libraries) wait on a lock held by a second client. *Connections*: the "
        "server's client count (peak during the wait) minus before the waiters' client "
        "opened; on a Cluster, Sentinel, Redlock, an ensemble and etcd, which have no single "
        "server to ask, the TCP connections this process opened instead. *RSS*: this "
        "process's resident memory growth. Then the holder releases and "
        "each waiter takes and releases the lock: *drain* is release → last waiter done, "
        f"cut off at {s['drain_timeout']:g} s (\"> N\" = not all drained by then).",
        f"- **Handoff after a crash**: a holder process takes the lock and dies without "
        f"releasing ({s['trials']} trials per run). Redis: lease {s['handoff_ttl']:g} s "
        "(python-redis-lock rounds up to 1 s); the time is from the key's expiry (its "
        "`PTTL` read right after the grant, ± the shown margin) to the waiter's grant. "
        "ZooKeeper: from the holder's exit + its session timeout "
        f"({s['session_timeout']:g} s; the server expires sessions on its 200 ms tick, so "
        "this includes up to a tick of server delay). Redlock: from the expiry that frees a "
        "quorum of the masters (the second of three `PTTL`s). etcd: from the holder's exit + "
        "its lease's TTL (aiodlock: the client's session lease, 2 s; aetcd: the lock's own, "
        "1 s asked, but etcd raises a lease to its minimum, 1.5 s with this cluster's 1 s "
        "election timeout, so aetcd's figure includes 0.5 s more); etcd revokes expired "
        "leases on a 500 ms tick. MySQL, PostgreSQL: from the "
        "holder's exit.",
        *_storm_reading(s),
        "- Incumbents run with their defaults, except that their redis-py connection pools "
        "may open up to 2000 connections (redis-py 8's default of 100 makes 900 of 1000 "
        "waiters fail with `MaxConnectionsError`). aiodlock rows run under both event loops; "
        "blocking libraries in threads.\n",
        "## Targets\n",
        "The performance issue's targets (issue 35), checked against this run's medians. "
        "Each names the ceiling or the incumbent it is measured against, in the same run.\n",
        _targets(doc),
    ]
    for backend, title in BACKEND_TITLES.items():
        if backend not in doc["servers"]:
            continue
        out += [
            f"## {title}\n",
            "### Uncontended acquire + release\n", _uncontended(doc, backend),
            f"### Contended: {s['workers']} workers, {s['section'] * 1000:g} ms critical "
            "section\n", _contended(doc, backend),
            f"### {s['waiters']} waiters on one held lock\n", _waiters(doc, backend),
            "### Handoff after a holder crash\n", _handoff(doc, backend),
            *(["### Cancellation storm\n", _storm(doc, backend)]
              if _rows(doc, backend, "storm") else []),
            "### aiodlock against each incumbent\n", _versus(doc, backend),
        ]  # fmt: skip
    out += [
        "## How to reproduce\n",
        "```sh\npython3 -m nox -s bench                 # full run (~45 min), writes docs/\n"
        "python3 -m nox -s bench -- --quick      # the targets' rows only (~2 min)\n"
        "python3 -m nox -s bench -- --only redis --loops asyncio --repeat 5\n```\n",
        "`benchmarks/run.py` starts its own throw-away servers on free loopback ports (the "
        "test harness's classes) and runs each cell in a child process "
        "(`benchmarks/worker.py`). The machine-readable results, with every setting, are "
        "in `benchmarks.json`; the chart in `benchmarks.png`.\n",
    ]
    return "\n".join(out)


def floor_drift(previous: Doc, doc: Doc) -> list[dict[str, Any]]:
    """Each raw floor's p50 in ``doc`` beside the same floor in ``previous`` (the page this
    run replaces): the same commands with no library, so a change there is the machine's,
    and absolute figures of the two pages compare only through it."""
    drift = []
    for backend in sorted({lib["backend"] for lib in doc["libraries"].values()}):
        for loop in doc["loops"]:
            now = _measured_floor(doc, backend, loop)
            before = _measured_floor(previous, backend, loop)
            if not (math.isnan(now) or math.isnan(before)):
                drift.append({"backend": backend, "loop": loop, "before": before, "now": now})
    return drift


def _measured_floor(doc: Doc, backend: str, loop: str) -> float:
    """The raw floor's p50: its own cell, else as paired in a library's cell (--quick)."""
    value = _floor_p50(doc, backend, loop)
    for r in doc["results"] if math.isnan(value) else ():
        paired = r["median"].get("floor_p50")
        if (doc["libraries"][r["library"]]["backend"] == backend and r["loop"] == loop
                and r["scenario"] == "uncontended" and isinstance(paired, int | float)):
            return float(paired)  # fmt: skip
    return value


def _drift(drift: list[Mapping[str, Any]]) -> str:
    ratios = sorted(d["now"] / d["before"] for d in drift)
    cells = ", ".join(
        f"{d['backend']} {d['loop']} {d['before']:.3f} → {d['now']:.3f} ms" for d in drift
    )
    return (f"median {ratios[len(ratios) // 2]:.2f}{TIMES} the previous page's (p50: {cells}): "
            "compare absolute figures across pages through this")  # fmt: skip


def rerender(doc: Doc) -> dict[str, Any]:
    """The document with its targets checked again (after a change to the checks)."""
    return {
        **doc,
        "targets": targets.check(
            doc["results"], doc["loops"], seconds=doc["total_seconds"], quick=doc["quick"]
        ),
    }


def summary(doc: Doc) -> str:
    mark = {True: "met", False: "MISSED", None: "n/a"}
    return "\n".join(f"[{mark[t['met']]:6}] {t['target']} — {t['subject']}: {t['measured']}"
                     for t in doc["targets"])  # fmt: skip
