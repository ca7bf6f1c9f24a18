"""The wakeup of a Redlock waiter: :class:`QuorumWaiter`, one pub/sub waiter per master
(each on that master's :class:`~._pubsub.PubSubHub`), armed once a majority confirmed.

Example::

    async with QuorumWaiter([hub.waiter(channel, owner) for hub in hubs], 2, spawn) as w:
        await w.wait(1.0)  # woken by a release on any master, or after 1 s
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from .. import BackendError

if TYPE_CHECKING:
    from ._pubsub import PubSubWaiter

__all__ = ["DEGRADED_POLL", "LEAD_GRACE", "QuorumWaiter"]

DEGRADED_POLL: Final = 0.25
"""Seconds a waiter waits at most while too few masters are subscribed to hear a release."""

LEAD_GRACE: Final = 0.1
"""Seconds a wakeup heard from another master waits for one from the lead master: a release
the lead did not confirm (its master hung, or the releaser cannot reach it) is published on
the others, and still wakes the waiter, this much later."""


class QuorumWaiter:
    """A waiting acquisition subscribed on every master, armed once ``need`` confirmed.

    A master that does not confirm in time (down, stopped) is left to arm in the background;
    it joins the wait once it does. Any master's wakeup wakes the waiter -- but with a
    ``lead`` master (a mutex's arbiter, whose release wakes one waiting client: see
    :mod:`._redlock_wake`), the wait is on the lead alone while its waiter is armed, and a
    wakeup from another master (a release the arbiter did not confirm, a give-back, a break)
    wakes it :data:`LEAD_GRACE` later unless the lead's own came meanwhile: the re-check
    that follows any wakeup covers every release before it; entering waits for the lead as
    well as for ``need`` masters (a silent lead is given up after :data:`DEGRADED_POLL`).
    While fewer than ``need`` are armed (a majority of masters down), entering gives up after
    :data:`DEGRADED_POLL` and each wait is capped by it: the caller polls until the masters
    are back, and its attempts report them down (``BackendError``) or its deadline passes.
    """

    __slots__ = (
        "_armed",
        "_grace",
        "_lead",
        "_left",
        "_need",
        "_spawn",
        "_tasks",
        "_waiters",
    )

    def __init__(
        self,
        waiters: list[PubSubWaiter],
        need: int,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None] | None],
        *,
        left: Callable[..., object] = lambda failed: None,
        lead: int | None = None,
    ) -> None:
        self._waiters = waiters
        self._lead = None if lead is None else waiters[lead]
        # The timer of a wakeup from another master that the lead has not matched (yet).
        self._grace: asyncio.TimerHandle | None = None
        if self._lead is not None:
            for w in waiters:
                w.on_wake = partial(self._woke, w)
        self._need = need
        self._spawn = spawn
        self._left = left  # called as the waiter leaves (entered or not), with failed=
        self._armed: list[PubSubWaiter] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def _arm(self, w: PubSubWaiter) -> None:
        try:
            await w.__aenter__()
        except Exception:  # a master that is down: the others may do
            return
        self._armed.append(w)

    async def __aenter__(self) -> QuorumWaiter:
        lead: asyncio.Task[None] | None = None
        for w in self._waiters:
            if w.ready:
                await self._arm(w)  # its channel is live: no wait, and no task to run it
                continue
            task = self._spawn(self._arm(w))
            if task is not None:
                self._tasks.append(task)
                if w is self._lead:
                    lead = task
        try:
            pending = set(self._tasks)
            async with asyncio.timeout(DEGRADED_POLL):
                # The lead too, unless it fails: the re-check that follows registers the
                # client on the lead's master only while its channel there is live.
                while pending and (len(self._armed) < self._need or lead in pending):
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            pass  # too few masters answer: armed where they do, polling meanwhile (wait())
        except BaseException:
            await self._leave(failed=True)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._leave(failed=exc_type is not None)

    def _woke(self, w: PubSubWaiter) -> None:
        """Another master's wakeup starts the grace timer (unless the lead's is banked: the
        re-check still to come covers it); the lead's own cancels it."""
        lead = self._lead
        if w is not lead:
            if self._grace is None and not (lead is not None and lead.woken):
                loop = asyncio.get_running_loop()
                self._grace = loop.call_later(LEAD_GRACE, self._grace_over)
        elif self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _grace_over(self) -> None:
        self._grace = None
        if self._lead is not None:
            self._lead.wake(False)  # as the lead's own wakeup would have

    async def _leave(self, *, failed: bool) -> None:
        self._left(failed=failed)
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        for task in self._tasks:
            task.cancel()  # still arming: its waiter leaves as the cancellation lands
        armed, self._armed = self._armed, []
        for w in armed:
            if failed:
                await w.__aexit__(BackendError, None, None)
            else:
                await w.__aexit__(None, None, None)

    async def wait(self, timeout: float | None) -> None:
        """Return when any master woke us, or after ``timeout`` seconds (at most
        :data:`DEGRADED_POLL` while fewer than a quorum of masters are armed: a release
        published on the others would not reach us)."""
        armed = list(self._armed)
        if len(armed) < self._need:
            timeout = DEGRADED_POLL if timeout is None else min(timeout, DEGRADED_POLL)
        elif self._lead in armed and self._lead.active:
            await self._lead_only(self._lead, armed, timeout)
            return
        if len(armed) == 1:
            await armed[0].wait(timeout)
            return
        if not armed:
            if timeout is not None:
                await asyncio.sleep(max(timeout, 0))
            return
        first = asyncio.get_running_loop().create_future()

        async def one(w: PubSubWaiter) -> None:
            await w.wait(timeout)
            if not first.done():
                first.set_result(None)

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(w)) for w in armed]
            await first
            for task in tasks:
                task.cancel()

    async def _lead_only(
        self, lead: PubSubWaiter, armed: list[PubSubWaiter], timeout: float | None
    ) -> None:
        """Wait on the lead alone. The others' wakeups start the grace timer (:meth:`_woke`)
        as they come, and are used up before and after the wait (the re-check that follows
        covers them):
        a waiter left flagged as woken is passed over by its hub's "wake one", and the next
        release on that master would go unheard."""
        others = [w for w in armed if w is not lead]
        for w in others:
            await w.wait(0)  # returns at once, without a loop step
        await lead.wait(timeout)
        for w in others:
            await w.wait(0)
