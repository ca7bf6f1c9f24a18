"""Shared sessions: the few connections of one SQL client that hold its uncontended mutexes.

A free mutex is granted on a shared session (``pg_try_advisory_lock`` / ``GET_LOCK(name, 0)``
with its fencing bump, one round trip as on a session of its own); only a contended acquire
waits on a connection of its own. Many leases then live on one server session, which changes
three things, all handled here:

* **One statement at a time.** A session runs one statement at a time (``conn.io``), and a
  statement on it is never abandoned midway: a cancelled caller leaves it to finish (see
  :class:`~._engine.SQLEngine`), since closing the session would end every lease on it.
* **One loss for all.** The session's leases share one :class:`LossSignal`: the server ending
  the session (a break, a restart, ``idle_session_timeout``) or a keep-alive that fails ends
  them all at once, and the session is not used again.
* **Keep-alive per session.** A renewal confirms the session, not the lease, and a session
  confirmed less than :func:`fresh_for` ago needs no round trip; the session's idle timeout
  follows the shortest ttl among its leases (set by every statement that changes it).

Reentrancy is the other hazard: a session that holds a lock is granted it again by the server
(advisory locks and ``GET_LOCK`` stack), so :attr:`SharedSession.held` answers for the locks a
session holds, locally, before any statement.

Example::

    sessions = SharedSessions(pool, limit=2)
    session = await sessions.pick()          # the least loaded; opens one while below limit
    async with session.conn.io:
        ...                                  # the grant statement
    session.add(held, ttl=30.0)
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .. import LossSignal
from ._connection import Connection

if TYPE_CHECKING:
    from ._pool import Pool

__all__ = ["SharedSession", "SharedSessions", "fresh_for"]

C = TypeVar("C", bound=Connection)


def fresh_for(ttl: float) -> float:
    """How recent a confirmation of the session may be to count as a renewal of a lease of
    ``ttl``: half its renewal interval, so a failing session is still found within about one
    interval, as a lease of its own would be."""
    return ttl / 6


class SharedSession(Generic[C]):
    """One shared connection: its leases' keys, their ttls, and the loss they share."""

    __slots__ = ("confirmed_at", "conn", "granting", "held", "lost", "signal", "ttls")

    def __init__(self, conn: C) -> None:
        self.conn = conn
        self.signal = LossSignal()
        conn.lease_event = self.signal  # the server hanging up tells every lease at once
        self.held: set[Any] = set()
        self.ttls: collections.Counter[float] = collections.Counter()
        self.lost = False
        self.confirmed_at = asyncio.get_running_loop().time()
        """Loop time at which the last statement that succeeded on it was sent."""
        self.granting = 0
        """Grants picked it and not done yet: it is in use, however long it was idle."""

    @property
    def leases(self) -> int:
        return len(self.held)

    def usable(self) -> bool:
        """Not lost, still connected, and not hung up on by the server (which sets the
        signal before the driver may have noticed)."""
        return not self.lost and not self.conn.closed and not self.signal.is_set()

    def shortest_ttl(self, ttl: float | None = None) -> float | None:
        """The shortest ttl among the leases (and ``ttl``, about to join them)."""
        ttls = list(self.ttls)
        if ttl is not None:
            ttls.append(ttl)
        return min(ttls) if ttls else None

    def add(self, held: Any, ttl: float) -> None:
        self.held.add(held)
        self.ttls[ttl] += 1

    def remove(self, held: Any, ttl: float | None) -> None:
        self.held.discard(held)
        if ttl is not None and self.ttls[ttl] > 0:
            self.ttls[ttl] -= 1
            if not self.ttls[ttl]:
                del self.ttls[ttl]

    def lose(self) -> None:
        """The session is gone (or cannot be trusted): every lease on it is lost."""
        self.lost = True
        self.held.clear()
        self.ttls.clear()
        self.signal.set()


class SharedSessions(Generic[C]):
    """Up to ``limit`` shared sessions of one client, opened as the grants need them."""

    __slots__ = ("_opening", "_pool", "limit", "sessions")

    def __init__(self, pool: Pool[C], limit: int) -> None:
        self._pool = pool
        self.limit = limit
        self.sessions: list[SharedSession[C]] = []
        self._opening: asyncio.Future[SharedSession[C]] | None = None

    async def pick(self) -> SharedSession[C]:
        """The usable session with the fewest leases; a new one while fewer than ``limit``
        are open and each already holds something (concurrent grants then spread)."""
        live = self.prune()
        best = min(live, key=lambda s: s.leases) if live else None
        if best is not None and (best.leases == 0 or len(live) >= self.limit):
            return best
        opening = self._opening
        if opening is not None:
            if best is not None:
                return best  # one is being opened already: do not wait for it
            return await asyncio.shield(opening)
        opening = self._opening = asyncio.get_running_loop().create_future()
        try:
            session: SharedSession[C] = SharedSession(await self._pool.open_pinned())
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                opening.cancel()
            else:
                opening.set_exception(exc)
                opening.exception()  # retrieved: a caller may not be waiting
            raise
        finally:
            self._opening = None
        self.sessions.append(session)
        opening.set_result(session)
        return session

    def end(self, session: SharedSession[C]) -> None:
        """Close a session that failed or is in doubt: its leases are lost, and the server
        frees what it still holds."""
        session.lose()
        self._pool.discard(session.conn)

    def prune(self) -> list[SharedSession[C]]:
        """The usable sessions; the others (the server ended them, or may any moment: one
        that holds nothing is kept alive by nobody) are closed and dropped."""
        now = asyncio.get_running_loop().time()
        for session in self.sessions:
            idle = not session.leases and not session.granting
            if idle and self._pool.stale(session.conn, now - session.confirmed_at):
                session.lost = True
        live = [s for s in self.sessions if s.usable()]
        if len(live) != len(self.sessions):
            for session in self.sessions:
                if not session.usable():
                    session.lose()
                    self._pool.discard(session.conn)
            self.sessions = live
        return live

    def statistics(self) -> dict[str, int]:
        live = self.prune()
        return {"shared_sessions": len(live), "shared_leases": sum(s.leases for s in live)}
