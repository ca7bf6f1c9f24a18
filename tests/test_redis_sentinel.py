"""Redis Sentinel failovers under load (issue 8): the master is handed over (``SENTINEL
FAILOVER``) or killed while several clients take the lock in a loop.

Each test gets its own deployment (a master, a replica, three sentinels that fail over after
1 s of silence). What must hold: no two holders overlap among those that were not told of a
loss; waiters go on once the new master is up; a holder whose key the failover lost is told
(its body cancelled with ``LockLostError``), and the next token is still larger than every
earlier one, although the fencing counter was lost with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis

import aiodlock
from aiodlock.testing import History, Hold
from tests.support_sentinel import SentinelDeployment

pytestmark = pytest.mark.redis


@pytest.fixture
def deployment() -> Iterator[SentinelDeployment]:
    with SentinelDeployment(down_after_ms=1000) as made:
        yield made


@dataclass
class Load:
    """Clients taking one lock in a loop; what each acquisition came to."""

    url: str
    clean: list[Hold] = field(default_factory=list)  # holds that ended without a loss
    lost: int = 0
    failed: int = 0  # BackendError or LockTimeoutError while the master was away
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def worker(self, client: aiodlock.LockClient, name: str) -> None:
        while not self.stop.is_set():
            try:
                async with client.lock("job", ttl=3, timeout=10) as lease:
                    start = time.monotonic()
                    await asyncio.sleep(0.005)
                    end = time.monotonic()
                self.clean.append(Hold(name, lease.fencing_token, start, end))
            except aiodlock.LockLostError:
                self.lost += 1
            except (aiodlock.BackendError, aiodlock.LockTimeoutError):
                self.failed += 1
                await asyncio.sleep(0.05)  # an application's back-off while the master is away

    async def run_through(self, fault: object) -> int:
        """Run the load, apply ``fault()`` in a thread once it is going, go on for 2 s after it;
        return the grants after the fault."""
        assert callable(fault)
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(aiodlock.connect(self.url, namespace="fo"))
                for _ in range(2)
            ]
            tasks = [
                asyncio.create_task(self.worker(client, f"c{c}w{w}"))
                for c, client in enumerate(clients)
                for w in range(3)
            ]
            await _until(lambda: len(self.clean) >= 20)
            await asyncio.to_thread(fault)
            before = len(self.clean)
            await _until(lambda: len(self.clean) >= before + 20, timeout=30)
            self.stop.set()
            await asyncio.gather(*tasks)
            return len(self.clean) - before


async def _until(condition: object, timeout: float = 10.0) -> None:
    assert callable(condition)
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - progress of other tasks, no event for it
            await asyncio.sleep(0.01)


async def test_sentinel_failover_under_load(deployment: SentinelDeployment) -> None:
    load = Load(deployment.url)
    old = deployment.current_master()
    after = await load.run_through(deployment.failover)
    assert deployment.current_master() is not old
    History(load.clean).check(max_holders=1)
    assert after >= 20


async def test_killed_master_under_load(deployment: SentinelDeployment) -> None:
    load = Load(deployment.url)
    old = deployment.current_master()

    def kill_the_master() -> None:
        old.kill()
        deployment.wait_for_new_master(old)

    after = await load.run_through(kill_the_master)
    assert deployment.current_master() is not old
    History(load.clean).check(max_holders=1)
    assert after >= 20


async def test_a_lock_lost_in_a_failover_is_reported_and_tokens_still_grow(
    deployment: SentinelDeployment,
) -> None:
    """The replica is stopped while the lock is taken, so the key (and the fencing counter)
    reach the master only; the master dies and the replica is promoted without them. The
    holder's next renewal finds no key: its body is cancelled with LockLostError (never a
    resurrected lease), and the next holder's token is still larger."""
    replica = next(s for s in deployment.servers if s is not deployment.current_master())
    master = deployment.current_master()
    async with (
        aiodlock.connect(deployment.url, namespace="lost") as holder,
        aiodlock.connect(deployment.url, namespace="lost") as other,
    ):
        replica.pause()
        try:
            entered = asyncio.Event()
            tokens: list[int] = []

            async def hold() -> None:
                async with holder.lock("job", ttl=6) as lease:
                    tokens.append(lease.fencing_token)
                    entered.set()
                    await asyncio.Event().wait()  # until the loss cancels it

            held = asyncio.create_task(hold())
            await asyncio.wait_for(entered.wait(), 10)
            master.kill()
        finally:
            replica.resume()
        await asyncio.to_thread(deployment.wait_for_new_master, master)
        assert redis.Redis(replica.host, replica.port).keys("*lost*") == []  # really lost
        with pytest.raises(aiodlock.LockLostError):
            await asyncio.wait_for(held, 15)
        async with other.lock("job", timeout=10) as lease:
            assert lease.fencing_token > tokens[0]
