"""``locks.periodic``: a job every N seconds on exactly one of several instances.

Every instance of the service calls ``await locks.periodic("purge", purge, every=0.1)``; the
leader of the election ``"purge"`` runs the job on its timer, the others wait. When the leader
goes away (here: instance ``a`` stops after a few runs), another takes over at once. Run it::

    python examples/periodic.py
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/periodic.py

It exits 0 when the runs never overlapped and all came from one instance at a time.
"""

from __future__ import annotations

import asyncio
import os
import sys

import aiodlock

URL = os.environ.get("AIODLOCK_URL", "memory://")
NAMESPACE = f"periodic-example-{os.getpid()}"
runs: list[str] = []
running = 0
overlapped = False
enough = {"a": asyncio.Event(), "b": asyncio.Event()}
first_run = asyncio.Event()


async def purge(instance: str) -> None:
    global running, overlapped
    running += 1
    overlapped |= running > 1
    try:
        await asyncio.sleep(0.01)  # delete expired sessions
    finally:
        running -= 1
    runs.append(instance)
    first_run.set()
    print(f"{instance}: purged (run {len(runs)})")
    if runs.count(instance) == 3:
        enough[instance].set()


async def instance(name: str) -> None:
    async with aiodlock.connect(URL, namespace=NAMESPACE, ttl=1) as locks:
        job = asyncio.create_task(locks.periodic("purge", purge, name, every=0.1, identity=name))
        await enough[name].wait()  # this instance has done its share; it shuts down
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)


async def main() -> int:
    async with asyncio.TaskGroup() as group:
        group.create_task(instance("a"))
        await first_run.wait()  # b starts once a leads and has run
        group.create_task(instance("b"))
    ok = not overlapped and runs == ["a"] * 3 + ["b"] * 3
    print(f"runs: {runs}")
    print("OK: one instance at a time" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
