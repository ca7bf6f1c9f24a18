"""Which command runs next, and how many run at once: :class:`Slots`.

A connection source lets at most ``max_connections`` commands be in flight. A command that
finds a slot free (and nobody queued) takes it and runs at once. The others queue, in one of
two lanes: most in arrival order, but those that let other processes go on -- a release, a
renewal, the attempt of a waiter already in a fair queue -- in a lane that is always served
first. Under a cancellation storm the ordinary lane is full of first attempts whose callers are
about to give up; a release that waited behind them would hold the lock, or a fair queue, for
nothing.

A queued command is an item whose owner waits for its outcome future; a caller that gives up
cancels that future, and a cancelled item is skipped, never sent. Who runs the items is the
source's business (:mod:`._node`): a task that holds a slot takes the next item as soon as its
command is done, so a busy slot never idles for a loop step between two commands.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Generic, TypeVar

__all__ = ["Slots", "wait_outcome"]

_Item = TypeVar("_Item")
_T = TypeVar("_T")


async def wait_outcome(outcome: asyncio.Future[_T]) -> _T:
    """Await a queued command's outcome. A caller cancelled meanwhile withdraws it (or, once
    started, leaves it to finish), and looks at its error if it already failed: nobody else
    will, and asyncio would log it as never retrieved."""
    try:
        return await outcome
    except asyncio.CancelledError:
        if outcome.done() and not outcome.cancelled():
            outcome.exception()
        raise


class Slots(Generic[_Item]):
    """``n`` slots and two lanes of queued items (see the module docstring).

    Example::

        slots: Slots[Job] = Slots(2)
        if slots.take():
            ...                      # run it now, then:
            slots.give_back()
        else:
            slots.push(job, outcome, first=False)
        job = slots.pop()            # by whoever holds a slot: the next live item, or None
    """

    __slots__ = ("_first", "_free", "_idle", "_n", "_rest")

    def __init__(self, n: int) -> None:
        self._n = n
        self._free = n
        self._first: deque[tuple[_Item, asyncio.Future[Any]]] = deque()
        self._rest: deque[tuple[_Item, asyncio.Future[Any]]] = deque()
        self._idle: asyncio.Event | None = None

    def take(self) -> bool:
        """Take a free slot, unless none is free or someone is queued already."""
        if self._free > 0 and not self._first and not self._rest:
            self._free -= 1
            return True
        return False

    def push(self, item: _Item, outcome: asyncio.Future[Any], *, first: bool) -> None:
        """Queue ``item``; its ``outcome`` is cancelled by a caller that stops waiting."""
        (self._first if first else self._rest).append((item, outcome))

    def pop(self) -> _Item | None:
        """The next item whose outcome is still wanted (``first`` lane first), or None."""
        for lane in (self._first, self._rest):
            while lane:
                item, outcome = lane.popleft()
                if not outcome.done():
                    return item
        return None

    def queued(self) -> bool:
        """Whether an item may be waiting (some of them may have been given up)."""
        return bool(self._first or self._rest)

    def give_back(self) -> None:
        """A slot is free again (its holder found nothing more to run)."""
        self._free += 1
        if self._free == self._n and self._idle is not None:
            self._idle.set()

    async def idle(self) -> None:
        """Return once every slot is free (nothing in flight)."""
        while self._free < self._n:
            self._idle = asyncio.Event()
            await self._idle.wait()
