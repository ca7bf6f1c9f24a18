"""Holders in other processes (``python -m aiodlock.testing._holder``): read-sleep-write across
processes, and a SIGSTOPped holder replaced, cancelled on resume, never writing late."""

# ruff: noqa: ASYNC240 - test code, held to the rules of tests/ (pyproject.toml)

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

import aiodlock

from .. import History
from ._fixtures import Target
from ._needs import needs_processes

__all__ = [
    "test_paused_holder_never_writes_after_its_lock_was_given_away",
    "test_sigstopped_holder_is_replaced_and_cancelled_on_resume",
    "test_three_processes_read_sleep_write",
]


async def _spawn(target: Target, mode: str, *args: str) -> asyncio.subprocess.Process:
    """``python -m aiodlock.testing._holder`` on the same loop kind, URL and options."""
    on_uvloop = type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    package_root = Path(aiodlock.__file__).resolve().parent.parent
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aiodlock.testing._holder",
        "uvloop" if on_uvloop else "asyncio",
        target.url,
        json.dumps(target.options),
        target.namespace,
        mode,
        *args,
        cwd=package_root,  # the child imports this very aiodlock
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@needs_processes
@pytest.mark.asyncio
async def test_three_processes_read_sleep_write(aiodlock_target: Target, tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    procs = [await _spawn(aiodlock_target, "count", "stock", "15", str(counter)) for _ in range(3)]
    outputs = [await asyncio.wait_for(p.communicate(), 60) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    history = History()
    for out, _ in outputs:
        history.extend(History.from_json_lines(out.decode().splitlines()))
    assert len(history.holds) == 45
    history.check(max_holders=1)
    assert int(counter.read_text()) == 45


@needs_processes
@pytest.mark.asyncio
async def test_sigstopped_holder_is_replaced_and_cancelled_on_resume(
    aiodlock_target: Target, other: aiodlock.LockClient
) -> None:
    proc = await _spawn(aiodlock_target, "hold", "paused", "1.0")
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
    assert line.startswith("acquired "), line
    first_token = int(line.split()[1])
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        # The stopped holder cannot renew: its lease runs out and we get the lock.
        lease = await other.lock("paused").acquire(timeout=5)
        assert lease.fencing_token > first_token
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    # On resume, the stale holder notices its validity passed and its body is cancelled.
    out, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 3, (out, err)
    assert out.decode().startswith("lost")
    # ...and its exit did not release *our* lock.
    assert lease.held
    assert await other.lock("paused").try_acquire() is None
    await lease.release()


@needs_processes
@pytest.mark.asyncio
async def test_paused_holder_never_writes_after_its_lock_was_given_away(
    aiodlock_target: Target, other: aiodlock.LockClient
) -> None:
    """A holder stopped (SIGSTOP) until the service gave its lock to another process must not
    pass ``assert_held()`` when it resumes, whatever ended its lease: the ttl, or — on a session
    backend whose ttl outlives the session — the session. ``time.monotonic()`` is shared by
    every process of the machine, so the holder's writes can be put on our timeline."""
    proc = await _spawn(aiodlock_target, "write", "fragile", "4.0")
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
    assert line.startswith("acquired "), line
    await asyncio.wait_for(proc.stdout.readline(), 10)  # it is writing
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        lease = await other.lock("fragile").acquire(timeout=15)
        given_away = time.monotonic()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = await asyncio.wait_for(proc.communicate(), 15)
    lines = out.decode().splitlines()
    late = [w for w in lines if w.startswith("wrote ") and float(w.split()[1]) >= given_away]
    assert late == [], f"{len(late)} writes after the lock was given away: {lines[-3:]}"
    assert proc.returncode == 3, (out, err)
    assert lines[-1].startswith("lost"), lines[-3:]
    await lease.release()
