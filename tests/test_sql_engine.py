"""The SQL engine (``aiodlock.backends.sql``), property-tested on the real servers.

Hypothesis drives two clients of one namespace through a random sequence of operations on
both dialects (MariaDB and PostgreSQL): try-acquires, waits with short timeouts, acquires
left waiting in the background, acquires and releases cancelled after a random number of
loop steps, releases and ``aiodlock.testing.settle``. After every step: no two holders of a
mutex, at most ``limit`` of a semaphore, writers exclusive of readers, no lease lost, each
client's lease count what the test holds, and each pool within ``max_connections`` and
``max_idle``. At the end (everything released and settled): fencing tokens grew
(``History``), nothing held or waiting (client, ``inspect()`` and the server's own view),
every connection back idle, and none left open on the server once the clients close.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import aiodlock
from aiodlock import Kind
from aiodlock.testing import History, Hold, settle
from tests.helpers import eventually
from tests.support_mysql import MySQLProbe
from tests.support_postgres import PostgresProbe

DIALECTS = [
    pytest.param("mysql", marks=pytest.mark.mysql, id="mysql"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
]
CLIENTS = 2
EXCLUSIVE = (Kind.MUTEX, Kind.WRITE)
# Waits short enough that a contended example stays fast, long enough that a release can
# hand the lock over to a waiter in the background.
TIMEOUTS = (0.0, 0.02, 0.1, 0.25)
# A cancelled acquire or release: loop steps before the cancel (0: before it ever ran; a
# round trip to a local server takes a few steps, a wait on the server many).
CANCEL_STEPS = st.integers(0, 40)
# Each slot holds or waits on at most one connection of its client, so a checkout never waits
# long for room; a leaked connection shows as a BackendError after this, not a hung test.
CONNECT_TIMEOUT = 5.0

examples = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    # No shrinking: against real servers a failing sequence replays with other timings (Hypothesis
    # calls that flaky) and each replay costs seconds; the first failure is reported as found.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
Probe = MySQLProbe | PostgresProbe


@dataclass(frozen=True)
class Target:
    """One lock the operations pick from: its name, kind and (semaphore) limit."""

    name: str
    kind: Kind
    limit: int = 1

    def make(self, client: aiodlock.LockClient) -> aiodlock.BaseLock:
        if self.kind is Kind.MUTEX:
            return client.lock(self.name)
        if self.kind is Kind.SEMAPHORE:
            return client.semaphore(self.name, limit=self.limit)
        if self.kind is Kind.READ:
            return client.read_lock(self.name)
        return client.write_lock(self.name)


@dataclass
class Grant:
    """A lease the test holds, and when (``time.monotonic()``) it was asked for and given."""

    target: Target
    lease: aiodlock.Lease
    asked: float
    start: float


@dataclass
class Slot:
    """One would-be holder: one client's task at a time, holding at most one lease."""

    client: int
    grant: Grant | None = None
    pending: asyncio.Task[None] | None = None


