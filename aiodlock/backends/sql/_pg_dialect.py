"""The PostgreSQL dialect of the SQL engine: session-level advisory locks on asyncpg.

One statement takes the key (every slot of a semaphore), bumps the fencing row and sets the
holder's ``idle_session_timeout``; a wait is ``pg_advisory_lock`` under ``lock_timeout`` (a
lock's: fenced in the same statement); the keep-alive asks ``pg_locks``. A session in doubt
(an abandoned reply) is cleaned by the janitor before reuse. Each session records its client's
``identity`` in the sessions table when it opens, for ``inspect``. docs/postgres.md tells the
design.
"""

from __future__ import annotations

import asyncio
import collections
import fnmatch
import functools
import json
import math
from typing import Any, Final, NamedTuple

from .. import BackendError, Grant, HolderInfo, Kind, LockInfo, LockSpec
from . import _pg_sql as sql
from ._acquisitions import Acquisition, family
from ._connection import ConnectSettings
from ._dialect import Attempt, DialectBase, Operate
from ._fencing import SWEEP_BATCH
from ._pg_conn import DRIVER_ERRORS, LOCK_TIMEOUT, Conn, sqlstate
from ._pg_keys import advisory_key, fence_key, split_key
from ._pg_pooler import refuse_transaction_pooling
from ._settings import Settings, sessions_table

__all__ = ["MAX_SEMAPHORE_LIMIT", "Held", "PostgresDialect"]

MAX_SEMAPHORE_LIMIT: Final = DialectBase.max_semaphore_limit
_CLOSE_TIMEOUT: Final = 1.0  # seconds a connection may take to close politely at aclose()


class Held(NamedTuple):
    """The advisory key a session holds for an acquisition."""

    key: int
    shared: bool


Acq = Acquisition[Conn, Held]


class _Entry(NamedTuple):
    """One advisory lock of ``pg_locks`` as inspect reads it."""

    mode: str
    granted: bool
    pid: int
    application: str | None
    identity: str | None
    """The holding session's client identity (None: a session of older code, or not ours)."""

    def named(self, application: str) -> _Entry:
        """This entry with the holder's name the fencing row recorded."""
        return _Entry(self.mode, self.granted, self.pid, application, self.identity)


def _session_timeout_ms(ttl: float) -> int:
    """The holder session's ``idle_session_timeout``: never shorter than the lease."""
    return max(1, min(math.ceil(ttl * 1000), sql.MAX_TIMEOUT_MS))


