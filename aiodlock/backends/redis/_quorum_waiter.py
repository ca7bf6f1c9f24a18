"""The wakeup of a Redlock waiter: :class:`QuorumWaiter`, one pub/sub waiter per master
(each on that master's :class:`~._pubsub.PubSubHub`), armed once a majority confirmed.

Example::

    async with QuorumWaiter([hub.waiter(channel, owner) for hub in hubs], 2, spawn) as w:
        await w.wait(1.0)  # woken by a release on any master, or after 1 s
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ..._exceptions import BackendError

if TYPE_CHECKING:
    from ._pubsub import PubSubWaiter

__all__ = ["DEGRADED_POLL", "QuorumWaiter"]

DEGRADED_POLL: Final = 0.25
"""Seconds a waiter waits at most while too few masters are subscribed to hear a release."""


class QuorumWaiter:
    """A waiting acquisition subscribed on every master, armed once ``need`` confirmed.

    A master that does not confirm in time (down, stopped) is left to arm in the background;
    it joins the wait once it does. Any master's wakeup wakes the waiter. While fewer than
    ``need`` are armed (a majority of masters down), entering gives up after
    :data:`DEGRADED_POLL` and each wait is capped by it: the caller polls until the masters
    are back, and its attempts report them down (``BackendError``) or its deadline passes.
    """

    __slots__ = ("_armed", "_left", "_need", "_spawn", "_tasks", "_waiters")

    def __init__(
        self,
        waiters: list[PubSubWaiter],
        need: int,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any] | None],
        *,
        left: Callable[[], object] = lambda: None,
    ) -> None:
        self._waiters = waiters
        self._need = need
        self._spawn = spawn
        self._left = left  # called once the waiter has left (entered or not)
        self._armed: list[PubSubWaiter] = []
        self._tasks: list[asyncio.Task[Any]] = []

    async def _arm(self, w: PubSubWaiter) -> BaseException | None:
        try:
            await w.__aenter__()
        except Exception as exc:  # a master that is down: the others may do
            return exc
        self._armed.append(w)
        return None

    async def __aenter__(self) -> QuorumWaiter:
        for w in self._waiters:
            task = self._spawn(self._arm(w))
            if task is not None:
                self._tasks.append(task)
        try:
            pending = set(self._tasks)
            async with asyncio.timeout(DEGRADED_POLL):
                while pending and len(self._armed) < self._need:
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

    async def _leave(self, *, failed: bool) -> None:
        self._left()
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
