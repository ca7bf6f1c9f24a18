"""``locks.lock_all([...])``: several locks, all or nothing.

On memory://: the leases come back in the caller's order but are taken in the canonical one
(name, then family), arguments are checked, one deadline covers them all, a timeout, an error
or a cancellation at any await point leaves nothing held, and a lost lease cancels the body
with a LockLostError naming it. On memory://, real Redis and ZooKeeper (a session backend):
two clients asking for ``[a, b]`` and ``[b, a]`` 50 times each never deadlock nor overlap,
and a lock broken by another client cancels the body naming that lock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Final

import pytest
import pytest_asyncio

import aiodlock
from aiodlock.testing import History, settle
from tests.helpers import wait_until

ROUNDS: Final = 50


def _memory_url() -> str:
    return f"memory://lock-all-{uuid.uuid4().hex[:8]}"


@pytest_asyncio.fixture
async def clients() -> AsyncIterator[tuple[aiodlock.LockClient, aiodlock.LockClient]]:
    """Two clients of one memory:// service: one under test, one standing in for others."""
    url = _memory_url()
    async with aiodlock.connect(url) as locks, aiodlock.connect(url) as other:
        yield locks, other


async def _all_free(other: aiodlock.LockClient, *names: str) -> None:
    """Every named mutex can be taken by another client right now (then given back)."""
    for name in names:
        lease = await other.lock(name).try_acquire()
        assert lease is not None, f"{name!r} was left held"
        await lease.release()


async def _nothing_left(locks: aiodlock.LockClient, other: aiodlock.LockClient) -> None:
    for client in (locks, other):
        await settle(client)
    assert locks.statistics().leases == 0
    assert await other.inspect() == []


# ---------------------------------------------------------------------- behaviour (memory)


