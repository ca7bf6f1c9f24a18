"""The janitor of one SQL client: background clean-ups that need a connection of its own.

A session in doubt (a reply abandoned mid wait, which may have got a lock) is cleaned before
reuse, or closed, in a task of its own. One task of the backend's :class:`Tasks`, started
when there is work and ending when there is none, runs the rest one job at a time: a session
closed mid-query is ended on the server (``KILL``), which would otherwise finish its wait
first; then the fencing rows unused for ``fence_ttl`` are swept (:mod:`._fencing`). Every job
is best effort: a failure is logged at DEBUG and left to expiry or the next sweep.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from .. import Tasks
from ._connection import Connection
from ._dialect import Dialect
from ._life import Life
from ._pool import Pool

__all__ = ["Janitor"]

C = TypeVar("C", bound=Connection)

Job = Callable[[], Awaitable[None]]


class Janitor(Generic[C]):
    """Runs the clean-ups of one client in the background (see the module docstring).

    Example::

        janitor = Janitor(pool, dialect, life, logger)
        janitor.tasks = tasks          # at open()
        pool.on_doubtful = janitor.clean
        pool.on_abandoned = janitor.doom
    """

    __slots__ = (
        "_cleaning",
        "_dialect",
        "_doomed",
        "_later",
        "_life",
        "_logger",
        "_pool",
        "_urgent",
        "_worker",
        "tasks",
    )

    def __init__(
        self, pool: Pool[C], dialect: Dialect[C, Any], life: Life, logger: logging.Logger
    ) -> None:
        self._pool = pool
        self._dialect = dialect
        self._life = life
        self._logger = logger
        self.tasks: Tasks | None = None
        self._urgent: collections.deque[Job] = collections.deque()
        self._later: collections.deque[Job] = collections.deque()
        self._doomed: collections.deque[int] = collections.deque()
        self._worker: asyncio.Task[None] | None = None
        self._cleaning: set[asyncio.Task[None]] = set()

    def clean(self, conn: C) -> None:
        """Clean a session in doubt before reuse (or close it), in a task of its own: it
        needs no other connection, so it never waits behind a job that waits for one."""
        task = None
        if self._life.open and self.tasks is not None:
            task = self.tasks.try_spawn(self._clean(conn), f"aiodlock-{self._dialect.name}-clean")
        if task is None:
            self._pool.discard(conn)
            return
        self._cleaning.add(task)
        task.add_done_callback(self._cleaning.discard)

    def doom(self, session: int) -> None:
        """Have the server end a session whose reply we abandoned (a wait still running)."""
        if not self._life.open:
            return
        self._doomed.append(session)
        if len(self._doomed) == 1:
            self._urgent.append(self._reap)
        self._start()

    def later(self, job: Job) -> None:
        """Run ``job`` once the clean-ups are done."""
        self._later.append(job)
        self._start()

    async def settle(self) -> None:
        """Return once the work queued now (and any it queues) is done."""
        while self._cleaning or (self._worker is not None and not self._worker.done()):
            running = {*self._cleaning, *([self._worker] if self._worker else [])}
            await asyncio.wait(running)

    def clear(self) -> None:
        """Forget the work not started (the client is closing)."""
        self._urgent.clear()
        self._later.clear()
        self._doomed.clear()

    def _start(self) -> None:
        if not self._life.open or self.tasks is None:
            return
        if self._worker is None or self._worker.done():
            name = f"aiodlock-{self._dialect.name}-janitor"
            self._worker = self.tasks.try_spawn(self._work(), name)

    async def _work(self) -> None:
        while self._life.open and (self._urgent or self._later):
            job = (self._urgent or self._later).popleft()
            try:
                await job()
            except Exception as exc:
                self._logger.debug("janitor job failed on %s: %s", self._life.where, exc)

    async def _clean(self, conn: C) -> None:
        """Drop whatever a session in doubt holds, then reuse it (or close it)."""
        pool = self._pool
        if conn.closed or conn not in pool.conns:
            pool.discard(conn)
            return
        try:
            await self._dialect.clean(conn)
        except Exception as exc:
            self._logger.debug("janitor closes a connection to %s: %s", self._life.where, exc)
            pool.discard(conn)
            return
        pool.checkin(conn)

    async def _reap(self) -> None:
        """``KILL`` the doomed sessions, on one connection of ours."""
        pool = self._pool
        try:
            conn = await pool.checkout()
        except Exception as exc:
            self._logger.debug("janitor could not connect to %s: %s", self._life.where, exc)
            self._doomed.clear()
            return
        try:
            while self._doomed:
                await self._dialect.kill(conn, self._doomed[0])
                self._doomed.popleft()
        except Exception as exc:
            self._logger.debug("janitor failed on %s: %s", self._life.where, exc)
            pool.discard(conn)
            self._doomed.clear()
            return
        pool.checkin(conn)
