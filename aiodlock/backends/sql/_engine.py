"""The SQL lock engine: acquire, wait, renew and release on server sessions, any dialect.

A lock lives as long as the session that holds it, so nothing outlives its holder. A fresh
mutex is tried on one of the client's few shared sessions (:mod:`._shared_locks`); any other
acquisition, and a mutex that has to wait, keeps a session of its own from its first attempt
(or its wait) to its release. The engine owns the order of the steps,
what happens to a session whose outcome is unknown (closed, or cleaned before reuse), the
keep-alives (run in the backend's :class:`Tasks`, so a release waits for one in flight instead
of cutting it off) and the translation of driver errors to :class:`BackendError`; the
:class:`~._dialect.Dialect` runs each step on its server. docs/mysql.md and docs/postgres.md
tell the design.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, Generic, NoReturn, TypeVar

from .. import (
    BackendError,
    Busy,
    Capability,
    Deadlines,
    Grant,
    Kind,
    LimitMismatchError,
    LockInfo,
    LockSpec,
    LossSignal,
    Tasks,
    UnsupportedError,
    Waiter,
)
from ._acquisitions import Acquisition, Acquisitions, ident_of
from ._connection import Connection
from ._dialect import Dialect
from ._fencing import Fencing
from ._janitor import Janitor
from ._life import Life
from ._limits import claim_limit, limit_in_use
from ._pool import Pool
from ._settings import Settings
from ._shared import SharedSessions
from ._shared_locks import SharedLocks

__all__ = ["CAPABILITIES", "SQLEngine"]

C = TypeVar("C", bound=Connection)
H = TypeVar("H")
T = TypeVar("T")

LENT_FOR_GRANTS: Final = 2
"""Busy lent connections up to which a fresh mutex is granted on an idle one of its own."""

CAPABILITIES: frozenset[Capability] = frozenset(
    {
        Capability.EXCLUSIVE,
        Capability.COUNTING,
        Capability.FENCING,
        Capability.SESSION_LEASE,
        Capability.SERVER_WAKEUP,
        Capability.INSPECT,
        Capability.BREAK,
    }
)
"""What every SQL dialect serves (PostgreSQL adds shared locks)."""


class SQLEngine(Generic[C, H]):
    """A lock backend on one SQL server, its dialect given (see the module docstring).

    The MySQL and PostgreSQL backends are this engine with their dialect and options.
    """

    def __init__(
        self,
        dialect: Dialect[C, H],
        settings: Settings,
        *,
        password: str | None,
        logger: logging.Logger,
    ) -> None:
        self._dialect = dialect
        self._life = life = Life(dialect.name, settings.where)
        self._where = settings.where
        self._password = password
        self._bounds: Deadlines = settings.bounds
        self._request_timeout = settings.request_timeout
        self._wait_slice = settings.wait_slice
        self._pool: Pool[C] = Pool(dialect, life, settings)
        self._janitor: Janitor[C] = Janitor(self._pool, dialect, life, logger)
        self._pool.on_doubtful = self._janitor.clean
        self._pool.on_abandoned = self._janitor.doom
        self._fencing: Fencing[C] = Fencing(
            self._pool, dialect, self._janitor, fence_ttl=settings.fence_ttl
        )
        self._acqs: Acquisitions[C, H] = Acquisitions()
        self._shared: SharedLocks[C, H] = SharedLocks(
            SharedSessions(self._pool, settings.shared_sessions),
            dialect,
            self._acqs,
            life,
            logger,
            translate=self._raise_translated,
            granted=self._fencing.maybe_sweep,
        )
        self._tasks: Tasks | None = None
        self._waiting = 0
        self._server_version = ""

    # ------------------------------------------------------------------ lifetime

    async def open(self, tasks: Tasks) -> None:
        """Connect once (bounded by ``connect_timeout``) and get the server ready."""
        if self._life.state != "new":
            raise RuntimeError(f"a {type(self).__name__} is opened once")
        self._life.state = "open"
        self._tasks = self._janitor.tasks = self._shared.tasks = tasks
        try:
            conn = await self._pool.checkout()
            version = await self._dialect.start(conn)
        except BaseException as exc:
            await self.aclose()
            self._raise_translated(exc, "connect")
        self._server_version = version
        self._pool.checkin(conn)

    async def aclose(self) -> None:
        """Close every connection (the server frees what they held). Idempotent."""
        if self._life.state in ("closing", "closed"):
            return
        self._life.state = "closing"
        try:
            if self._tasks is not None:
                await self._tasks.aclose()
        finally:
            self._bounds.close()
            conns = self._pool.close()
            self._shared.close()
            self._acqs.clear()
            self._janitor.clear()
            try:
                await self._dialect.close_all(conns)
            finally:
                self._life.state = "closed"

    async def settle(self) -> None:
        """Wait for the janitor (:class:`~aiodlock.backends.Settler`): sessions in doubt
        cleaned or ended, and a fencing-row sweep under way finished."""
        await self._janitor.settle()

    def check(self, spec: LockSpec) -> None:
        """Semaphores are N server locks: refuse an unreasonable N when the lock is built."""
        limit = self._dialect.max_semaphore_limit
        if spec.kind is Kind.SEMAPHORE and spec.limit > limit:
            raise UnsupportedError(
                f"{self._where} serves semaphores with limit <= {limit} "
                f"({self._dialect.permit_unit}), not {spec.limit}"
            )

    @property
    def request_timeout(self) -> float:
        """Seconds one request may take (the ``request_timeout`` option)."""
        return self._request_timeout

    def describe(self) -> str:
        """The URL without its password."""
        return self._where

    def statistics(self) -> Mapping[str, Any]:
        """Connections (open, idle, checkouts waiting for one), locks held, waiting
        acquisitions, server version."""
        return {
            "connections": len(self._pool.conns),
            "idle": len(self._pool.idle),
            "connection_waits": self._pool.waiting,
            **self._shared.statistics(),
            "held": self._acqs.held_count(),
            "waiters": self._waiting,
            "server": self._server_version,
        }

    # ------------------------------------------------------------------ protocol

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """Take the lock and its fencing token (in one statement where the dialect can), or
        claim what a wait of this acquisition got."""
        self._life.require_open()
        ident = ident_of(spec, owner)
        acqs = self._acqs
        acq = acqs.get(ident)
        waiting = acq is not None  # a waiter of this acquisition owns the connection
        if acq is not None and acq.granted:
            raise RuntimeError(f"owner {owner!r} already holds {spec.name!r}")
        if (acq is None or acq.held is None) and self._held_here(spec):
            if acq is not None:
                acq.ttl = ttl  # its waits fence with it
            return Busy(None)
        if acq is None and spec.kind is Kind.MUTEX and self._shared.enabled and self._crowded():
            return await self._shared.grant(spec, ident, owner, ttl)
        if acq is None:
            acq = acqs.open(ident, owner)
        acq.ttl = ttl
        dialect, pool = self._dialect, self._pool
        sent = None
        try:
            conn = acq.conn
            if conn is not None and conn.closed:
                # The waiter's session ended (server restart...): what it got went with it.
                pool.discard(conn)
                conn = acq.conn = None
                acq.held = acq.claim = None
            if conn is None:
                conn = acq.conn = await pool.checkout()
            claim = acq.claim
            if claim is not None:  # granted and fenced by the wait's own statement
                acq.claim = None
                token: int | None = claim.fencing_token
                sent, check_limit = claim.sent, False
            else:
                held, token, check_limit = await dialect.attempt(spec, acq, conn, ttl)
                if held is None:
                    # Every slot of ours is taken: by holders of another limit? Then say so
                    # now, instead of waiting for a slot (with a lower limit, forever).
                    in_use = None
                    if spec.kind is Kind.SEMAPHORE:
                        in_use = await limit_in_use(dialect, spec, conn)
                    if not waiting:
                        acqs.drop(ident, acq)
                        pool.checkin(conn)
                        acq.conn = None
                    if in_use is not None:
                        raise LimitMismatchError(spec.name, in_use, spec.limit)
                    return Busy(None)
                acq.held = held
            in_use = await claim_limit(dialect, spec, conn) if check_limit else None
        except LimitMismatchError:
            raise  # refused holding nothing; a waiter's connection goes back with its waiter
        except BaseException as exc:
            # Outcome unknown (cancelled, connection lost): the session may hold the lock.
            # Close it (which frees anything it held), or clean it before any reuse.
            self._scrap(acq)
            if not waiting:
                acqs.drop(ident, acq)
            self._raise_translated(exc, f"acquire of {spec.name!r}")
        if token is None or in_use is not None:
            # Give the lock back at once (a waiter's acquisition is left to its waiter).
            if not waiting:
                acqs.drop(ident, acq)
            await self._retire(acq)
            if token is None:
                raise BackendError(dialect.foreign_row(spec))
            assert in_use is not None
            raise LimitMismatchError(spec.name, in_use, spec.limit)
        acq.granted = True
        if spec.kind is Kind.MUTEX and acq.held is not None:
            acqs.hold(acq, acq.held)
        acq.event = conn.lease_event = LossSignal()
        if conn.peer_closed:  # the server hung up right after the grant
            acq.event.set()
        self._fencing.maybe_sweep()
        return Grant(token, sent)

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Unlock on the holding connection, which then rejoins the idle list."""
        acq = self._acqs.pop(ident_of(spec, owner))
        if acq is None:
            return False
        acq.abandoned = True
        self._acqs.unhold(acq)
        if acq.session is not None:
            return await self._shared.release(acq)
        conn = acq.conn
        if conn is None:
            return False
        async with conn.io:  # let a keep-alive in flight finish first
            acq.conn = None
            conn.lease_event = None
            if conn.closed:
                self._pool.discard(conn)
                return False  # the session ended, and the lock with it
            if acq.held is None:
                self._pool.checkin(conn)
                return False
            return await self._release_on(conn, acq.held)

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Confirm on the holding connection that its session still holds the lock.

        A keep-alive cancelled midway (its lease is being released) must not close the
        session: the server would free the lock some time after ``release()`` returned, and a
        contender trying right after would still find it taken. So the statement finishes in
        the backend's tasks (bounded by ``query_timeout``) and the release waits for it.
        """
        acq = self._acqs.get(ident_of(spec, owner))
        if acq is None or not acq.granted or acq.lost or acq.held is None:
            return False
        if acq.session is not None:
            return await self._shared.renew(acq, ttl)
        conn = acq.conn
        if conn is None or conn.closed:
            self._lose(acq)
            return False
        outcome: list[bool] = []
        task = None
        if self._tasks is not None and self._life.open:
            name = f"aiodlock-{self._dialect.name}-keepalive"
            task = self._tasks.try_spawn(self._confirm_into(acq, conn, ttl, outcome), name)
        if task is None:
            return await self._confirm(acq, conn, ttl)
        await asyncio.shield(task)
        return bool(outcome and outcome[0])

    async def _confirm_into(
        self, acq: Acquisition[C, H], conn: C, ttl: float, outcome: list[bool]
    ) -> None:
        outcome.append(await self._confirm(acq, conn, ttl))

    async def _confirm(self, acq: Acquisition[C, H], conn: C, ttl: float) -> bool:
        """The keep-alive's statements; a failure loses the lease."""
        async with conn.io:
            held = acq.held
            if acq.conn is not conn or held is None:
                return False  # released while we waited for the connection
            try:
                ours = await self._dialect.confirm(conn, held, ttl)
            except self._dialect.driver_errors:  # TimeoutError among them
                # The connection is gone (and the lock went with the session), or the
                # server did not answer in time: the lease cannot be confirmed.
                self._lose(acq)
                return False
            except asyncio.CancelledError:
                # The client is closing: close the session, which frees the lock, rather
                # than wait for the server to answer a cancel.
                self._lose(acq)
                self._scrap(acq, close=True)
                raise
        if not ours:
            self._lose(acq)
            return False
        return True

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """Set the moment the server closes the holding connection (or a keep-alive fails)."""
        acq = self._acqs.get(ident_of(spec, owner))
        if acq is None or not acq.granted:
            return None
        return acq.event

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """None: the holding session's idle timeout is at least the ttl, so the server keeps
        a silent holder's session at least ``ttl`` after its last keep-alive, and the
        ttl-based validity (last confirmed keep-alive + ttl - drift) already passes first."""
        return None

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        """Reserve the acquisition's connection; waits run on it, on the server."""
        self._life.require_open()
        ident = ident_of(spec, owner)
        acq = self._acqs.get(ident)
        if acq is None:
            acq = self._acqs.open(ident, owner)
        self._waiting += 1
        try:
            if acq.conn is None:
                try:
                    acq.conn = await self._pool.checkout(patient=True)
                except BaseException as exc:
                    self._raise_translated(exc, f"wait for {spec.name!r}")
            yield _SQLWaiter(self, spec, acq)
        finally:
            self._waiting -= 1
            if not acq.granted:
                self._acqs.drop(ident, acq)
                await self._retire(acq)

    async def _wait_once(self, spec: LockSpec, acq: Acquisition[C, H], slice_: float) -> None:
        """One server-side wait; on success the session holds the lock (``acq.held``)."""
        pool = self._pool
        if acq.conn is not None and acq.conn.closed:
            pool.discard(acq.conn)
            acq.conn = None
        if acq.conn is None:
            try:
                acq.conn = await pool.checkout(patient=True)
            except BaseException as exc:
                self._raise_translated(exc, f"wait for {spec.name!r}")
        conn = acq.conn
        try:
            await self._dialect.wait(spec, acq, conn, slice_)
        except BaseException as exc:
            acq.conn = None
            pool.give_up(conn)
            self._raise_translated(exc, f"wait for {spec.name!r}")
        if conn.closed and acq.held is None:  # a wait cut short on the client
            acq.conn = None
            pool.discard(conn)

    # ------------------------------------------------------------------ operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern``, sorted by name
        (see the dialect for where holders and waiters come from)."""
        return await self._dialect.inspect(self._operate, namespace, pattern)

    async def namespaces(self) -> list[str]:
        """The namespaces of the fencing table, sorted
        (:class:`~aiodlock.backends.NamespaceLister`): every one with a lock held now, and
        those whose fencing rows are not swept yet."""
        return await self._dialect.namespaces(self._operate)

    async def break_lock(self, spec: LockSpec) -> int:
        """End every session holding ``spec``'s lock, then move its fencing row on; how many
        sessions were ended."""
        return await self._dialect.break_lock(self._operate, spec)

    async def _operate(self, action: str, work: Callable[[C], Awaitable[T]]) -> T:
        """One operator step on a lock-free connection of ours."""
        self._life.require_open()
        conn = await self._pool.checkout()
        try:
            result = await work(conn)
        except BaseException as exc:
            self._pool.checkin(conn)  # or closed, or to the janitor if in doubt
            self._raise_translated(exc, action)
        self._pool.checkin(conn)
        return result

    # ------------------------------------------------------------------ sessions

    def _crowded(self) -> bool:
        """Whether a fresh mutex goes to a shared session: unless an idle connection is at
        hand and at most :data:`LENT_FOR_GRANTS` lent ones are busy. A client holding a
        lock or two then grants them inline on a session of their own, as fast as before
        shared sessions (a shared session's statement costs two more loop turns: it must
        never be abandoned midway); one holding many shares a few sessions."""
        pool = self._pool
        busy = len(pool.conns) - len(pool.pinned) - len(pool.idle)
        return not pool.idle or busy >= LENT_FOR_GRANTS

    def _held_here(self, spec: LockSpec) -> bool:
        """Whether another acquisition of this client holds the mutex ``spec``."""
        if spec.kind is not Kind.MUTEX or not self._acqs.holding:
            return False
        return self._acqs.held_here(self._dialect.mutex_target(spec))

    async def _release_on(self, conn: C, held: H) -> bool:
        """Unlock on ``conn``; keep the connection only if it now holds nothing."""
        try:
            released, clean = await self._dialect.release(conn, held)
        except BaseException as exc:
            self._pool.give_up(conn)  # closing the session frees the lock anyway
            if isinstance(exc, self._dialect.driver_errors):
                return False
            raise
        if clean:
            self._pool.checkin(conn)
        else:
            self._pool.discard(conn)
        return released

    async def _retire(self, acq: Acquisition[C, H]) -> None:
        """A waiter leaves without a grant: free what its session holds, keep nothing."""
        conn, held = acq.conn, acq.held
        acq.conn = acq.held = acq.claim = None
        if conn is None:
            return
        if held is None:
            self._pool.checkin(conn)
            return
        with contextlib.suppress(*self._dialect.driver_errors):
            await self._release_on(conn, held)

    def _lose(self, acq: Acquisition[C, H]) -> None:
        self._acqs.unhold(acq)
        acq.lost = True
        if acq.event is not None:
            acq.event.set()
        if acq.conn is not None and acq.conn.closed:
            self._pool.discard(acq.conn)
            acq.conn = None

    def _scrap(self, acq: Acquisition[C, H], *, close: bool = False) -> None:
        """Take the acquisition's connection away: closed, or cleaned before reuse."""
        self._acqs.unhold(acq)
        conn, acq.conn, acq.held, acq.claim = acq.conn, None, None, None
        if conn is None:
            return
        conn.lease_event = None
        if close:
            self._pool.discard(conn)
        else:
            self._pool.give_up(conn)

    def _raise_translated(self, exc: BaseException, action: str) -> NoReturn:
        """Re-raise ``exc``; a driver exception becomes a chained :class:`BackendError`."""
        if isinstance(exc, self._dialect.driver_errors):
            detail = self._dialect.detail(exc)
            if self._password:
                detail = detail.replace(self._password, "***")
            raise BackendError(
                f"{self._dialect.name} {action} failed on {self._where}: "
                f"{type(exc).__name__}: {detail}"
            ) from exc
        raise exc


class _SQLWaiter(Generic[C, H]):
    """Waits on the server, on the acquisition's own connection, a slice at a time."""

    __slots__ = ("_acq", "_engine", "_spec")

    def __init__(self, engine: SQLEngine[C, H], spec: LockSpec, acq: Acquisition[C, H]) -> None:
        self._engine = engine
        self._spec = spec
        self._acq = acq

    async def wait(self, timeout: float | None) -> None:
        """One server-side wait of at most ``min(timeout, wait_slice)`` seconds."""
        if self._acq.held is not None:
            return  # the server already granted it: the next attempt claims it
        slice_ = self._engine._wait_slice
        if timeout is not None:
            if timeout <= 0:
                return
            slice_ = min(slice_, timeout)
        await self._engine._wait_once(self._spec, self._acq, slice_)
