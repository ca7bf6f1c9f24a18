"""The mutexes of one SQL client held on its shared sessions: :class:`SharedLocks`.

The engine hands a fresh mutex acquisition here (:meth:`SharedLocks.grant`), and the renewals
and the release of a lease granted here (:meth:`~SharedLocks.renew`,
:meth:`~SharedLocks.release`). Every statement on a shared session runs in the backend's
tasks, one at a time (``conn.io``), and is never abandoned midway: a caller cancelled while
it runs leaves it to finish, and the engine's compensating release (the core sends one for
every cancelled attempt) gives back what it got. A statement that fails or times out puts the
session in doubt: it is closed and every lease on it is lost (:mod:`._shared` tells the
model, docs/postgres.md and docs/mysql.md the user's view).

Example::

    shared = SharedLocks(sessions, dialect, table, life, logger, translate=..., granted=...)
    shared.tasks = tasks                       # at open
    grant = await shared.grant(spec, ident, owner, ttl=30.0)   # Grant, or Busy
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Generic, NoReturn, TypeVar, cast

from .. import BackendError, Busy, Grant, LockSpec, Tasks, retrieve
from ._acquisitions import Acquisition, Acquisitions, Ident
from ._connection import Connection
from ._dialect import Dialect
from ._life import Life
from ._shared import SharedSession, SharedSessions, fresh_for

__all__ = ["SharedLocks"]

C = TypeVar("C", bound=Connection)
H = TypeVar("H")
T = TypeVar("T")


class SharedLocks(Generic[C, H]):
    """Grants, renewals and releases of mutexes on the shared sessions (see the module
    docstring)."""

    def __init__(
        self,
        sessions: SharedSessions[C],
        dialect: Dialect[C, H],
        acquisitions: Acquisitions[C, H],
        life: Life,
        logger: logging.Logger,
        *,
        translate: Callable[[BaseException, str], NoReturn],
        granted: Callable[[], None],
    ) -> None:
        self._sessions = sessions
        self._dialect = dialect
        self._acqs = acquisitions
        self._life = life
        self._logger = logger
        self._translate = translate
        self._granted = granted
        self.tasks: Tasks | None = None

    @property
    def enabled(self) -> bool:
        """Whether the client has shared sessions at all (``shared_sessions`` > 0)."""
        return self._sessions.limit > 0

    def statistics(self) -> dict[str, int]:
        return self._sessions.statistics()

    def close(self) -> None:
        """The client is closing (the pool closes the connections)."""
        self._sessions.sessions = []

    async def release(self, acq: Acquisition[C, H]) -> bool:
        """Unlock ``acq``'s mutex (after a grant or keep-alive of it still under way)."""
        session = _session_of(acq)
        if session is None:
            return False
        return await self._in_background(self._release_shared(session, acq), "release")

    async def renew(self, acq: Acquisition[C, H], ttl: float) -> bool:
        """Confirm the session ``acq`` holds on; one confirmation serves every lease on it
        for :func:`~._shared.fresh_for` seconds."""
        session = _session_of(acq)
        if session is None or not session.usable():
            return False
        if asyncio.get_running_loop().time() - session.confirmed_at < fresh_for(ttl):
            return True  # another lease's keep-alive, or a grant, just confirmed it
        return await self._in_background(self._confirm_shared(session, acq, ttl), "keepalive")

    async def _in_background(self, work: Coroutine[Any, Any, T], step: str) -> T:
        """Run ``work`` (statements on a shared session) in the backend's tasks and wait for
        it: a caller cancelled midway leaves it to finish, since abandoning a statement would
        put the session, and every lease on it, in doubt."""
        # A bare future, not a shield: cancelling the caller cancels only the future (the work
        # goes on), and one loop turn fewer per statement than a shield's.
        outcome: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        outcome.add_done_callback(retrieve)  # the caller may have left

        async def run() -> None:
            try:
                result = await work
            except asyncio.CancelledError:  # the client is closing
                if not outcome.done():
                    closed = BackendError(f"the {self._life.where} client closed")
                    outcome.set_exception(closed)
                raise
            except BaseException as exc:  # the caller's to raise: a service failure
                if not outcome.done():
                    outcome.set_exception(exc)
            else:
                if not outcome.done():
                    outcome.set_result(result)

        task = None
        if self.tasks is not None and self._life.open:
            task = self.tasks.try_spawn(run(), f"aiodlock-{self._dialect.name}-shared-{step}")
        if task is None:
            work.close()
            self._life.require_open()
            raise BackendError(
                f"the {self._dialect.name} backend for {self._life.where} is closing"
            )
        return await outcome

    async def grant(self, spec: LockSpec, ident: Ident, owner: str, ttl: float) -> Grant | Busy:
        """A fresh mutex acquisition: one attempt on a shared session."""
        acq = self._acqs.open(ident, owner)
        acq.ttl = ttl
        # Left in the table if we are cancelled: the core's compensating release finds it
        # there, and gives back what the attempt, which goes on, may still get.
        return await self._in_background(self._attempt_shared(spec, ident, acq, ttl), "grant")

    async def _attempt_shared(
        self, spec: LockSpec, ident: Ident, acq: Acquisition[C, H], ttl: float
    ) -> Grant | Busy:
        try:
            session = await self._sessions.pick()
        except BaseException as exc:
            self._acqs.drop(ident, acq)
            self._translate(exc, f"acquire of {spec.name!r}")
        session.granting += 1  # not stale while a grant is on its way to it
        try:
            return await self._grant_on(session, spec, ident, acq, ttl)
        finally:
            session.granting -= 1

    async def _grant_on(
        self,
        session: SharedSession[C],
        spec: LockSpec,
        ident: Ident,
        acq: Acquisition[C, H],
        ttl: float,
    ) -> Grant | Busy:
        dialect, conn = self._dialect, session.conn
        target = dialect.mutex_target(spec)
        async with conn.io:
            if acq.abandoned or not session.usable() or target in session.held:
                # Given up already; or the session just ended (the wait that follows runs on
                # a connection of its own); or it holds the mutex: the server would stack it.
                self._acqs.drop(ident, acq)
                return Busy(None)
            acq.session, acq.conn = session, conn
            sent = asyncio.get_running_loop().time()
            try:
                held, token, _ = await dialect.attempt(
                    spec, acq, conn, session.shortest_ttl(ttl) or ttl
                )
            except BaseException as exc:
                acq.session = acq.conn = None
                self._acqs.drop(ident, acq)
                if not await self._undo(session, target, exc):
                    self._lose_session(session, "a grant on it failed")  # it may hold the lock
                self._translate(exc, f"acquire of {spec.name!r}")
            session.confirmed_at = sent
            if held is None:
                acq.session = acq.conn = None
                self._acqs.drop(ident, acq)
                shortest = session.shortest_ttl()
                if shortest is not None and shortest > ttl:  # our attempt lowered it
                    await self._keep_idle(session, shortest)
                return Busy(None)
            acq.held = held
            session.add(held, ttl)
            if token is None:  # a fencing row of another name: give the lock back
                self._acqs.drop(ident, acq)
                await self._unlock_shared(session, acq)
                raise BackendError(dialect.foreign_row(spec))
            acq.granted = True
            acq.event = session.signal
            self._acqs.hold(acq, held)
        self._granted()
        return Grant(token, None)

    async def _undo(self, session: SharedSession[C], target: H, exc: BaseException) -> bool:
        """After a grant statement that failed on the server (an error it answered, the
        session intact: out of lock memory, a constraint), free what it may have taken: a
        session-level lock outlives its statement's rollback. Whether the session is sound;
        anything else (no answer, a closed connection) leaves it in doubt."""
        conn = session.conn
        if not isinstance(exc, self._dialect.driver_errors) or conn.closed:
            return False
        if self._dialect.doubtful(conn):
            return False
        try:
            await self._dialect.release_one(conn, target, session.shortest_ttl())
        except BaseException:
            return False
        return True

    async def _keep_idle(self, session: SharedSession[C], ttl: float) -> None:
        try:
            await self._dialect.keep_idle(session.conn, ttl)
        except self._dialect.driver_errors:
            # Its leases could outlive no timeout they were promised, but it is in doubt.
            self._lose_session(session, "resetting its idle timeout failed")

    async def _release_shared(self, session: SharedSession[C], acq: Acquisition[C, H]) -> bool:
        async with session.conn.io:  # after a grant or keep-alive of it still under way
            return await self._unlock_shared(session, acq)

    async def _unlock_shared(self, session: SharedSession[C], acq: Acquisition[C, H]) -> bool:
        """Unlock ``acq``'s mutex on its shared session (``conn.io`` held by the caller)."""
        held, acq.held, acq.session, acq.conn = acq.held, None, None, None
        if held is None or not session.usable():
            return False
        session.remove(held, acq.ttl)
        sent = asyncio.get_running_loop().time()
        try:
            released = await self._dialect.release_one(session.conn, held, session.shortest_ttl())
        except BaseException as exc:
            self._lose_session(session, "a release on it failed")  # closing frees the lock
            if isinstance(exc, self._dialect.driver_errors):
                return False
            raise
        session.confirmed_at = sent
        return released

    async def _confirm_shared(
        self, session: SharedSession[C], acq: Acquisition[C, H], ttl: float
    ) -> bool:
        """The keep-alive of a shared session, on behalf of every lease on it."""
        async with session.conn.io:
            held, loop = acq.held, asyncio.get_running_loop()
            if acq.session is not session or held is None or not session.usable():
                return False
            if loop.time() - session.confirmed_at < fresh_for(ttl):
                return True  # confirmed while we waited for the session
            sent = loop.time()
            shortest = session.shortest_ttl() or ttl
            try:
                ours = await self._dialect.confirm(session.conn, held, shortest)
            except self._dialect.driver_errors:
                ours = False
            except asyncio.CancelledError:
                self._lose_session(session, "the client closed")
                raise
            if not ours:
                self._lose_session(session, "its keep-alive failed")
                return False
            session.confirmed_at = sent
            return True

    def _lose_session(self, session: SharedSession[C], why: str) -> None:
        """A shared session failed or is in doubt: every lease on it is lost, at once, and
        the connection is closed (the server frees what it still holds)."""
        if session.lost:
            return
        if session.leases:
            self._logger.warning(
                "%s: a shared session holding %d lock(s) is lost (%s); each holder is told",
                self._life.where,
                session.leases,
                why,
            )
        self._sessions.end(session)


def _session_of(acq: Acquisition[C, H]) -> SharedSession[C] | None:
    # The table knows a shared session only by what it asks of it (no import circle).
    return cast("SharedSession[C] | None", acq.session)