@pytest.mark.memory
async def test_mixed_kinds_held_together_leases_in_callers_order(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    locks, other = clients
    async with locks.lock_all(
        ["m", locks.read_lock("r"), locks.write_lock("w"), locks.semaphore("s", limit=2)],
        timeout=5,
    ) as leases:
        assert [lease.name for lease in leases] == ["m", "r", "w", "s"]
        assert all(lease.held for lease in leases)
        assert locks.statistics().leases == 4
        assert await other.lock("m").try_acquire() is None
        assert await other.write_lock("r").try_acquire() is None
        assert await other.read_lock("w").try_acquire() is None
        permit = await other.semaphore("s", limit=2).try_acquire()  # one permit of two left
        assert permit is not None
        assert await other.semaphore("s", limit=2).try_acquire() is None
        await permit.release()
    assert not any(lease.held for lease in leases)
    await _all_free(other, "m")
    writer = await other.write_lock("r").try_acquire()
    assert writer is not None
    await writer.release()
    await _nothing_left(locks, other)


@pytest.mark.memory
async def test_taken_in_canonical_order_whatever_the_callers(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    # memory:// hands out one rising fencing counter for all its locks: the tokens show the
    # order of the grants. By name, then family (mutex before semaphore for one name).
    locks, _ = clients
    wanted = locks.lock_all(["c", locks.semaphore("a", limit=1), "b", "a"])
    async with wanted as (c, a_sem, b, a_mutex):
        assert (c.name, a_sem.name, b.name, a_mutex.name) == ("c", "a", "b", "a")
        tokens = [a_mutex.fencing_token, a_sem.fencing_token, b.fencing_token, c.fencing_token]
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == 4


@pytest.mark.memory
async def test_arguments_are_checked(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    locks, other = clients
    with pytest.raises(ValueError, match="the same lock twice"):
        locks.lock_all(["a", "a"])
    with pytest.raises(ValueError, match="the same lock twice"):
        locks.lock_all(["a", locks.lock("a")])
    with pytest.raises(ValueError, match="the same lock twice"):
        locks.lock_all([locks.read_lock("b"), locks.write_lock("b")])  # one reader/writer lock
    with pytest.raises(ValueError, match="another client"):
        locks.lock_all(["a", other.lock("b")])
    with pytest.raises(TypeError, match="not str"):
        locks.lock_all("ab")
    with pytest.raises(TypeError, match="item 1"):
        locks.lock_all(["a", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="timeout"):
        locks.lock_all(["a"], timeout=-1)
    # One name in three families: three different locks.
    async with locks.lock_all(["a", locks.read_lock("a"), locks.semaphore("a", limit=1)]) as got:
        assert len(got) == 3
    async with locks.lock_all([]) as nothing:
        assert nothing == ()


@pytest.mark.memory
async def test_timeout_releases_what_was_taken(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    locks, other = clients
    blocker = await other.lock("b").acquire()
    with pytest.raises(aiodlock.LockTimeoutError, match="'b'"):
        async with locks.lock_all(["c", "b", "a"], timeout=0.2):
            pytest.fail("entered without 'b'")
    await _all_free(other, "a", "c")
    with pytest.raises(aiodlock.LockTimeoutError):  # 0: one attempt each
        async with locks.lock_all(["a", "b"], timeout=0):
            pytest.fail("entered without 'b'")
    await blocker.release()
    async with locks.lock_all(["a", "b"], timeout=0) as leases:
        assert all(lease.held for lease in leases)
    await _nothing_left(locks, other)


@pytest.mark.memory
async def test_one_deadline_for_all(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    # 'a' comes free after 0.6 s, 'b' never: with one 1 s deadline the whole call gives up at
    # 1 s; a timeout per lock would wait 0.6 + 1 s.
    locks, other = clients
    first = await other.lock("a").acquire()
    second = await other.lock("b").acquire()

    async def free_a_later() -> None:
        await asyncio.sleep(0.6)  # the scenario's timing, not a synchronisation
        await first.release()

    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as group:
        group.create_task(free_a_later())
        started = loop.time()
        with pytest.raises(aiodlock.LockTimeoutError, match="'b'"):
            async with locks.lock_all(["b", "a"], timeout=1.0):
                pytest.fail("entered without 'b'")
        elapsed = loop.time() - started
    assert 0.9 <= elapsed < 1.5, elapsed
    await second.release()
    await _nothing_left(locks, other)


@pytest.mark.memory
async def test_an_error_on_the_way_in_releases_what_was_taken(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    locks, other = clients
    async with locks.lock("b"):
        # '0' is taken first, then 'b' refuses: this task holds it, and it is not reentrant.
        with pytest.raises(RuntimeError, match="already holds"):
            async with locks.lock_all(["b", "0"]):
                pytest.fail("entered")
        await _all_free(other, "0")
    await _nothing_left(locks, other)


@pytest.mark.memory
async def test_body_error_and_outside_cancellation_release_all(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    locks, other = clients
    with pytest.raises(ZeroDivisionError):
        async with locks.lock_all(["a", "b"]):
            1 / 0  # noqa: B018
    await _all_free(other, "a", "b")
    entered = asyncio.Event()

    async def hold() -> None:
        async with locks.lock_all(["a", "b"]):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(hold())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _all_free(other, "a", "b")
    await _nothing_left(locks, other)


@pytest.mark.memory
@pytest.mark.parametrize("contended", [True, False])
@pytest.mark.parametrize("steps", range(12))
async def test_cancel_at_each_await_point_leaves_nothing(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient], steps: int, contended: bool
) -> None:
    """Cancel after 0, 1, 2... loop iterations, on the way in (the last lock is held by
    another client) or anywhere (nothing is contended): nothing may remain."""
    locks, other = clients
    holder = await other.lock("c").acquire() if contended else None
    entered = asyncio.Event()

    async def take_all() -> None:
        async with locks.lock_all(["c", locks.read_lock("b"), "a"]):
            entered.set()
            await asyncio.sleep(0)

    task = asyncio.create_task(take_all())
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        assert entered.is_set()  # it won the race against cancel(): it ran its body
    if holder is not None:
        assert not entered.is_set()
        await holder.release()
    await _all_free(other, "a", "c")
    writer = await other.write_lock("b").try_acquire()
    assert writer is not None
    await writer.release()
    await _nothing_left(locks, other)


@pytest.mark.memory
async def test_losing_two_leases_at_once_is_one_loss(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    locks, other = clients
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(aiodlock.LockLostError, match="'a'"):  # the outermost lost lock
        async with locks.lock_all(["b", "a", "c"]):
            assert await other.break_lock("c") == 1
            assert await other.break_lock("a") == 1
            await asyncio.Event().wait()
    assert task.cancelling() == 0
    await asyncio.sleep(0)  # a stray cancellation would land here
    await _all_free(other, "a", "b", "c")
    await _nothing_left(locks, other)


@pytest.mark.memory
async def test_a_loss_while_waiting_for_the_next_lock_ends_the_wait(
    clients: tuple[aiodlock.LockClient, aiodlock.LockClient],
) -> None:
    locks, other = clients
    blocker = await other.lock("b").acquire()
    waiting = asyncio.create_task(locks.lock_all(["b", "a"]).__aenter__())
    await wait_until(lambda: locks.statistics().leases == 1)  # 'a' held, waiting for 'b'
    assert await other.break_lock("a") == 1
    with pytest.raises(aiodlock.LockLostError, match="'a'"):
        async with asyncio.timeout(10):
            await waiting
    await blocker.release()
    await _all_free(other, "a", "b")
    await _nothing_left(locks, other)


# ---------------------------------------------------------------------- memory, Redis, ZooKeeper

BACKENDS = [
    pytest.param("memory", marks=pytest.mark.memory),
    pytest.param("redis_url", marks=pytest.mark.redis),
    pytest.param("zookeeper", marks=pytest.mark.zookeeper),
]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return _memory_url()
    if request.param == "zookeeper":
        return str(request.getfixturevalue("zookeeper_server").url)
    return str(request.getfixturevalue(request.param))


async def test_opposite_orders_never_deadlock_nor_overlap(url: str) -> None:
    namespace = f"lock-all-{uuid.uuid4().hex[:8]}"
    history = History()

    async def worker(client: aiodlock.LockClient, who: str, order: list[str]) -> None:
        for _ in range(ROUNDS):
            # Taken in the caller's order, two such callers would soon each hold one lock and
            # wait for the other: the 20 s timeout would end it with LockTimeoutError.
            async with client.lock_all(order, timeout=20) as leases:
                a = leases[order.index("a")]
                with history.hold(who, a.fencing_token):
                    await asyncio.sleep(0)

    async with (
        aiodlock.connect(url, namespace=namespace) as one,
        aiodlock.connect(url, namespace=namespace) as two,
        asyncio.timeout(120),
        asyncio.TaskGroup() as group,
    ):
        group.create_task(worker(one, "one", ["a", "b"]))
        group.create_task(worker(two, "two", ["b", "a"]))
    assert len(history.holds) == 2 * ROUNDS
    history.check(max_holders=1)


async def test_a_broken_lease_cancels_the_body_naming_it(url: str) -> None:
    namespace = f"lock-all-{uuid.uuid4().hex[:8]}"
    async with (
        aiodlock.connect(url, namespace=namespace) as holder,
        aiodlock.connect(url, namespace=namespace) as operator,
    ):
        entered = asyncio.Event()
        reached_the_end = False

        async def hold() -> None:
            nonlocal reached_the_end
            async with holder.lock_all(["x", "y", "z"]):
                entered.set()
                await asyncio.Event().wait()  # until the break cancels it
                reached_the_end = True

        body = asyncio.create_task(hold())
        await entered.wait()
        assert await operator.break_lock("y") == 1
        with pytest.raises(aiodlock.LockLostError, match="'y'") as lost:
            async with asyncio.timeout(15):
                await body
        assert "'x'" not in str(lost.value)
        assert "'z'" not in str(lost.value)
        assert not reached_the_end
        await settle(holder)
        assert holder.statistics().leases == 0
        # The other two were released, not left to expire: free at once.
        async with operator.lock_all(["x", "y", "z"], timeout=0) as leases:
            assert all(lease.held for lease in leases)
