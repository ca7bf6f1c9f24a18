"""How the leases of a session backend's queue entries end: reaper, loss, grace window.

An entry (a :class:`Holding`) is lost once: its lease's loss signal is set, its reaper
cancelled, the loss counted and logged. Three things end a lease here: no renewal within
its ``ttl`` (the reaper), the session ending (:meth:`Leases.mark_all_lost`), and no word
from the service for the grace window (:meth:`Leases.watch_grace`, run as a task of the
adapter). The adapter keeps what only it knows: its entries, its session, its clean-ups.

Example::

    leases = Leases(logger, name=lambda entry: f"lock key {entry.key!r}")
    leases.schedule_reaper(entry, ttl)   # on a grant and on each renewal
    leases.mark_lost(entry, "its lock key was deleted")
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from .. import LossSignal

__all__ = ["REAPED", "Holding", "Leases"]

REAPED = "it was not renewed within its ttl"


class Holding:
    """The lease state of one queue entry (adapters subclass it with their own fields)."""

    __slots__ = ("gone", "held", "lost", "lost_event", "reaper")

    def __init__(self) -> None:
        self.held = False
        self.lost: str | None = None  # why the lease ended, once it has
        self.lost_event = LossSignal()
        self.reaper: asyncio.TimerHandle | None = None
        self.gone = False  # released or abandoned: no longer in the adapter's table

    @property
    def holding(self) -> bool:
        """Held, not lost, not released."""
        return self.held and self.lost is None and not self.gone


E = TypeVar("E", bound=Holding)


def _nothing(entry: object) -> None:
    return None


class Leases(Generic[E]):
    """Ends the leases of one backend's entries (see the module docstring).

    ``name(entry)`` names an entry in the log line of its loss; ``on_lost(entry)`` runs
    before its loss signal is set (wake whom the entry kept waiting); ``on_reaped(entry)``
    after the reaper marked it lost (delete what it left at the service). ``clock`` is the
    loop's time by default.
    """

    __slots__ = ("_clock", "_logger", "_name", "_on_lost", "_on_reaped", "losses")

    def __init__(
        self,
        logger: logging.Logger,
        *,
        name: Callable[[E], object],
        on_lost: Callable[[E], None] = _nothing,
        on_reaped: Callable[[E], None] = _nothing,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._logger = logger
        self._name = name
        self._on_lost = on_lost
        self._on_reaped = on_reaped
        self._clock = clock
        self.losses = 0

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    # ------------------------------------------------------------------ the reaper

    def schedule_reaper(self, entry: E, ttl: float) -> None:
        """Mark ``entry`` lost unless renewed (this called again) within ``ttl`` seconds."""
        if entry.reaper is not None:
            entry.reaper.cancel()
        entry.reaper = asyncio.get_running_loop().call_later(ttl, self._reap, entry)

    @staticmethod
    def cancel_reaper(entry: Holding) -> None:
        """Stop ``entry``'s reaper, if it has one (released, closing)."""
        if entry.reaper is not None:
            entry.reaper.cancel()
            entry.reaper = None

    def _reap(self, entry: E) -> None:
        entry.reaper = None
        if entry.holding:
            self.mark_lost(entry, REAPED)
            self._on_reaped(entry)

    # ------------------------------------------------------------------ losses

    def mark_lost(self, entry: E, reason: str) -> bool:
        """The lease is over: renew says False from now on, the holder is told at once.
        True the first time, False if ``entry`` was lost already."""
        if entry.lost is not None:
            return False
        entry.lost = reason
        self._on_lost(entry)
        entry.lost_event.set()
        self.losses += 1
        self.cancel_reaper(entry)
        self._logger.warning("lost %s: %s", self._name(entry), reason)
        return True

    def mark_all_lost(
        self, entries: Iterable[E], reason: str, where: Callable[[E], bool] | None = None
    ) -> list[E]:
        """Mark lost every held entry of ``entries`` (those ``where`` accepts): a session
        ended. Returns those it marked."""
        marked = []
        for entry in list(entries):
            if entry.held and entry.lost is None and (where is None or where(entry)):
                self.mark_lost(entry, reason)
                marked.append(entry)
        return marked

    async def watch_grace(
        self,
        deadline: Callable[[], float | None],
        lapse: Callable[[], None],
        *,
        poll: Callable[[], float] = lambda: 0.0,
        resume: asyncio.Event | None = None,
    ) -> None:
        """Call ``lapse()`` each time the clock passes ``deadline()`` (last contact plus the
        grace; ``None``: no session to watch now), then wait for ``resume`` (set when the
        service answers again), or, without one, ``poll()`` seconds. Sleeps at least
        ``poll()`` between checks. Runs until cancelled."""
        while True:
            if resume is not None:
                resume.clear()
            at = deadline()
            if at is None:
                await asyncio.sleep(poll())
                continue
            delay = at - self._now()
            if delay > 0:
                await asyncio.sleep(max(delay, poll()))
                continue
            lapse()
            if resume is not None:
                await resume.wait()
            else:
                await asyncio.sleep(poll())
