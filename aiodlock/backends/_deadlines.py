"""A time limit per request that costs no timer per request: :class:`Deadlines`.

``asyncio.timeout`` (and asyncpg's ``timeout=``) puts a timer handle in the loop's heap for
every call, about 4 us each on this path: two requests per acquire and release make that a
tenth of an uncontended cycle's client work. The backends bound their usual requests with this
instead: Redis commands (which run without redis-py's ``socket_timeout``, see
:mod:`.redis._node`), and the grant and release statements of MySQL and PostgreSQL.

Example (what a backend does around one request)::

    deadlines = Deadlines(5.0)
    rows = await deadlines.bound(connection.fetch(sql))  # TimeoutError after 5 s
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Final, TypeAlias, TypeVar

__all__ = ["EARLY", "Deadlines", "Limit"]

T = TypeVar("T")

EARLY: Final = 0.001
"""How early a loop may fire a timer (uvloop counts in milliseconds). A request is never cut
off before its limit: a timer that fires early is armed again this much after the deadline."""


class Deadlines:
    """Bounds every request by ``limit`` seconds for a dict entry per request.

    Each request notes its deadline in a dict, in the order the requests started: with one
    limit for all, that is also the order their deadlines fall due, so one loop timer, armed
    for the oldest, is enough. When it fires it cancels the requests that overran and re-arms
    for the next one; it is not re-armed while nothing is in flight, so an idle client has no
    timer at all. ``end()`` turns that cancellation into ``TimeoutError`` exactly as
    ``asyncio.timeout`` would (``uncancel``), and lets any other one through.
    """

    __slots__ = ("_inflight", "_overdue", "_timer", "limit")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._inflight: dict[asyncio.Task[Any], float] = {}
        self._overdue: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def bound(self, request: Awaitable[T]) -> T:
        """Await ``request`` (in the current task) within the limit.

        Raises:
            TimeoutError: it did not finish in time (it was cancelled).
        """
        task = asyncio.current_task()
        assert task is not None
        self.start(task, asyncio.get_running_loop().time())
        error: BaseException | None = None
        try:
            return await request
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.end(task, error)

    def start(self, task: asyncio.Task[Any], now: float) -> None:
        """Note that ``task`` started a request at loop time ``now`` (``loop.time()``)."""
        deadline = self._inflight[task] = now + self.limit
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._fire)

    def end(self, task: asyncio.Task[Any], exc: BaseException | None) -> None:
        """Forget ``task``'s request; raise ``TimeoutError`` if we cancelled it."""
        del self._inflight[task]
        if self._overdue and task in self._overdue:
            self._overdue.discard(task)
            if isinstance(exc, asyncio.CancelledError) and task.uncancel() == 0:
                raise TimeoutError(f"no reply within {self.limit:g} s") from None

    def close(self) -> None:
        """Drop the timer (the owner is closing; requests still in flight go unbounded)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        overdue = self._overdue
        for task, deadline in self._inflight.items():
            if deadline > now:
                self._timer = loop.call_at(deadline + EARLY, self._fire)
                return
            if task not in overdue:
                overdue.add(task)
                task.cancel()  # runs later: the dict does not change under this loop


Limit: TypeAlias = "float | Deadlines | None"
"""How long a request may take: seconds (a timer of its own), a shared :class:`Deadlines`
(its limit, no timer per request), or None (no limit)."""
