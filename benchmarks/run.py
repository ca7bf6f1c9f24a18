"""Benchmark aiodlock against the incumbent lock libraries, on servers it starts itself.

Run from the repository root (``python3 -m nox -s bench`` does)::

    python benchmarks/run.py                      # full run, ~10 min on 2 cores
    python benchmarks/run.py --quick              # the targets' rows only, ~4 min
    python benchmarks/run.py --only redis --loops asyncio --repeat 5 --out /tmp/bench
    python benchmarks/run.py --render docs/benchmarks.json   # re-draw the Markdown and chart

Writes ``benchmarks.json``, ``benchmarks.md`` and ``benchmarks.png`` into ``--out`` (default
``docs/``). Every cell (library x scenario x event loop) runs in its own child process
(``benchmarks/worker.py``), ``--repeat`` times, the repeats interleaved so that drift on the
machine hits every library alike; the report shows medians.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` and `tests` importable
    sys.path.insert(0, str(ROOT))

from benchmarks import chart, report, targets  # noqa: E402
from benchmarks.adapters import LIBRARIES, Library  # noqa: E402
from benchmarks.config import FULL, QUICK, Settings  # noqa: E402
from benchmarks.servers import Server, started  # noqa: E402

BACKENDS = ("redis", "redis-cluster", "redis-sentinel", "redlock", "zookeeper",
            "zookeeper-ensemble", "etcd", "mysql", "postgres")
LOOPS = ("asyncio", "uvloop")
_SLACK = 90.0  # seconds a cell may take beyond its own planned time before it is killed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="the rows the targets read, short samples (~4 min)")
    parser.add_argument("--only", type=_choices(BACKENDS), default=None,
                        help="comma-separated backends (default: all, or with --quick those "
                             "the targets read)")
    parser.add_argument("--loops", type=_choices(LOOPS), default=list(LOOPS),
                        help="event loops for aiodlock and the raw floors (default: both)")
    parser.add_argument("--all-loops", action="store_true",
                        help="run the asyncio incumbents under every loop too "
                             "(default: the first loop only)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs per cell (default: 3, or 1 with --quick)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs",
                        help="output directory (default: docs/)")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="measure nothing: write the Markdown and the chart of an "
                             "earlier benchmarks.json into --out")
    return parser.parse_args(argv)  # fmt: skip


def _choices(allowed: tuple[str, ...]) -> type[list[str]]:
    class Choices(list[str]):
        def __init__(self, text: str) -> None:
            picked = [item.strip() for item in text.split(",") if item.strip()]
            unknown = sorted(set(picked) - set(allowed))
            if unknown or not picked:
                raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}")
            super().__init__(picked)

    return Choices


def plan(backends: list[str], loops: list[str], all_loops: bool,
         rows: frozenset[tuple[str, str]] | None = None) -> list[tuple[Library, str, str]]:
    """Every (library, scenario, loop) cell, in a stable order (``rows``: only those)."""
    cells = []
    for library in LIBRARIES:
        if library.backend not in backends and library.backend != "none":
            continue
        for scenario in library.scenarios:
            if rows is not None and (library.key, scenario) not in rows:
                continue
            if not library.asynchronous:
                cell_loops = ["threads"]
            elif scenario in ("contended_procs", "storm") or (
                library.role == "incumbent" and not all_loops
            ):
                cell_loops = loops[:1]
            else:
                cell_loops = loops
            cells += [(library, scenario, loop) for loop in cell_loops]
    return cells


def _planned_seconds(scenario: str, s: Settings) -> float:
    return {
        "uncontended": 30.0,
        "contended": s.duration + 15,
        "contended_procs": s.duration + 30,
        "waiters": s.settle + 2 * s.drain_timeout + 30,
        "handoff": s.trials * (s.handoff_ttl + s.session_timeout + 20),
        "storm": s.storm_duration + s.storm_ttl + 40,
    }[scenario]


def run_cell(library: Library, scenario: str, loop: str, server: Server, s: Settings) -> dict[
    str, object
]:
    """One child process; its JSON answer (or an error that says what happened)."""
    assert server.endpoint is not None
    job = {
        "library": library.key,
        "scenario": scenario,
        "loop": loop,
        "name": f"{scenario}-{library.key}-{uuid.uuid4().hex[:8]}",
        "endpoint": {"backend": server.endpoint.backend, "url": server.endpoint.url},
        "params": s.params(),
    }
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.worker", json.dumps(job)],
            cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=_planned_seconds(scenario, s) + _SLACK,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timed out (killed)"}
    lines = done.stdout.strip().splitlines()
    try:
        answer: dict[str, object] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = done.stderr.strip().splitlines()[-3:]
        return {"ok": False, "error": f"exit {done.returncode}: {' | '.join(tail)}"}
    return answer


def _unavailable(error: str) -> bool:
    return error.startswith(("ModuleNotFoundError", "ImportError"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        document = report.rerender(json.loads(args.render.read_text()))
        write(document, args.out)
        return 0
    settings = QUICK if args.quick else FULL
    if args.repeat is not None:
        settings = replace(settings, repeat=max(1, args.repeat))
    rows = targets.ROWS if args.quick else None
    backends = args.only or [
        b for b in BACKENDS if rows is None or any(
            lib.backend == b and (lib.key, scenario) in rows
            for lib in LIBRARIES for scenario in lib.scenarios)
    ]  # fmt: skip
    cells = plan(backends, args.loops, args.all_loops, rows)
    began, load_before = time.perf_counter(), os.getloadavg()[0]
    runs: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    skipped: dict[str, str] = {}
    with started(backends) as servers:
        for backend, running in servers.items():
            print(f"{backend}: {running.version or running.error}", file=sys.stderr)
        for repeat in range(1, settings.repeat + 1):
            for library, scenario, loop in cells:
                key = (library.key, scenario, loop)
                # The in-process reference needs no server, but the worker wants an endpoint.
                server: Server | None = servers.get(library.backend) or next(
                    (s for s in servers.values() if s.endpoint is not None), None
                )
                if server is None or server.endpoint is None:
                    answer: dict[str, object] = {"ok": False, "error": server.error if server
                                                 else "no server"}  # fmt: skip
                elif library.key in skipped:
                    answer = {"ok": False, "error": skipped[library.key]}
                else:
                    answer = run_cell(library, scenario, loop, server, settings)
                    if not answer.get("ok") and _unavailable(str(answer.get("error"))):
                        skipped[library.key] = str(answer["error"])
                runs.setdefault(key, []).append(answer)
                print(f"[{repeat}/{settings.repeat} {time.perf_counter() - began:6.0f}s] "
                      f"{library.key:24} {scenario:15} {loop:8} {report.brief(answer)}",
                      file=sys.stderr, flush=True)  # fmt: skip
        document = report.build(
            cells, runs, servers, settings, loops=args.loops,
            seconds=time.perf_counter() - began, quick=args.quick, load_before=load_before,
        )  # fmt: skip
    previous = args.out / "benchmarks.json"
    if previous.exists():
        document["floor_drift"] = report.floor_drift(json.loads(previous.read_text()), document)
    write(document, args.out)
    print(f"in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return 0


def write(document: dict[str, object], out: Path) -> None:
    """benchmarks.json, benchmarks.md and benchmarks.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "benchmarks.md").write_text(report.markdown(document))
    drawn = chart.write(document, out / "benchmarks.png")
    print(report.summary(document), file=sys.stderr)
    if drawn:
        print(f"wrote {out}/benchmarks.{{json,md,png}}", file=sys.stderr)
    else:
        print(f"wrote {out}/benchmarks.{{json,md}} (no contended row to chart)", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
