"""A lock broken through aiodlock reaches its holder at once, on every backend.

``locks.break_lock(name)`` (what ``aiodlock break`` runs) from another client: the holder's
``async with`` body is cancelled with ``LockLostError`` within 100 ms, told by the service
(a pub/sub message on Redis, heard on every master with Redlock, a watch on its own node or
key on ZooKeeper and etcd, the ended session on MySQL and PostgreSQL), not found out at the
next renewal a third of the ttl later.
The default ttl (30 s) makes that difference plain: a renewal would come after 10 s.

``SCHEDULING_SLACK`` is added to the bound: the suite runs beside other workers on a small
machine.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Final

import pytest

import aiodlock
from aiodlock.testing import History
from tests.helpers import told_at_once

TOLD_WITHIN: Final = 0.1
SCHEDULING_SLACK: Final = 0.15
TRIALS: Final = 5

BACKENDS = [
    pytest.param("memory", marks=pytest.mark.memory),
    pytest.param("redis_url", marks=pytest.mark.redis),
    pytest.param("redlock", marks=pytest.mark.redis),
    pytest.param("zookeeper", marks=pytest.mark.zookeeper),
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("mysql_url", marks=pytest.mark.mysql),
    pytest.param("postgres_url", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return f"memory://break-{uuid.uuid4().hex[:8]}"
    if request.param == "redlock":
        return str(request.getfixturevalue("redlock_masters").url)
    if request.param in ("zookeeper", "etcd"):
        server = request.getfixturevalue(f"{request.param}_server")
        return str(server.url)
    return str(request.getfixturevalue(request.param))


async def test_a_broken_lock_cancels_its_holder_within_100_ms(url: str) -> None:
    namespace = f"told-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    delays = []
    async with (
        aiodlock.connect(url, namespace=namespace) as holder,
        aiodlock.connect(url, namespace=namespace) as operator,
    ):
        async with operator.lock("warm"):
            pass  # the operator's connection is open: the delay is the break and the push
        for trial in range(TRIALS):
            name = f"broken-{trial}"
            entered = asyncio.Event()
            history = History()

            async def hold(
                name: str = name, entered: asyncio.Event = entered, history: History = history
            ) -> None:
                async with holder.lock(name) as lease:  # the default ttl: 30 s
                    with history.hold(name, lease.fencing_token):
                        entered.set()
                        await asyncio.Event().wait()  # until the break cancels it

            body = asyncio.create_task(hold())
            await entered.wait()
            broken_at = loop.time()
            assert await operator.break_lock(name) == 1
            with pytest.raises(aiodlock.LockLostError):
                async with asyncio.timeout(15):
                    await body
            delays.append(loop.time() - broken_at)
            # The next holder gets a newer token, and nobody overlapped.
            async with operator.lock(name) as lease:
                with history.hold(name, lease.fencing_token):
                    pass
            history.check()
    told_at_once(delays, TOLD_WITHIN + SCHEDULING_SLACK)
