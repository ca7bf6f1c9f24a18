"""Scenario 2b: the contended scenario with K processes, one worker each.

This process starts K members (``python -m benchmarks.worker member``), waits until each has
its client open, then gives them all the same start and end on the shared monotonic clock and
merges their tallies: grants per process (min and max: a starved process shows), and every
hold's start and end, so that two holders in different processes at once count as an overlap.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping

from .contended import Tally

__all__ = ["run"]

_READY_TIMEOUT = 60.0


def run(
    job: Mapping[str, object], *, processes: int, duration: float, section: float, ttl: float
) -> Tally:
    member = {**job, "mode": "member", "section": section, "ttl": ttl}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", json.dumps(member)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for _ in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # bounded: the member's own open() times out
            if line.strip() != "ready":
                raise RuntimeError(f"a member did not start: {line!r}")
        start = time.perf_counter() + 0.2
        tally = Tally(start, start + duration)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start!r} {duration!r}\n")
            proc.stdin.flush()  # communicate() below closes it
        for proc in procs:
            out, _ = proc.communicate(timeout=duration + _READY_TIMEOUT)
            if proc.returncode != 0:
                raise RuntimeError(f"a member failed (exit {proc.returncode})")
            tally.merge(json.loads(out.strip().splitlines()[-1]))
        return tally
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
