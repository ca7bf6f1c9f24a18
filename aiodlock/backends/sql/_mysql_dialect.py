"""The MySQL/MariaDB dialect of the SQL engine: user-level locks (``GET_LOCK``) on aiomysql.

A lock is ``GET_LOCK(name, 0)`` on the acquisition's session, its fencing bump the condition
of the same ``INSERT`` (a mutex: one round trip); a wait is ``GET_LOCK(name, slice)``; the
keep-alive ``IS_USED_LOCK(name) = CONNECTION_ID()``; the holder's ``wait_timeout`` follows the
ttl. Each session records its client's ``identity`` in the sessions table when it opens, for
``inspect``. docs/mysql.md tells the design.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fnmatch
import math
from typing import Any, Final

from .. import BackendError, Grant, HolderInfo, Kind, Limit, LockInfo, LockSpec
from . import _mysql_sql as sql
from ._acquisitions import Acquisition, family
from ._connection import ConnectSettings
from ._dialect import Attempt, DialectBase, Operate
from ._mysql_conn import DRIVER_ERRORS, Conn, error_code
from ._mysql_names import fence_key, lock_name
from ._mysql_sessions import SessionRecords
from ._settings import Settings

__all__ = ["MAX_SEMAPHORE_LIMIT", "MySQLDialect"]

MAX_SEMAPHORE_LIMIT: Final = DialectBase.max_semaphore_limit
_MISSING: Final = (sql.ER_NO_SUCH_TABLE, sql.ER_BAD_FIELD)  # no fence table, or an old one
_OPERATOR_HARMLESS: Final = (*_MISSING, sql.ER_NO_SUCH_THREAD)

Acq = Acquisition[Conn, str]


class MySQLDialect(DialectBase):
    """How MySQL and MariaDB run each step of the engine (see the module docstring)."""

    name: str = "mysql"
    driver_errors: tuple[type[BaseException], ...] = DRIVER_ERRORS
    permit_unit: str = "one named lock per permit"
    sessions_outgrow: bool = True  # connection ids only go up (until a restart)

    def __init__(self, settings: Settings, connect: ConnectSettings) -> None:
        super().__init__(settings, connect)
        self._fence_ttl = math.ceil(settings.fence_ttl)
        # A row in use is re-touched at least this often (seconds), well inside fence_ttl.
        self._touch_every = max(1, min(3600, self._fence_ttl // 4))
        self.fractional_timeouts = True
        """MariaDB takes ``GET_LOCK(name, 0.25)``; MySQL rounds the timeout to whole seconds.
        Read from the server version at ``start()``; a test may set it to emulate the other."""
        self._records = SessionRecords(settings, self._table)

    # ------------------------------------------------------------------ sessions

    async def connect(self) -> Conn:
        """Open a session and record its client identity (creating the sessions table on
        first use, as the fencing table is)."""
        conn = await Conn.open(self._connect)
        try:
            await self._records.record(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    async def start(self, conn: Conn) -> str:
        """The server's version (and from it, whether it waits fractional seconds)."""
        version = str(await conn.value("SELECT VERSION()", timeout=self._bounds))
        self.fractional_timeouts = "mariadb" in version.lower()
        return version

    def stale(self, conn: Conn, idle_for: float) -> bool:
        """Idle for nearly the session's own ``wait_timeout``."""
        if conn.wait_timeout is None:
            return False
        return idle_for > max(conn.wait_timeout - 0.5, 0.25)

    async def ping(self, conn: Conn) -> None:
        await conn.ping(timeout=self._request_timeout)

    def doubtful(self, conn: Conn) -> bool:
        return False  # aiomysql closes a connection whose reply it abandoned

    async def clean(self, conn: Conn) -> None:
        raise RuntimeError("a MySQL connection is never in doubt: it is closed instead")

    def abandoned_session(self, conn: Conn) -> int | None:
        """A session closed mid-query: the server finishes its wait unless it is killed
        (MariaDB notices the disconnect only within about a second)."""
        return conn.thread_id if conn.abandoned and not conn.peer_closed else None

    async def kill(self, conn: Conn, session: int) -> None:
        try:
            await conn.query(
                f"KILL CONNECTION {int(session)}",
                timeout=self._bounds,
                harmless=(sql.ER_NO_SUCH_THREAD,),
            )
        except DRIVER_ERRORS as exc:
            if error_code(exc) != sql.ER_NO_SUCH_THREAD:
                raise

    async def close_all(self, conns: list[Conn]) -> None:
        for conn in conns:
            conn.close()

    def detail(self, exc: BaseException) -> str:
        detail = str(exc)
        cause = exc.__cause__
        if cause is not None:  # aiomysql's "Can't connect" hides why (a TLS failure...)
            detail = f"{detail} ({type(cause).__name__}: {cause})"
        return detail

    # ------------------------------------------------------------------ locks

    def mutex_target(self, spec: LockSpec) -> str:
        return lock_name(spec.namespace, family(spec.kind), spec.name)

    async def attempt(self, spec: LockSpec, acq: Acq, conn: Conn, ttl: float) -> Attempt:
        """A mutex: ``GET_LOCK(name, 0)`` as the condition of its fencing bump. A semaphore:
        every slot in one statement, then the bump. A lock got inside a wait: the bump."""
        held = acq.held
        if held is None:
            if spec.kind is not Kind.SEMAPHORE:
                target = self.mutex_target(spec)
                token = await self._take_and_bump(spec, target, conn, ttl, acq.owner)
                return (None if token is None else target), token, False
            held = await self._get_now(spec, conn)
            if held is None:
                return None, None, False
        token = await self._bump_fence(spec, conn, ttl, acq.owner)
        return held, token, spec.kind is Kind.SEMAPHORE

    async def _get_now(self, spec: LockSpec, conn: Conn) -> str | None:
        """Take a free slot without waiting; the name taken, or None."""
        ns, fam, name = spec.namespace, family(spec.kind), spec.name
        # CASE stops at the first WHEN that holds: at most one slot is taken.
        slots = [lock_name(ns, fam, name, i) for i in range(spec.limit)]
        whens = " ".join(f"WHEN GET_LOCK('{slot}', 0) = 1 THEN {i}" for i, slot in enumerate(slots))
        index = await conn.value(f"SELECT CASE {whens} ELSE -1 END", timeout=self._bounds)
        if index is None or int(index) < 0:
            return None
        return slots[int(index)]

    async def _take_and_bump(
        self, spec: LockSpec, target: str, conn: Conn, ttl: float, owner: str
    ) -> int | None:
        """``GET_LOCK(target, 0)`` and, if it is ours, the fencing bump: one round trip.

        The lock's fencing token, or None when the lock is busy (nothing was written).
        """
        statement = self._fence_sql(sql.TAKE_AND_BUMP, spec, owner, target=target, wait="0")
        changed, token = await self._fence_query(conn, statement, ttl)
        if not changed:
            return None
        return self._token(token)

    async def _bump_fence(self, spec: LockSpec, conn: Conn, ttl: float, owner: str) -> int:
        """Next fencing token, on the connection that holds the lock."""
        bump = sql.SEM_FENCE_BUMP if spec.kind is Kind.SEMAPHORE else sql.FENCE_BUMP
        _, token = await self._fence_query(conn, self._fence_sql(bump, spec, owner), ttl)
        return self._token(token)

    def _token(self, token: int) -> int:
        if token < 1:
            raise BackendError(f"{self._where}: the fencing bump returned no token")
        return token

    def _fence_sql(
        self, template: str, spec: LockSpec, owner: str, *, target: str = "", wait: str = ""
    ) -> str:
        made = sql.fence_statement(
            template,
            self._table,
            spec.namespace,
            spec.name,
            spec.limit,
            self._touch_every,
            target,
            wait,
        )
        return made.replace(sql.OWNER, sql.hex_digits(owner))

    async def _fence_query(
        self, conn: Conn, statement: str, ttl: float, *, timeout: float | None = None
    ) -> tuple[int, int]:
        """Run a fencing statement (rows changed, insert id) on a session whose
        ``wait_timeout`` suits ``ttl``; create or upgrade the table if it needs it.

        A missing table or column fails the statement before it runs, GET_LOCK included.
        ``timeout`` bounds the statement (default: the request timeout; a wait's is longer).
        """
        bound: Limit = self._bounds if timeout is None else timeout
        await self._keep_session(conn, ttl)
        try:
            return await conn.write(statement, timeout=bound, harmless=_MISSING)
        except DRIVER_ERRORS as exc:
            if error_code(exc) not in _MISSING:
                raise
            await self._upgrade_fence_table(conn, error_code(exc))
        return await conn.write(statement, timeout=bound)

    async def _keep_session(self, conn: Conn, ttl: float) -> None:
        """The holder session's ``wait_timeout``: never shorter than the lease."""
        wanted = max(1, min(math.ceil(ttl), sql.MAX_WAIT_TIMEOUT))
        if conn.wait_timeout != wanted:
            await conn.query(f"SET SESSION wait_timeout = {wanted}", timeout=self._bounds)
            conn.wait_timeout = wanted

    async def _upgrade_fence_table(self, conn: Conn, code: int | None) -> None:
        """Create the fence table, or add the columns an older aiodlock did not make."""
        if code == sql.ER_NO_SUCH_TABLE:
            ddl = sql.FENCE_DDL.format(
                table=self._table,
                limit_column=sql.LIMIT_COLUMN,
                touched_column=sql.TOUCHED_COLUMN.replace("ADD INDEX", "INDEX"),
                who_columns=sql.WHO_COLUMNS.replace("ADD COLUMN ", "").replace(
                    "ADD INDEX", "INDEX"
                ),
            )
            await conn.query(ddl, timeout=self._bounds)
            return
        for column in (sql.LIMIT_COLUMN, sql.TOUCHED_COLUMN, sql.WHO_COLUMNS):
            alter = f"ALTER TABLE {self._table} ADD COLUMN {column}"
            with contextlib.suppress(*DRIVER_ERRORS):  # it is there (made by another client)
                await conn.query(alter, timeout=self._bounds, harmless=(sql.ER_DUP_FIELDNAME,))

    async def recorded_limit(
        self, spec: LockSpec, conn: Conn, *, lock_row: bool = False
    ) -> int | None:
        key = fence_key(spec.namespace, spec.name).hex()
        statement = f"SELECT sem_limit FROM {self._table} WHERE lock_key = X'{key}'"
        if lock_row:
            recorded = await conn.value(f"{statement} FOR UPDATE", timeout=self._bounds)
            return None if recorded is None else int(recorded)
        try:
            rows, _ = await conn.query(statement, timeout=self._bounds, harmless=_MISSING)
        except DRIVER_ERRORS as exc:
            if error_code(exc) not in _MISSING:
                raise
            return None  # no holder has recorded a limit yet
        recorded = rows[0][0] if rows else None
        return None if recorded is None else int(recorded)

    async def record_limit(self, spec: LockSpec, conn: Conn) -> None:
        key = fence_key(spec.namespace, spec.name).hex()
        await conn.query(
            f"UPDATE {self._table} SET sem_limit = {spec.limit} WHERE lock_key = X'{key}'",
            timeout=self._bounds,
        )

    async def slots_held_by_others(self, spec: LockSpec, conn: Conn, limit: int) -> bool:
        me = "CONNECTION_ID()"
        fam = family(spec.kind)
        slots = [lock_name(spec.namespace, fam, spec.name, i) for i in range(limit)]
        others = " + ".join(f"(IFNULL(IS_USED_LOCK('{s}'), {me}) <> {me})" for s in slots)
        return bool(int(await conn.value(f"SELECT {others}", timeout=self._bounds)))

    async def begin(self, conn: Conn) -> None:
        await conn.query("START TRANSACTION", timeout=self._bounds)

    async def finish(self, conn: Conn, *, commit: bool) -> None:
        await conn.query("COMMIT" if commit else "ROLLBACK", timeout=self._bounds)

    def foreign_row(self, spec: LockSpec) -> str:
        return f"{self._where}: the fencing bump of {spec.name!r} returned no token"

    async def wait(self, spec: LockSpec, acq: Acq, conn: Conn, slice_: float) -> None:
        """One ``GET_LOCK(name, slice)`` (a mutex's: its fencing statement); on success the
        session holds it (``acq.held``)."""
        ns, fam = spec.namespace, family(spec.kind)
        if spec.kind is Kind.SEMAPHORE:
            slot = (acq.start_slot + acq.waits) % spec.limit
            target = lock_name(ns, fam, spec.name, slot)
        else:
            target = lock_name(ns, fam, spec.name)
        acq.waits += 1
        ttl = acq.ttl
        if spec.kind is Kind.MUTEX and ttl is not None:
            # A slice of at most ttl/3 leaves a grant at its end 2/3 of its lease. MySQL
            # waits whole seconds: a slice capped below one is left to the plain wait.
            fenced = min(slice_, ttl / 3)
            if self.fractional_timeouts or fenced >= 1:
                await self._wait_fenced(spec, acq, conn, target, ttl, fenced)
                return
        cut_short = False
        if self.fractional_timeouts:
            statement = f"SELECT GET_LOCK('{target}', {slice_:.6f})"
            bound = slice_ + self._request_timeout
        elif slice_ >= 1:
            # MySQL takes whole seconds: wait the whole part; the rest is a later slice.
            whole = int(slice_)
            statement = f"SELECT GET_LOCK('{target}', {whole})"
            bound = whole + self._request_timeout
        else:
            # Under a second on MySQL: wait one second on the server, give up locally (the
            # connection is closed, and the janitor ends that session on the server).
            statement = f"SELECT GET_LOCK('{target}', 1)"
            bound = slice_
            cut_short = True
        try:
            got = await conn.value(statement, timeout=bound)
        except TimeoutError:
            if cut_short:
                return
            raise
        if got == 1:
            acq.held = target
        elif got is None:
            raise BackendError(f"{self._where}: GET_LOCK of {spec.name!r} failed (session killed?)")

    async def _wait_fenced(
        self, spec: LockSpec, acq: Acq, conn: Conn, target: str, ttl: float, slice_: float
    ) -> None:
        """One wait that takes the lock and its fencing token in one statement
        (``TAKE_AND_BUMP`` with ``GET_LOCK(target, slice)``); a grant is kept in
        ``acq.claim`` for the next attempt, its lease timed from the moment the statement was
        sent (the server starts the session's idle clock later, when it ends)."""
        wait = f"{slice_:.6f}" if self.fractional_timeouts else str(int(slice_))
        statement = self._fence_sql(sql.TAKE_AND_BUMP, spec, acq.owner, target=target, wait=wait)
        sent = asyncio.get_running_loop().time()
        changed, token = await self._fence_query(
            conn, statement, ttl, timeout=slice_ + self._request_timeout
        )
        if changed:
            acq.held = target  # so that leaving without a claim releases it
            acq.claim = Grant(self._token(token), sent)

    async def confirm(self, conn: Conn, held: str, ttl: float) -> bool:
        """``IS_USED_LOCK(name) = CONNECTION_ID()``, and the session's ``wait_timeout``."""
        ours = await conn.value(
            f"SELECT IS_USED_LOCK('{held}') = CONNECTION_ID()", timeout=self._bounds
        )
        if ours != 1:
            return False
        await self._keep_session(conn, ttl)
        return True

    async def release_one(self, conn: Conn, held: str, ttl: float | None) -> bool:
        """``RELEASE_LOCK`` of one lock of a shared session, keeping its others; its
        ``wait_timeout`` then suits ``ttl`` (the shortest lease left on it; None: none is,
        and a session idle for its old ``wait_timeout`` is simply reopened)."""
        released = await conn.value(f"SELECT RELEASE_LOCK('{held}')", timeout=self._bounds)
        if ttl is not None:
            await self._keep_session(conn, ttl)
        return bool(released == 1)

    async def keep_idle(self, conn: Conn, ttl: float) -> None:
        """``wait_timeout`` back to ``ttl`` (a refused grant set it for its own ttl first)."""
        await self._keep_session(conn, ttl)

    async def release(self, conn: Conn, held: str) -> tuple[bool, bool]:
        """``RELEASE_LOCK``, and ``RELEASE_ALL_LOCKS`` for anything stacked by mistake."""
        released, others = await conn.row(
            f"SELECT RELEASE_LOCK('{held}'), RELEASE_ALL_LOCKS()", timeout=self._bounds
        )
        return released == 1, released == 1 and others == 0

    # ------------------------------------------------------------------ fencing, operators

    async def sweep_batch(self, conn: Conn) -> int:
        statement = sql.SWEEP.format(table=self._table, seconds=self._fence_ttl)
        return await conn.change(statement, timeout=self._bounds)

    async def sweep_sessions(self, conn: Conn) -> None:
        """Delete the identity rows of sessions that are gone (:class:`SessionRecords`)."""
        await self._records.sweep(conn)

    async def namespaces(self, run: Operate[Conn]) -> list[str]:
        """Every namespace of the fencing table, sorted (some may hold nothing now)."""
        rows = await self._operator_query(
            run, "namespaces", sql.NAMESPACES.format(table=self._table)
        )
        return sorted(bytes(ns).decode("utf-8", "surrogatepass") for (ns,) in rows)

    async def _identities(self, run: Operate[Conn], sessions: set[int]) -> dict[int, str]:
        """The client identity each of ``sessions`` recorded (none: older code)."""
        if not sessions:
            return {}
        query = self._records.identities_query(sessions)
        return SessionRecords.identities(await self._operator_query(run, "inspect", query))

    async def inspect(self, run: Operate[Conn], namespace: str, pattern: str) -> list[LockInfo]:
        """Names from the fencing table (server-side names may be hashes), holders from
        ``IS_USED_LOCK`` of each lock name (a semaphore: of each slot), one statement per
        name. A holder is named by the owner id its grant recorded in the row when its session
        made the newest grant, else as ``connection N``; its identity is its session's row in
        the sessions table (None: no row, an older aiodlock); ``expires_in`` is ``None``. Waiters
        are the sessions waiting in ``GET_LOCK(name, slice)`` in ``PROCESSLIST`` (other
        users' sessions only with the ``PROCESS`` privilege)."""
        waits = collections.Counter(
            match[0]
            for (info,) in await self._operator_query(run, "inspect", sql.WAITS)
            for match in sql.WAIT_CALL.findall(str(info))
            if float(match[1]) > 0
        )
        rows = await self._operator_query(
            run,
            "inspect",
            f"SELECT name, token, sem_limit, holder, holder_connection FROM {self._table} "
            f"WHERE namespace = X'{sql.hex_digits(namespace)}' AND name IS NOT NULL",
        )
        held: list[tuple[str, Kind, list[int], bytes | None, int | None, int, int]] = []
        for raw_name, token, sem_limit, holder, holder_conn in sorted(rows):
            name = bytes(raw_name).decode("utf-8", "surrogatepass")
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            families = (
                (Kind.MUTEX, [lock_name(namespace, "m", name)]),
                (
                    Kind.SEMAPHORE,
                    [lock_name(namespace, "s", name, i) for i in range(sem_limit or 0)],
                ),
            )
            for kind, labels in families:
                if not labels:
                    continue
                used = await self._operator_query(
                    run, "inspect", "SELECT " + ", ".join(f"IS_USED_LOCK('{x}')" for x in labels)
                )
                sessions = [int(conn) for conn in used[0] if conn is not None]
                if sessions:
                    waiters = sum(waits[label] for label in labels)
                    held.append((name, kind, sessions, holder, holder_conn, int(token), waiters))
        identities = await self._identities(run, {s for h in held for s in h[2]})
        return [
            LockInfo(
                name,
                kind,
                tuple(
                    HolderInfo(sql.holder_name(s, holder, holder_conn), None, identities.get(s))
                    for s in sessions
                ),
                token,
                waiters,
            )
            for name, kind, sessions, holder, holder_conn, token, waiters in held
        ]

    async def break_lock(self, run: Operate[Conn], spec: LockSpec) -> int:
        """``KILL CONNECTION`` every session holding the lock (a semaphore: any slot), then
        move its fencing row on. Needs the right to kill those sessions."""
        fam = family(spec.kind)
        if spec.kind is Kind.SEMAPHORE:
            labels = [
                lock_name(spec.namespace, fam, spec.name, i) for i in range(MAX_SEMAPHORE_LIMIT)
            ]
        else:
            labels = [lock_name(spec.namespace, fam, spec.name)]
        used = await self._operator_query(
            run, "break", "SELECT " + ", ".join(f"IS_USED_LOCK('{x}')" for x in labels)
        )
        sessions = sorted({int(conn) for conn in used[0] if conn is not None})
        for session in sessions:
            # A session gone meanwhile (no such thread) is fine: its lock went with it.
            await self._operator_query(run, "break", f"KILL CONNECTION {session}")
        if sessions:
            key = fence_key(spec.namespace, spec.name).hex()
            move = sql.FENCE_MOVE.format(table=self._table, key=key)
            await self._operator_query(run, "break", move)
        return len(sessions)

    async def _operator_query(
        self, run: Operate[Conn], action: str, statement: str
    ) -> tuple[tuple[Any, ...], ...]:
        """One operator statement (a missing or old fencing table reads as empty, and so
        does a ``KILL`` of a session that is gone)."""

        async def work(conn: Conn) -> tuple[tuple[Any, ...], ...]:
            try:
                rows, _ = await conn.query(
                    statement, timeout=self._bounds, harmless=_OPERATOR_HARMLESS
                )
            except DRIVER_ERRORS as exc:
                if error_code(exc) in _OPERATOR_HARMLESS:
                    return ()
                raise
            return rows

        return await run(action, work)
