"""How ``async with lock`` ends when the lease is lost in the same loop turn as the body ends.

A blocking call in another task stalls the loop past the lease's validity, so that when the
loop runs again the watchdog's deadline and the body's own timer are both overdue and fire in
one turn. Whatever the order, the caller must see the body's own exception or a bare
``LockLostError`` — never a ``CancelledError`` nobody asked for — and the task's cancel count
must be back to zero (a stray count would cancel the caller's next ``await``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import pytest

import aiodlock
from aiodlock import Lease

pytestmark = pytest.mark.memory

TTL = 0.2


async def _stall_loop(after: float, seconds: float) -> None:
    await asyncio.sleep(after)
    time.sleep(seconds)  # noqa: ASYNC251 - the point: a loop stalled past the lease


async def _run(body: Callable[[Lease], Awaitable[None]]) -> BaseException | None:
    async with aiodlock.connect(f"memory://guard-{id(body)}") as locks:
        task = asyncio.current_task()
        assert task is not None
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_stall_loop(0.01, TTL * 2))
            outcome: BaseException | None = None
            try:
                async with locks.lock("stalled", ttl=TTL) as lease:
                    await body(lease)
            except BaseException as exc:  # whatever it is: the tests check what it may be
                outcome = exc
            assert task.cancelling() == 0
        await asyncio.sleep(0)  # a stray cancellation would land here
        assert locks.statistics().leases == 0
    return outcome


@pytest.mark.parametrize("delay", [0.02, TTL, TTL * 1.5])
async def test_body_exception_in_the_loss_turn_is_not_a_cancellation(delay: float) -> None:
    async def body(lease: Lease) -> None:
        await asyncio.sleep(delay)
        raise ValueError("the body's own error")

    outcome = await _run(body)
    # Timer order decides whether the body ran before or after the watchdog's turn: the
    # body's own error (not one of the library's), or a bare LockLostError; never a
    # CancelledError, nor nothing at all.
    if not isinstance(outcome, aiodlock.LockLostError):
        assert isinstance(outcome, ValueError), repr(outcome)
        assert outcome.args == ("the body's own error",)


@pytest.mark.parametrize("delay", [0.02, TTL, TTL * 1.5])
async def test_assert_held_in_the_loss_turn_raises_lock_lost(delay: float) -> None:
    async def body(lease: Lease) -> None:
        await asyncio.sleep(delay)
        lease.assert_held()

    outcome = await _run(body)
    assert isinstance(outcome, aiodlock.LockLostError)


async def test_body_that_swallows_the_cancellation_still_reports_the_loss() -> None:
    async def body(lease: Lease) -> None:
        # A careless body; the block must still say the lease was lost.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(TTL * 10)

    outcome = await _run(body)
    assert isinstance(outcome, aiodlock.LockLostError)


async def test_outside_cancellation_wins_over_the_loss() -> None:
    async with aiodlock.connect("memory://guard-outside") as locks:
        entered = asyncio.Event()

        async def holder() -> None:
            async with locks.lock("both", ttl=TTL):
                entered.set()
                await asyncio.sleep(TTL * 10)

        stalled = asyncio.Event()

        async def stall() -> None:
            await _stall_loop(0, TTL * 2)
            stalled.set()

        task = asyncio.create_task(holder())
        await entered.wait()
        _stall = asyncio.create_task(stall())
        # Right after the stall, with the watchdog's deadline overdue: the loss and this
        # cancellation meet in one turn (not a cancellation guessed to land after the stall).
        await stalled.wait()
        assert not task.done()
        task.cancel()  # lost and cancelled from outside: the outside cancellation wins
        with pytest.raises(asyncio.CancelledError):
            await task
        await _stall
        assert locks.statistics().leases == 0


async def test_release_that_finds_the_lock_gone_raises_lock_lost() -> None:
    """The lease vanished (a restart, FLUSHALL, an operator) and the body ended before the
    watchdog's next renewal noticed: the release proves it, and the block must say so."""
    from aiodlock.backends import Kind, LockSpec

    async with aiodlock.connect("memory://guard-found") as locks:
        with pytest.raises(aiodlock.LockLostError, match="found expired or taken"):
            async with locks.lock("vanishing", ttl=30) as lease:
                spec = LockSpec(locks.namespace, "vanishing", Kind.MUTEX)
                assert await locks.backend.break_lock(spec) == 1  # type: ignore[attr-defined]
        assert lease.lost.is_set()
        assert not lease.held

        # Outside `async with`: release() raises LockNotOwnedError, and `lost` is set too.
        lease = await locks.lock("vanishing", ttl=30).acquire()
        assert await locks.backend.break_lock(spec) == 1  # type: ignore[attr-defined]
        with pytest.raises(aiodlock.LockNotOwnedError):
            await lease.release()
        assert lease.lost.is_set()
