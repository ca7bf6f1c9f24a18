"""Real processes against real servers: exclusion across processes, and a SIGSTOPped holder."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

import aiodlock
from aiodlock.testing import History
from tests.conftest import SERVER_BACKENDS, Target

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.parametrize("backend_name", SERVER_BACKENDS, indirect=True)


async def spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.holder",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_three_processes_read_sleep_write(target: Target, tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    procs = [
        await spawn("count", target.url, target.namespace, "stock", "15", str(counter))
        for _ in range(3)
    ]
    outputs = [await asyncio.wait_for(p.communicate(), 60) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    history = History()
    for out, _ in outputs:
        history.extend(History.from_json_lines(out.decode().splitlines()))
    assert len(history.holds) == 45
    history.check(max_holders=1)
    assert int(counter.read_text()) == 45


async def test_sigstopped_holder_is_replaced_and_cancelled_on_resume(
    target: Target, other: aiodlock.LockClient
) -> None:
    proc = await spawn("hold", target.url, target.namespace, "paused", "1.0")
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