@dataclass
class Run:
    """One example: its clients, their bounds, what is held, and every grant so far."""

    clients: list[aiodlock.LockClient]
    bounds: list[tuple[int, int]]  # (max_connections, max_idle) per client
    targets: list[Target]
    slots: list[Slot] = field(default_factory=list)
    grants: list[Grant] = field(default_factory=list)
    history: dict[str, History] = field(default_factory=dict)
    releasing: list[int] = field(default_factory=lambda: [0] * CLIENTS)
    locks: dict[tuple[int, Target], aiodlock.BaseLock] = field(default_factory=dict)

    def lock(self, client: int, target: Target) -> aiodlock.BaseLock:
        key = (client, target)
        if key not in self.locks:
            self.locks[key] = target.make(self.clients[client])
        return self.locks[key]

    async def take(self, slot: Slot, target: Target, timeout: float | None) -> None:
        """Acquire (``timeout=None``: ``try_acquire()``); a grant is recorded the moment it
        returns, in the same loop step, so grant order here is the servers' order."""
        lock = self.lock(slot.client, target)
        asked = time.monotonic()
        if timeout is None:
            lease = await lock.try_acquire()
            if lease is None:
                return
        else:
            try:
                lease = await lock.acquire(timeout=timeout)
            except aiodlock.LockTimeoutError:
                return
        assert slot.grant is None
        slot.grant = Grant(target, lease, asked, time.monotonic())
        self.grants.append(slot.grant)
        self.check()

    async def release(self, slot: Slot, cancel_after: int | None) -> None:
        grant, slot.grant = slot.grant, None
        assert grant is not None
        holder = f"{slot.client}:{self.slots.index(slot)}"
        hold = Hold(holder, grant.lease.fencing_token, grant.start, time.monotonic())
        self.history.setdefault(grant.target.name, History()).holds.append(hold)
        self.releasing[slot.client] += 1
        try:
            if cancel_after is None:
                await grant.lease.release()
            else:
                # Cancelled once it runs (a task cancelled before its first step never calls
                # release at all): the release finishes in the background.
                await cancelled_after(grant.lease.release(), 1 + cancel_after, self.check)
        finally:
            self.releasing[slot.client] -= 1

    def check(self) -> None:
        """What must hold after every step (and between the steps of a cancelled call)."""
        held: dict[str, list[Grant]] = {}
        for slot in self.slots:
            if slot.grant is not None:
                assert not slot.grant.lease.lost.is_set(), slot.grant.lease
                held.setdefault(slot.grant.target.name, []).append(slot.grant)
        for name, grants in held.items():
            kinds = [g.target.kind for g in grants]
            if any(kind in EXCLUSIVE for kind in kinds):
                assert len(grants) == 1, f"{name}: {kinds} held at once"
            elif kinds[0] is Kind.SEMAPHORE:
                assert len(grants) <= grants[0].target.limit, f"{name}: {len(grants)} holders"
        for index, client in enumerate(self.clients):
            stats = client.statistics()
            mine = sum(1 for s in self.slots if s.client == index and s.grant is not None)
            # A lease being released still counts until its release returns.
            assert mine <= stats.leases <= mine + self.releasing[index], (stats, mine)
            pool = stats.backend
            max_connections, max_idle = self.bounds[index]
            # max_connections bounds the lent connections; the shared sessions come on top.
            assert pool["connections"] - pool["shared_sessions"] <= max_connections, pool
            assert pool["idle"] <= min(max_idle, pool["connections"]), pool
            # A granted acquisition pins its connection (never idle, never lent), or holds its
            # mutex on a shared session.
            busy = pool["connections"] - pool["idle"] - pool["shared_sessions"]
            assert mine <= pool["held"] <= busy + pool["shared_leases"], pool

    def check_fencing(self) -> None:
        """Tokens of one name grow: from a grant to every grant asked for after it, and in
        grant order where one of the two is exclusive (they never overlapped)."""
        for later_index, later in enumerate(self.grants):
            for earlier in self.grants[:later_index]:
                if earlier.target.name != later.target.name:
                    continue
                kinds = {earlier.target.kind, later.target.kind}
                if kinds & set(EXCLUSIVE) or earlier.start < later.asked:
                    assert later.lease.fencing_token > earlier.lease.fencing_token, (
                        earlier,
                        later,
                    )
        for name, history in self.history.items():
            (target,) = {t for t in self.targets if t.name == name and t.kind is not Kind.READ}
            if target.kind is not Kind.WRITE:  # readers share: checked pairwise above
                history.check(max_holders=target.limit)


async def cancelled_after(work: Awaitable[object], steps: int, check: Callable[[], None]) -> None:
    """Run ``work`` for ``steps`` loop steps (checking between them), then cancel it."""
    task = asyncio.ensure_future(work)
    for _ in range(steps):
        if task.done():
            break
        await asyncio.sleep(0)
        check()
    task.cancel()
    await asyncio.wait([task])
    failure = None if task.cancelled() else task.exception()
    if failure is not None:
        raise failure


@pytest.fixture
def url(request: pytest.FixtureRequest, dialect: str) -> str:
    value: str = request.getfixturevalue(f"{dialect}_url")
    return value


@pytest.fixture
async def probe(url: str, dialect: str) -> AsyncIterator[Probe]:
    made: Probe = await (MySQLProbe if dialect == "mysql" else PostgresProbe).open(url)
    try:
        yield made
    finally:
        await made.aclose()


def _targets(dialect: str, limit: int) -> list[Target]:
    targets = [Target("m0", Kind.MUTEX), Target("m1", Kind.MUTEX)]
    targets.append(Target("s0", Kind.SEMAPHORE, limit))
    if dialect == "postgres":  # MySQL has no shared locks
        targets += [Target("rw0", Kind.READ), Target("rw0", Kind.WRITE)]
    return targets