class PostgresDialect(DialectBase):
    """How PostgreSQL runs each step of the engine (see the module docstring)."""

    name: str = "postgres"
    driver_errors: tuple[type[BaseException], ...] = DRIVER_ERRORS
    permit_unit: str = "one advisory key per permit"
    sessions_outgrow: bool = False  # a reused pid overwrites its row

    def __init__(self, settings: Settings, connect: ConnectSettings) -> None:
        super().__init__(settings, connect)
        self._fence_ttl = settings.fence_ttl
        self._sql: dict[tuple[bool | int | str, ...], str] = {}
        self._own_sessions = False  # start() found that statements keep their session
        self._sessions = sessions_table(self._table, longest=63)
        self._session_row = sql.SESSION_ROW.format(
            sessions=self._sessions,
            identity_hex=settings.identity.encode("utf-8", "surrogatepass").hex(),
        )

    # ------------------------------------------------------------------ sessions

    async def connect(self) -> Conn:
        conn = await Conn.open(self._connect)
        if self._own_sessions:
            try:
                await conn.configure(timeout=self._bounds, then=self._session_row)
            except BaseException:
                conn.close()
                raise
        return conn

    async def start(self, conn: Conn) -> str:
        """Refuse a pooler that does not keep our session, check the server is 14 or later,
        create the fencing and sessions tables if they are missing (or add the fencing
        table's ``holder`` column), then configure this first session."""
        await refuse_transaction_pooling(
            conn,
            open_other=functools.partial(Conn.open, self._connect),
            where=self._where,
            bounds=self._bounds,
        )
        row = await conn.fetchrow(
            "SELECT current_setting('server_version'), "
            "current_setting('server_version_num')::integer, to_regclass($1) IS NOT NULL, "
            "EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) "
            "AND attname = 'holder' AND NOT attisdropped), to_regclass($2) IS NOT NULL",
            self._table,
            self._sessions,
            timeout=self._bounds,
        )
        version, number, exists, has_holder, has_sessions = row
        if int(number) < 140000:
            raise BackendError(
                f"{self._where}: PostgreSQL {version} is too old: the postgres backend "
                "needs 14 or later (idle_session_timeout)"
            )
        if not exists:
            await self._create(conn, sql.FENCE_DDL, sql.FENCE_INDEX, sql.FENCE_COMMENT)
        elif not has_holder:
            await conn.script(sql.HOLDER_COLUMN.format(table=self._table), timeout=self._bounds)
        if not has_sessions:
            await self._create(conn, sql.SESSIONS_DDL, sql.SESSIONS_COMMENT)
        await conn.configure(timeout=self._bounds, then=self._session_row)
        self._own_sessions = True
        return str(version)

    async def _create(self, conn: Conn, *ddls: str) -> None:
        """Create a table (its index, its comment); another client creating it at the same
        moment is fine."""
        for ddl in ddls:
            try:
                await conn.script(
                    ddl.format(table=self._table, sessions=self._sessions), timeout=self._bounds
                )
            except DRIVER_ERRORS as exc:
                if sqlstate(exc) not in sql.DUPLICATE:
                    raise

    def stale(self, conn: Conn, idle_for: float) -> bool:
        return False  # an idle session has no idle_session_timeout (it is 0 until a grant)

    async def ping(self, conn: Conn) -> None:
        await conn.fetchrow("SELECT 1", timeout=self._bounds)

    def doubtful(self, conn: Conn) -> bool:
        return conn.doubtful

    async def clean(self, conn: Conn) -> None:
        """Drop whatever a session in doubt holds (a wait may have got its lock just before
        asyncpg's cancel arrived)."""
        await conn.script(sql.CLEAN, timeout=self._bounds)
        # Abandoned inside a transaction (a semaphore's limit check): closing is simpler than
        # knowing what the transaction did.
        if conn.in_transaction:
            raise RuntimeError("left inside a transaction")
        conn.doubtful = False

    def abandoned_session(self, conn: Conn) -> int | None:
        return None  # asyncpg cancels an abandoned statement on the server itself

    async def kill(self, conn: Conn, session: int) -> None:
        raise RuntimeError("postgres sessions are never doomed (see abandoned_session)")

    async def close_all(self, conns: list[Conn]) -> None:
        # In parallel, each bounded: a held lock's session ends with its connection.
        await asyncio.gather(
            *(conn.aclose(timeout=_CLOSE_TIMEOUT) for conn in conns), return_exceptions=True
        )

    # ------------------------------------------------------------------ locks

    def mutex_target(self, spec: LockSpec) -> Held:
        return Held(advisory_key(spec.namespace, "m", spec.name), False)

    def _keys(self, spec: LockSpec) -> list[int]:
        ns, fam, name = spec.namespace, family(spec.kind), spec.name
        if spec.kind is Kind.SEMAPHORE:
            return [advisory_key(ns, fam, name, i) for i in range(spec.limit)]
        return [advisory_key(ns, fam, name)]

    def _held(self, spec: LockSpec, slot: int) -> Held:
        return Held(self._keys(spec)[slot], spec.kind is Kind.READ)

    async def attempt(self, spec: LockSpec, acq: Acq, conn: Conn, ttl: float) -> Attempt:
        """Take the lock and bump its fencing row in one statement (claiming what a wait got:
        the bump only); a semaphore whose recorded limit is not ours is checked after."""
        claiming = acq.held is not None
        args: list[Any] = [
            fence_key(spec.namespace, spec.name),
            spec.namespace,
            spec.name,
            spec.limit if spec.kind is Kind.SEMAPHORE else None,
            str(_session_timeout_ms(ttl)),
        ]
        keys = self._keys(spec)
        if not claiming:
            args.append(keys)
        args.append(sql.APPLICATION + acq.owner)
        statement = self._grant_sql(spec.kind is Kind.READ, len(keys), claiming)
        row = await conn.fetchrow(statement, *args, timeout=self._bounds)
        slot, token, recorded = int(row[0]), row[1], row[2]
        if slot < 0:
            return None, None, False
        held = acq.held if claiming else self._held(spec, slot)
        if token is None:
            return held, None, False
        check = spec.kind is Kind.SEMAPHORE and (recorded is None or int(recorded) != spec.limit)
        return held, int(token), check

    def _grant_sql(self, shared: bool, slots: int, claiming: bool) -> str:
        """The grant (or claim) statement for this many slots, made once per shape."""
        shape = (shared, slots, claiming)
        statement = self._sql.get(shape)
        if statement is None:
            if claiming:
                bump = sql.BUMP.format(
                    table=self._table, clock=sql.CLOCK_US, source="", holder="$6"
                )
                statement = sql.CLAIM.format(bump=bump)
            else:
                try_ = f"pg_try_advisory_lock{'_shared' if shared else ''}"
                whens = " ".join(
                    f"WHEN {try_}(($6::bigint[])[{i + 1}]) THEN {i}" for i in range(slots)
                )
                source = "FROM got WHERE got.slot >= 0"
                bump = sql.BUMP.format(
                    table=self._table, clock=sql.CLOCK_US, source=source, holder="$7"
                )
                statement = sql.GRANT.format(whens=whens, bump=bump)
            self._sql[shape] = statement
        return statement

    async def recorded_limit(
        self, spec: LockSpec, conn: Conn, *, lock_row: bool = False
    ) -> int | None:
        row = await conn.fetchrow(
            f"SELECT sem_limit FROM {self._table} WHERE lock_key = $1"
            + (" FOR UPDATE" if lock_row else ""),
            fence_key(spec.namespace, spec.name),
            timeout=self._bounds,
        )
        recorded = row[0] if row else None
        return None if recorded is None else int(recorded)

    async def record_limit(self, spec: LockSpec, conn: Conn) -> None:
        await conn.fetchrow(
            f"UPDATE {self._table} SET sem_limit = $2 WHERE lock_key = $1",
            fence_key(spec.namespace, spec.name),
            spec.limit,
            timeout=self._bounds,
        )

    async def slots_held_by_others(self, spec: LockSpec, conn: Conn, limit: int) -> bool:
        ns, fam = spec.namespace, family(spec.kind)
        keys = [advisory_key(ns, fam, spec.name, i) for i in range(limit)]
        row = await conn.fetchrow(sql.HELD_BY_OTHERS, keys, timeout=self._bounds)
        return bool(row and row[0])

    async def begin(self, conn: Conn) -> None:
        await conn.script("BEGIN", timeout=self._bounds)

    async def finish(self, conn: Conn, *, commit: bool) -> None:
        await conn.script("COMMIT" if commit else "ROLLBACK", timeout=self._bounds)

    def foreign_row(self, spec: LockSpec) -> str:
        return (
            f"{self._where}: the fencing row of {spec.name!r} (key "
            f"{fence_key(spec.namespace, spec.name)}) belongs to another name in table "
            f"{self._table}: a 64-bit hash collision; rename one of the two locks"
        )

    async def wait(self, spec: LockSpec, acq: Acq, conn: Conn, slice_: float) -> None:
        """One ``pg_advisory_lock`` under ``lock_timeout``; on success the session holds it."""
        keys = self._keys(spec)
        slot = (acq.start_slot + acq.waits) % len(keys)
        acq.waits += 1
        held = self._held(spec, slot)
        # A lock's wait is its fencing statement (a semaphore slot's is a plain script). A
        # lease granted at the end of a slice then starts with at least 2/3 of its ttl.
        fenced = acq.ttl if spec.kind is not Kind.SEMAPHORE else None
        if fenced is not None:
            slice_ = min(slice_, fenced / 3)
        ms = max(1, min(math.ceil(slice_ * 1000), sql.MAX_TIMEOUT_MS))
        sent = asyncio.get_running_loop().time()
        try:
            if fenced is not None:
                row = await conn.fetchrow(
                    self._fenced_wait_sql(held.shared),
                    fence_key(spec.namespace, spec.name),
                    spec.namespace,
                    spec.name,
                    None,
                    str(_session_timeout_ms(fenced)),
                    sql.APPLICATION + acq.owner,
                    held.key,
                    str(ms),
                    timeout=slice_ + self._request_timeout,
                )
            else:
                # One implicit transaction: if the wait times out, the SET is rolled back.
                lock = "pg_advisory_lock_shared" if held.shared else "pg_advisory_lock"
                await conn.script(
                    f"SET lock_timeout = {ms}; SELECT {lock}({held.key}); SET lock_timeout = 0",
                    timeout=slice_ + self._request_timeout,
                )
                row = ()
        except DRIVER_ERRORS as exc:
            if sqlstate(exc) == LOCK_TIMEOUT:
                return  # the slice ran out on the server; the caller re-checks
            raise
        acq.held = held  # so that leaving without a claim releases it
        if row and row[1] is not None:
            # Granted and fenced: the next attempt claims it with its token, the lease timed
            # from this statement's start (the server's idle clock starts when it ends). No
            # token: the next attempt's claim reports the collision.
            acq.claim = Grant(int(row[1]), sent)

    def _fenced_wait_sql(self, shared: bool) -> str:
        shape = ("wait", shared)
        statement = self._sql.get(shape)
        if statement is None:
            bump = sql.BUMP.format(
                table=self._table, clock=sql.CLOCK_US, source="FROM disarmed", holder="$6"
            )
            lock = "pg_advisory_lock_shared" if shared else "pg_advisory_lock"
            statement = self._sql[shape] = sql.FENCED_WAIT.format(lock=lock, bump=bump)
        return statement

    async def confirm(self, conn: Conn, held: Held, ttl: float) -> bool:
        """Whether our backend pid still holds the key (``pg_locks``), keeping the session's
        ``idle_session_timeout`` at the ttl."""
        classid, objid = split_key(held.key)
        wanted = str(_session_timeout_ms(ttl))
        row = await conn.fetchrow(sql.KEEP_ALIVE, classid, objid, wanted, timeout=self._bounds)
        return bool(row and row[0] is True)

    async def release_one(self, conn: Conn, held: Held, ttl: float | None) -> bool:
        """Unlock one mutex of a shared session, keeping its others; its idle timeout then
        suits ``ttl`` (the shortest lease left on it; None: none is)."""
        wanted = "0" if ttl is None else str(_session_timeout_ms(ttl))
        row = await conn.fetchrow(sql.RELEASE_ONE_EXCLUSIVE, held.key, wanted, timeout=self._bounds)
        return bool(row and row[0] is True)

    async def keep_idle(self, conn: Conn, ttl: float) -> None:
        """Nothing: a refused grant leaves ``idle_session_timeout`` as it was."""

    async def release(self, conn: Conn, held: Held) -> tuple[bool, bool]:
        """Unlock (and anything stacked on the session by mistake)."""
        release = sql.RELEASE_SHARED if held.shared else sql.RELEASE_EXCLUSIVE
        row = await conn.fetchrow(release, held.key, timeout=self._bounds)
        return bool(row and row[0] is True), True

    # ------------------------------------------------------------------ fencing, operators

    async def sweep_batch(self, conn: Conn) -> int:
        statement = sql.SWEEP.format(table=self._table, batch=SWEEP_BATCH)
        row = await conn.fetchrow(statement, self._fence_ttl, timeout=self._bounds)
        return int(row[0]) if row else 0

    async def sweep_sessions(self, conn: Conn) -> None:
        """Delete the identity rows of sessions that have ended."""
        statement = sql.SESSIONS_SWEEP.format(sessions=self._sessions)
        await conn.fetchrow(statement, timeout=self._bounds)

    async def namespaces(self, run: Operate[Conn]) -> list[str]:
        """Every namespace of the fencing table, sorted (some may hold nothing now)."""
        statement = sql.NAMESPACES.format(table=self._table)
        (found,) = await self._operator_row(run, "namespaces", statement)
        return sorted(str(namespace) for namespace in json.loads(found))

    async def inspect(self, run: Operate[Conn], namespace: str, pattern: str) -> list[LockInfo]:
        """Names from the fencing table (advisory keys are hashes), holders and waiters from
        ``pg_locks``: one statement. A holder's owner is its session's ``application_name``
        (``aiodlock:OWNER``, set by the grant), else ``pid N``; its identity is its session's
        row in the sessions table (None: no row, an older aiodlock); ``expires_in`` is
        ``None``."""
        statement = sql.INSPECT.format(table=self._table, sessions=self._sessions)
        rows, locks = await self._operator_row(run, "inspect", statement, namespace)
        by_key: dict[int, list[_Entry]] = collections.defaultdict(list)
        for key, mode, granted, pid, application, identity in json.loads(locks):
            by_key[int(key)].append(
                _Entry(str(mode), bool(granted), int(pid), application, identity)
            )
        found: list[LockInfo] = []
        for name, token, sem_limit, holder in sorted(json.loads(rows), key=lambda r: r[0]):
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            families = (
                (Kind.MUTEX, [advisory_key(namespace, "m", name)]),
                (Kind.WRITE, [advisory_key(namespace, "rw", name)]),
                (
                    Kind.SEMAPHORE,
                    [advisory_key(namespace, "s", name, i) for i in range(sem_limit or 0)],
                ),
            )
            for kind, keys in families:
                entries = [entry for key in keys for entry in by_key.get(key, ())]
                holders = [e for e in entries if e.granted]
                if not holders:
                    continue
                if kind is Kind.WRITE and all(e.mode == "ShareLock" for e in holders):
                    kind = Kind.READ
                if kind is Kind.MUTEX and holder:
                    # One holder, maybe on a shared session (named after its last grant): the
                    # newest grant's owner, recorded in the row by the grant itself -- if an
                    # aiodlock session holds it (a transaction lock leaves the row's holder).
                    holders = [
                        e.named(holder)
                        if e.application and e.application.startswith(sql.APPLICATION)
                        else e
                        for e in holders
                    ]
                infos = tuple(
                    HolderInfo(sql.owner_of(e.pid, e.application), None, e.identity)
                    for e in holders
                )
                waiters = len(entries) - len(holders)
                found.append(LockInfo(name, kind, infos, int(token), waiters))
        return found

    async def break_lock(self, run: Operate[Conn], spec: LockSpec) -> int:
        """End every session holding the lock (``pg_terminate_backend``, waiting for each to
        be gone), then move its fencing row on. Needs the right to terminate those sessions
        (the same role, a superuser, or ``pg_signal_backend``)."""
        fam = family(spec.kind)
        if spec.kind is Kind.SEMAPHORE:
            keys = [
                advisory_key(spec.namespace, fam, spec.name, i) for i in range(MAX_SEMAPHORE_LIMIT)
            ]
        else:
            keys = [advisory_key(spec.namespace, fam, spec.name)]
        (ended,) = await self._operator_row(
            run, "break", sql.TERMINATE, keys, sql.TERMINATE_WAIT_MS
        )
        if ended:
            await self._operator_row(
                run,
                "break",
                sql.FENCE_MOVE.format(table=self._table, clock=sql.CLOCK_US),
                fence_key(spec.namespace, spec.name),
                spec.namespace,
                spec.name,
            )
        return int(ended)

    async def _operator_row(
        self, run: Operate[Conn], action: str, statement: str, *args: Any
    ) -> tuple[Any, ...]:
        async def work(conn: Conn) -> tuple[Any, ...]:
            return await conn.fetchrow(statement, *args, timeout=self._bounds)

        return await run(action, work)
