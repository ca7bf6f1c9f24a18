"""Leader election: three schedulers, one leads; when it goes away, another takes over.

Each scheduler has its own client (as if each were a separate process) and campaigns with
``async for term in locks.election("scheduler")``: inside ``async with term`` it leads, until
its lease is lost (the block is cancelled, and the loop campaigns again) or it steps down. An
observer asks ``who_leads()`` along the way.

Here each leader does three ticks of work and steps down by leaving the loop (a deploy, say):
the next candidate is woken by the service and leads. Run it::

    python examples/leader.py
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/leader.py

It exits 0 when no two schedulers ever led at the same time and each led once.
"""

from __future__ import annotations

import asyncio
import os
import sys

import aiodlock
from aiodlock.testing import History

URL = os.environ.get("AIODLOCK_URL", "memory://")
NAMESPACE = f"leader-example-{os.getpid()}"


async def scheduler(identity: str, history: History, leading: asyncio.Event) -> None:
    async with aiodlock.connect(URL, namespace=NAMESPACE, ttl=2) as locks:
        async for term in locks.election("scheduler", identity=identity):
            async with term:  # leading from here; cancelled if leadership is lost
                with history.hold(identity, term.fencing_token):
                    leading.set()
                    for tick in range(3):
                        print(f"{identity}: tick {tick} (term {term.fencing_token})")
                        await asyncio.sleep(0.02)  # schedule the jobs due now
            print(f"{identity}: stepping down")
            return


async def main() -> int:
    history = History()
    leading = asyncio.Event()
    async with aiodlock.connect(URL, namespace=NAMESPACE) as observer:
        election = observer.election("scheduler")
        async with asyncio.TaskGroup() as group:
            for i in range(3):
                group.create_task(scheduler(f"scheduler-{i}", history, leading))
            await leading.wait()
            print(f"observer: {await election.who_leads()} leads")
        print(f"observer: after everyone stepped down, {await election.who_leads()} leads")
    history.check(max_holders=1)  # raises if two led at once, or terms went backwards
    ok = sorted(h.holder for h in history.holds) == [f"scheduler-{i}" for i in range(3)]
    print("OK: one leader at a time" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
