"""Small helpers shared by the backend-specific test modules (no driver, no server)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

import aiodlock
from aiodlock.testing import Hold

__all__ = [
    "FailoverLoad",
    "cut_off_grants",
    "eventually",
    "release_meets_keep_alives",
    "running_loop_name",
    "taken_once_free",
    "wait_until",
]


def running_loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop this test runs on (a child process gets the same)."""
    bases = type(asyncio.get_running_loop()).__mro__
    return "uvloop" if any(c.__module__.startswith("uvloop") for c in bases) else "asyncio"


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition that no event reports (a waiter queued on a remote service)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but the condition
            await asyncio.sleep(0.001)


async def cut_off_grants(
    client: aiodlock.LockClient,
    block: Callable[[], Awaitable[object]],
    unblock: Callable[[], Awaitable[object]],
    *,
    times: int = 2,
) -> list[float]:
    """With the server kept from answering (``block()`` ... ``unblock()``), how long each of
    ``times`` grants took to fail with ``BackendError`` (TimeoutError); then check that the
    client still grants."""
    loop = asyncio.get_running_loop()
    async with client.lock("warm"):
        pass  # connected, tables made: what follows waits only for the blocked statement
    took = []
    for _ in range(times):
        await block()
        try:
            started = loop.time()
            with pytest.raises(aiodlock.BackendError, match="TimeoutError"):
                await client.lock("cut-off").try_acquire()
            took.append(loop.time() - started)
        finally:
            await unblock()
    async with client.lock("cut-off", timeout=5) as lease:
        assert lease.fencing_token > 0
    return took


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> float:
    """Poll ``check``, a server-side condition nothing notifies us of (a probe's view, a key
    expiring); return the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 - the server notifies nobody of these
            await asyncio.sleep(0.005)
    return loop.time() - started


async def taken_once_free(lock: aiodlock.Lock, timeout: float = 10.0) -> aiodlock.Lease:
    """``lock.try_acquire()`` until it succeeds: the lock is free once the server has noticed
    something nothing tells the client (a killed session ending). Fails after ``timeout``."""
    taken: list[aiodlock.Lease] = []

    async def took() -> bool:
        lease = await lock.try_acquire()
        taken.extend([lease] if lease is not None else [])
        return lease is not None

    await eventually(took, timeout)
    return taken[0]


async def release_meets_keep_alives(
    holder: aiodlock.LockClient, other: aiodlock.LockClient, rounds: int = 200
) -> None:
    """Release leases whose keep-alive runs every 10 ms, at moments spread over its period:
    each time the lock must be free for ``other`` when release() returns, even when the
    release met a keep-alive in flight."""
    for i in range(rounds):
        lease = await holder.lock("busy", ttl=0.03).acquire()
        await asyncio.sleep(0.001 * (i % 13))
        try:
            await lease.release()
        except aiodlock.LockNotOwnedError:
            assert lease.lost.is_set()  # only a lease really lost (a stalled loop) may say so
            again = await other.lock("busy").acquire(timeout=2)
        else:
            taken = await other.lock("busy").try_acquire()
            assert taken is not None, f"still taken right after release #{i}"
            again = taken
        await again.release()


@dataclass
class FailoverLoad:
    """Clients taking one lock in a loop through a failover; what each acquisition came to.

    Example::

        load = FailoverLoad(url)
        after = await load.run_through(deployment.failover)
        load.check_fencing_order()
    """

    url: str
    clean: list[Hold] = field(default_factory=list)  # holds that ended without a loss
    lost: int = 0
    failed: int = 0  # BackendError or LockTimeoutError while a master was away
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
                await asyncio.sleep(0.05)  # an application's back-off while a master is away

    async def run_through(self, fault: Callable[[], object]) -> int:
        """Run the load (two clients, three workers each, namespace ``fo``), apply ``fault()``
        in a thread once it is going, go on until 20 more grants; return the grants after
        the fault."""
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
            await wait_until(lambda: len(self.clean) >= 20)
            await asyncio.to_thread(fault)
            before = len(self.clean)
            await wait_until(lambda: len(self.clean) >= before + 20, timeout=30)
            self.stop.set()
            await asyncio.gather(*tasks)
            return len(self.clean) - before

    def check_fencing_order(self) -> None:
        """Fencing across the fault: no token twice, and the holder that began later always
        has the larger token (a resource that checks tokens refuses the other)."""
        ordered = sorted(self.clean, key=lambda hold: hold.start)
        tokens = [hold.token for hold in ordered]
        assert tokens == sorted(set(tokens)), "fencing order broken across the failover"