@pytest.mark.parametrize("dialect", DIALECTS)
@examples
@given(data=st.data())
async def test_random_operations_keep_exclusion_fencing_and_the_pool(
    dialect: str, url: str, probe: Probe, data: st.DataObject
) -> None:
    bounds = [
        (data.draw(st.integers(1, 3), label="max_connections"), data.draw(st.integers(0, 3)))
        for _ in range(CLIENTS)
    ]
    wait_slice = data.draw(st.sampled_from([0.05, 1.0]), label="wait_slice")
    targets = _targets(dialect, data.draw(st.integers(1, 3), label="semaphore limit"))
    namespace = f"sqlprop{uuid.uuid4().hex[:10]}"
    sessions_before = await probe.sessions()
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                aiodlock.connect(
                    url,
                    namespace=namespace,
                    max_connections=max_connections,
                    max_idle=max_idle,
                    wait_slice=wait_slice,
                    connect_timeout=CONNECT_TIMEOUT,
                    # Sweeps on: this test found a sweep waiting in the janitor for a free
                    # connection ahead of the clean-up that would free one (max_connections=1).
                    fence_ttl=1,
                )
            )
            for max_connections, max_idle in bounds
        ]
        run = Run(clients, bounds, targets)
        # One slot per connection a client may open: each holds or waits on one.
        run.slots = [Slot(c) for c, (most, _) in enumerate(bounds) for _ in range(most)]
        try:
            await _operate(run, data)
            await _wind_down(run)
            for client in clients:
                await settle(client)
            run.check()
            for client, (_, max_idle) in zip(clients, bounds, strict=True):
                stats = client.statistics()
                pool = stats.backend
                assert (stats.leases, stats.cleanups) == (0, 0), stats
                assert (pool["held"], pool["waiters"], pool["connection_waits"]) == (0, 0, 0)
                # Every lent connection back idle (none leaked), within max_idle; the rest
                # are the shared sessions (2 by default), which hold nothing now.
                assert pool["idle"] <= max_idle, pool
                assert pool["connections"] == pool["idle"] + pool["shared_sessions"], pool
                assert pool["shared_sessions"] <= 2 and pool["shared_leases"] == 0, pool
                assert await client.inspect() == []
            run.check_fencing()
            assert await probe.leftovers(namespace) == []
        finally:
            for slot in run.slots:
                if slot.pending is not None:
                    slot.pending.cancel()
            await asyncio.gather(
                *(s.pending for s in run.slots if s.pending is not None), return_exceptions=True
            )
    for client in clients:
        assert client.statistics().backend["connections"] == 0

    async def all_closed() -> bool:
        return await probe.sessions() <= sessions_before

    await eventually(all_closed, timeout=5)


async def _operate(run: Run, data: st.DataObject) -> None:
    """A random sequence of operations, each checked after it ran.

    Every step draws the same things whatever the state (which the servers' timing decides):
    Hypothesis replays a choice sequence only if its draws do not depend on the run.
    """
    ops = ["try", "acquire", "background", "cancel", "release", "pause", "settle"]
    for _ in range(data.draw(st.integers(1, 20), label="steps")):
        slot = run.slots[data.draw(st.integers(0, len(run.slots) - 1), label="slot")]
        target = data.draw(st.sampled_from(run.targets), label="target")
        op = data.draw(st.sampled_from(ops), label="op")
        timeout = data.draw(st.sampled_from(TIMEOUTS), label="timeout")
        pause = data.draw(st.sampled_from([0, 0.01, 0.05]), label="pause")
        cancel_after = data.draw(CANCEL_STEPS, label="cancel after")
        release_cancel_after = data.draw(st.none() | CANCEL_STEPS, label="cancel release after")
        if slot.pending is not None and slot.pending.done():
            await slot.pending  # a failed background acquire fails here
            slot.pending = None
        if op == "pause" or (op == "release" and slot.grant is None):
            await asyncio.sleep(pause)
        elif op == "settle":  # while others may still hold or wait
            await settle(run.clients[slot.client])
        elif slot.pending is not None:
            # Busy waiting: cancel the wait at a random point (or it finishes first).
            await cancelled_after(slot.pending, cancel_after, run.check)
            slot.pending = None
        elif slot.grant is not None:
            await run.release(slot, release_cancel_after)
        elif op == "try":
            await run.take(slot, target, None)
        elif op == "acquire":
            await run.take(slot, target, timeout)
        elif op == "background":
            slot.pending = asyncio.create_task(run.take(slot, target, timeout))
        else:
            await cancelled_after(run.take(slot, target, 5.0), cancel_after, run.check)
        run.check()


async def _wind_down(run: Run) -> None:
    """Release everything; waiters still in the background get the lock (or time out), and
    give it back in turn."""
    while True:
        for slot in run.slots:
            if slot.grant is not None:
                await run.release(slot, None)
                run.check()
        waiting = [s.pending for s in run.slots if s.pending is not None]
        if not waiting:
            return
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for slot in run.slots:
            if slot.pending is not None and slot.pending.done():
                await slot.pending
                slot.pending = None
        run.check()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_sweep_never_holds_up_the_clean_up_that_frees_the_only_connection(
    url: str,
) -> None:
    """Found by the property test above: the first grant queues a fencing-row sweep; a release
    cancelled mid-statement leaves the one connection in doubt. The sweep must not wait for a
    connection ahead of the clean-up that frees it (every checkout would then wait the whole
    ``connect_timeout``)."""
    namespace = f"sqlsweep{uuid.uuid4().hex[:10]}"
    async with aiodlock.connect(
        url, namespace=namespace, max_connections=1, connect_timeout=60, fence_ttl=1
    ) as locks:
        lock = locks.lock("only")
        for steps in range(1, 6):  # cancel the release at different points of its statement
            lease = await lock.acquire()
            release = asyncio.ensure_future(lease.release())
            for _ in range(steps):
                await asyncio.sleep(0)
            release.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await release
            # Far below connect_timeout: the clean-up ran, the connection is free again.
            async with asyncio.timeout(20):
                await settle(locks)
                async with lock:
                    pass
        await settle(locks)
        stats = locks.statistics().backend
        assert stats["connections"] - stats["shared_sessions"] <= 1
        assert stats["connection_waits"] == 0
