"""A per-command time limit that costs no timer per command: :class:`Deadlines`.

Redis commands run without redis-py's ``socket_timeout`` (see :mod:`._node` for why), so a
connection source bounds them itself, with this.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["PRECISION", "Deadlines"]

PRECISION = 0.025
"""How late, at most, a command is cut off after its limit (seconds)."""


class Deadlines:
    """Bounds every command by ``limit`` seconds for ~0.2 us a call.

    ``asyncio.timeout`` costs ~6 us a call (a timer handle in the loop's heap, per command),
    which alone would be a tenth of the uncontended acquire+release budget. Instead each
    command notes its deadline in a dict, and one sweeper task (in its owner's TaskGroup)
    cancels the commands that overran, every :data:`PRECISION` seconds (or ``limit / 4`` if
    that is shorter) -- so a command is cut off between ``limit`` and ``limit + PRECISION``.
    The dict holds the commands in flight only (at most one per connection), so a sweep is a
    handful of comparisons. ``end()`` turns that cancellation into ``TimeoutError``
    exactly as ``asyncio.timeout`` would (``uncancel``), and lets any other one through.
    """

    __slots__ = ("_inflight", "_limit", "_overdue")

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._inflight: dict[asyncio.Task[Any], float] = {}
        self._overdue: set[asyncio.Task[Any]] = set()

    def start(self, task: asyncio.Task[Any], now: float) -> None:
        """Note that ``task`` started a command at loop time ``now``."""
        self._inflight[task] = now + self._limit

    def end(self, task: asyncio.Task[Any], exc: BaseException | None) -> None:
        """Forget ``task``'s command; raise ``TimeoutError`` if we cancelled it."""
        del self._inflight[task]
        if self._overdue and task in self._overdue:
            self._overdue.discard(task)
            if isinstance(exc, asyncio.CancelledError) and task.uncancel() == 0:
                raise TimeoutError(f"no reply within {self._limit} s") from None

    async def sweep(self) -> None:
        """Cancel overrunning commands until cancelled itself (run it as an owned task)."""
        loop = asyncio.get_running_loop()
        period = min(self._limit / 4, PRECISION)
        while True:
            # Housekeeping on a fixed period (not a lock poll): cheaper than a timer per call.
            await asyncio.sleep(period)
            now = loop.time()
            for task, deadline in list(self._inflight.items()):
                if deadline <= now and task not in self._overdue:
                    self._overdue.add(task)
                    task.cancel()
