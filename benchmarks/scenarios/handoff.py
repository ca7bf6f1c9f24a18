"""Scenario 4: a holder crashes; how long until the next waiter is granted the lock.

Each trial starts a holder process (``python -m benchmarks.worker holder``) that acquires the
lock with the same library and exits at once without releasing (``os._exit``): a crash. Then a
waiter of this process asks for the lock and we time its grant against the moment the lock
became free on the server:

- Redis: the lock key's expiry, read with ``PTTL`` right after the holder took it (see
  :func:`.probes.key_expiry`); the uncertainty (half the PTTL round trip + 0.5 ms) is reported.
  On a Cluster, the key's master; on Sentinel, the master; on Redlock's masters, the expiry
  that frees a quorum of them.
- ZooKeeper: the holder's exit + its session timeout (the server deletes the ephemeral node
  when it expires the session, on its own tick, up to one tick later).
- etcd: the holder's exit + its lease's TTL (the leader revokes an expired lease on its own
  schedule, checked every 500 ms).
- MySQL: the holder's exit (the server drops the lock when the connection closes).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..adapters.base import AsyncAdapter, SyncAdapter
from ..stats import summary_ms
from .probes import key_expiry

__all__ = ["run"]


async def run(
    job: Mapping[str, Any],
    adapter: AsyncAdapter | SyncAdapter,
    name: str,
    *,
    trials: int,
    ttl: float,
    session_timeout: float,
    timeout: float,
) -> dict[str, object]:
    """``trials`` crashes of a holder; the waiter in this process is ``adapter``."""
    handoffs, uncertainties = [], []
    for trial in range(trials):
        lock_name = f"{name}-{trial}"
        holder = {**job, "mode": "holder", "name": lock_name, "ttl": ttl,
                  "session_timeout": session_timeout}  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.worker", json.dumps(holder),
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            if line.strip() != b"held":
                raise RuntimeError(f"the holder did not take the lock: {line!r}")
            key = adapter.server_key(lock_name)
            if adapter.endpoint.family in ("redis", "redlock"):
                assert key is not None, "a Redis adapter names its key"
                freed, uncertainty = await key_expiry(adapter.endpoint, key)
                await proc.wait()
            else:
                await proc.wait()
                freed, uncertainty = time.perf_counter(), 0.0
                freed += adapter.crash_lease(ttl=ttl, session_timeout=session_timeout)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        granted = await asyncio.wait_for(_grant_time(adapter, lock_name, ttl), timeout)
        handoffs.append(granted - freed)
        uncertainties.append(uncertainty)
    stats = summary_ms(handoffs)
    return {
        "trials": trials,
        "handoff_p50": stats["p50"],
        "handoff_max": stats["max"],
        "handoff_min": min(handoffs) * 1e3,
        "uncertainty_ms": max(uncertainties) * 1e3,
        "freed_by": {"redis": "key expiry (PTTL)", "zookeeper": "holder exit + session timeout",
                     "redlock": "a quorum of key expiries (PTTL)",
                     "etcd": "holder exit + lease TTL", "mysql": "holder exit",
                     "postgres": "holder exit"}.get(adapter.endpoint.family, "?"),
    }  # fmt: skip


def _grant_time(adapter: AsyncAdapter | SyncAdapter, name: str, ttl: float) -> Awaitable[float]:
    if isinstance(adapter, AsyncAdapter):
        return _async_grant(adapter, name, ttl)
    return asyncio.to_thread(_sync_grant(adapter, name, ttl))


async def _async_grant(adapter: AsyncAdapter, name: str, ttl: float) -> float:
    async with adapter.hold(name, ttl=ttl):
        return time.perf_counter()


def _sync_grant(adapter: SyncAdapter, name: str, ttl: float) -> Callable[[], float]:
    def grant() -> float:
        with adapter.hold(name, ttl=ttl):
            return time.perf_counter()

    return grant
