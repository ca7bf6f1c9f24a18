"""Cancellation: from outside, at every await point, in the loss turn, and as a storm; a
body's own exception passes through unwrapped."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Final

import pytest

import aiodlock

from .. import History
from ._fixtures import Target
from ._needs import LockKind

__all__ = [
    "test_body_exception_in_the_loss_turn_is_not_a_cancellation",
    "test_body_exception_passes_through_unwrapped",
    "test_cancel_at_each_await_point_leaves_nothing",
    "test_cancellation_storm_makes_progress_and_leaves_nothing",
    "test_outside_cancellation_stays_cancelled_and_releases",
]


@pytest.mark.asyncio
async def test_outside_cancellation_stays_cancelled_and_releases(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    entered = asyncio.Event()

    async def hold() -> None:
        async with make(locks, "cancel-me"):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(hold())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    lease = await make(other, "cancel-me").try_acquire()
    assert lease is not None
    await lease.release()


@pytest.mark.asyncio
async def test_body_exception_passes_through_unwrapped(
    locks: aiodlock.LockClient, other: aiodlock.LockClient, make: LockKind
) -> None:
    with pytest.raises(ZeroDivisionError):
        async with make(locks, "oops"):
            1 / 0  # noqa: B018
    lease = await make(other, "oops").try_acquire()
    assert lease is not None
    await lease.release()


@pytest.mark.asyncio
@pytest.mark.parametrize("steps", range(12))
async def test_cancel_at_each_await_point_leaves_nothing(
    locks: aiodlock.LockClient,
    other: aiodlock.LockClient,
    make: LockKind,
    aiodlock_target: Target,
    steps: int,
) -> None:
    """Cancel a waiting acquire after 0, 1, 2... loop iterations: nothing may remain."""
    holder = await make(other, "contended").acquire()
    free_task = asyncio.create_task(make(locks, "free").acquire())
    waiting_task = asyncio.create_task(make(locks, "contended").acquire())
    for _ in range(steps):
        await asyncio.sleep(0)
    free_task.cancel()
    waiting_task.cancel()
    for task in (free_task, waiting_task):
        try:
            lease = await task
        except asyncio.CancelledError:
            continue
        await lease.release()  # it won the race against cancel(): a normal lease
    await holder.release()
    await aiodlock_target.assert_no_leftovers(locks, other)
    assert locks.statistics().leases == 0


async def _stall_loop(after: float, seconds: float) -> None:
    await asyncio.sleep(after)
    time.sleep(seconds)  # noqa: ASYNC251 - the fault: a loop stalled past the lease


@pytest.mark.asyncio
@pytest.mark.parametrize("ending", ["own-error", "assert-held"])
@pytest.mark.parametrize("delay", [0.02, 0.2, 0.3])
async def test_body_exception_in_the_loss_turn_is_not_a_cancellation(
    locks: aiodlock.LockClient, make: LockKind, ending: str, delay: float
) -> None:
    """The loop stalls past the lease (ttl 0.2 s) while the body waits, so the watchdog's
    deadline and the body's timer fire in one turn. Whatever their order, the caller sees the
    body's own error or a bare LockLostError — never a CancelledError nobody asked for — and
    the task's cancel count is back to zero (a stray one would cancel its next await). The
    stall begins once the lock is held: one that began while the acquire was still under way
    (slow servers, several Redlock masters) would fail the acquire instead."""
    task = asyncio.current_task()
    assert task is not None
    outcome: BaseException | None = None
    leases: list[aiodlock.Lease] = []
    async with asyncio.TaskGroup() as group:
        try:
            async with make(locks, "stalled", ttl=0.2) as lease:
                leases.append(lease)
                group.create_task(_stall_loop(0.01, 0.4))
                await asyncio.sleep(delay)
                if ending == "assert-held":
                    lease.assert_held()
                raise ValueError("the body's own error")
        except BaseException as exc:  # whatever it is: a CancelledError must fail below
            outcome = exc
        assert task.cancelling() == 0
    await asyncio.sleep(0)  # a stray cancellation would land here
    assert leases, f"the lock was not even granted: {outcome!r}"
    if isinstance(outcome, aiodlock.LockLostError):
        # The block reports a loss that happened (assert_held() also refuses a lease past its
        # local validity that a session backend still held: no loss of the lease itself).
        assert ending == "assert-held" or leases[0].lost.is_set()
    else:
        # Not a CancelledError, nor an error of the library's: the body's own one.
        assert isinstance(outcome, ValueError), repr(outcome)
        assert outcome.args == ("the body's own error",)
        assert ending == "own-error" or delay == 0.02, "assert_held() passed after the lease"
    assert locks.statistics().leases == 0


STORM_SECONDS: Final = 3.0


STORM_TASKS: Final = 20  # per client


STORM_MIN_GRANTS: Final = 12


STORM_GIVE_UP: Final = 15.0  # seconds; a storm short of STORM_MIN_GRANTS goes on until then


@pytest.mark.asyncio
async def test_cancellation_storm_makes_progress_and_leaves_nothing(
    locks: aiodlock.LockClient,
    other: aiodlock.LockClient,
    make: LockKind,
    aiodlock_target: Target,
) -> None:
    """Tasks of two clients contend for one lock and are cancelled at random await points
    (waiting, acquiring, holding, releasing) for a few seconds, while one patient task per
    client takes the lock again and again without a timeout. Exclusion holds, the lock keeps
    being granted — a waiter that gives up must not hold up the ones behind it, even in a
    strict FIFO queue — and afterwards nothing is left on the service and the lock is free.
    """
    history = History()
    loop = asyncio.get_running_loop()
    started = loop.time()
    grants = 0

    def storming() -> bool:
        # STORM_SECONDS, then on until the floor of grants is reached, for up to STORM_GIVE_UP:
        # a slow machine takes longer to reach it, a jammed queue never does.
        elapsed = loop.time() - started
        return elapsed < STORM_SECONDS or (grants < STORM_MIN_GRANTS and elapsed < STORM_GIVE_UP)

    async def contender(client: aiodlock.LockClient, who: str, *, patient: bool) -> None:
        nonlocal grants
        while storming():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if patient else random.uniform(0, 0.05)):
                    async with make(client, "storm", ttl=5) as lease:
                        with history.hold(who, lease.fencing_token):
                            grants += 1
                            await asyncio.sleep(random.uniform(0, 0.002))
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as group:
        for client, who in ((locks, "a"), (other, "b")):
            group.create_task(contender(client, f"{who}-patient", patient=True))
            for i in range(STORM_TASKS):
                group.create_task(contender(client, f"{who}{i}", patient=False))
    stormed = loop.time() - started
    history.check(max_holders=1)
    # A healthy lock makes hundreds of grants here; a queue that jams on cancelled waiters
    # makes none or one (ZooKeeper's did: 0-7 in 15 s). A strict FIFO queue on a consensus
    # service (fair=True on ZooKeeper or etcd: an entry per task) is the slow healthy case:
    # each abandoned entry ahead of a waiter costs a delete and a watch event, 17-20 grants
    # in 3 s on a slow 2-core machine, fewer when it is loaded. The floor sits between the
    # two, and the storm goes on past STORM_SECONDS until it is reached (a loaded machine is
    # slow, not jammed), up to STORM_GIVE_UP: the jam's 0-7 in 15 s stays below it.
    assert grants >= STORM_MIN_GRANTS, f"{grants} grants in {stormed:.1f} s"
    await aiodlock_target.assert_no_leftovers(locks, other)
    freed = loop.time()
    async with make(other, "storm", ttl=5, timeout=5):
        pass  # free again at once: no orphan holder or queue entry blocks it
    assert loop.time() - freed < 5
    assert locks.statistics().leases == other.statistics().leases == 0
