"""One candidate process for tests/test_leader.py: ``python -m tests.leader_candidate URL NS
NAME IDENTITY``.

Campaigns for ever (``async for term in election``); prints one JSON line per event on
stdout, flushed at once, so the test reads the events as they happen (no sleeping to guess):
``{"event": "lead", "identity", "token", "at"}`` on winning a term and
``{"event": "lost", ...}`` when a term ends by a lost lease. SIGTERM ends it (the term is
released by leaving the client).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import aiodlock


def say(event: str, identity: str, token: int) -> None:
    line = {"event": event, "identity": identity, "token": token, "at": time.monotonic()}
    print(json.dumps(line), flush=True)


async def main(url: str, namespace: str, name: str, identity: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with aiodlock.connect(url, namespace=namespace, ttl=1.0) as locks:

        async def campaign() -> None:
            async for term in locks.election(name, identity=identity):
                token = 0
                async with term:
                    token = term.fencing_token
                    say("lead", identity, token)
                    await asyncio.Event().wait()  # lead until the lease is lost
                say("lost", identity, token)

        async with asyncio.TaskGroup() as group:
            task = group.create_task(campaign())
            await stop.wait()
            task.cancel()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
