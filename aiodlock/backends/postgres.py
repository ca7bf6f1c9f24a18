"""The PostgreSQL backend: ``postgresql://user:password@host:port/database`` on asyncpg.

Locks are the server's session-level **advisory locks**, each held by a **dedicated
connection**: the lock lives exactly as long as that session, so a crashed process, a
terminated backend (``pg_terminate_backend``), a dropped connection or a server restart frees
it at once, and nothing outlives its holder. PostgreSQL 14 or later.

**Connection lease.** A grant pins its connection until the release; a pinned connection is
never lent to anything else (a pool would hand the next borrower a session that still holds a
lock — we keep our own small idle list, which only ever contains sessions that hold nothing).
In the statement that grants the lock, the session's ``idle_session_timeout`` is set to the
lease's ttl, so a holder that stops talking (a stopped process, a stalled event loop, a
network partition) is disconnected — and its lock freed — by the server itself about ``ttl``
after its last keep-alive; the client's own pessimistic deadline passes first. The keep-alive
every ttl/3 asks ``pg_locks`` whether our backend pid still holds the key, and asyncpg's
termination listener watches the socket: the moment the server closes it, the lease's loss
signal is set and the guarded body is cancelled. Nothing ever reconnects behind the lock's
back.

**Waiting on the server.** A refused acquisition waits in ``pg_advisory_lock(key)`` on its own
connection under ``SET lock_timeout``, in slices of at most ``wait_slice`` seconds (default 1)
and never beyond the caller's ``timeout``: the server wakes it the moment the lock is free;
nothing polls on the client. When the wait gets the lock, that connection *is* the holder: the
next attempt of the same acquisition claims it (bumps the fencing token on it) instead of
releasing and racing again. A waiter cancelled mid-query has its query cancelled on the server
by asyncpg; because the wait may have got the lock just before the cancel arrived, the
connection goes to a janitor task that runs ``pg_advisory_unlock_all()`` on it before it is
reused (or closes it). No orphan lock survives a cancellation at any await point.

**Names** (see :mod:`._pg_keys`): 64 bits of SHA-256 over ``namespace``, family and name —
no registry table, no round trip per new name. A collision (about 2**-64 per pair of names)
could only make two names wait for each other; the fencing row, keyed by its own hash and
storing the namespace and name, detects one at the grant and refuses it.

**Fencing.** One statement takes the lock and bumps the name's row in the fencing table
(``fence_table``, created by the first client that connects): ``WITH got AS (SELECT
pg_try_advisory_lock(...)) INSERT ... ON CONFLICT DO UPDATE SET token = GREATEST(token + 1,
<server clock, µs>) ... RETURNING token``. A missing row is seeded from the server clock in
microseconds, so tokens keep increasing even after the row is deleted: rows untouched for
``fence_ttl`` (default 7 days, ``0`` = never) are deleted now and then (at most once per
``min(fence_ttl, 1 hour)`` per client, up to 10 batches of 1000 rows) — nothing per name lives
forever.

**Kinds.** Mutex: ``pg_try_advisory_lock``. Read/write: ``pg_try_advisory_lock_shared`` for
readers, the exclusive lock for writers, on one key. Semaphore of limit N: N slot keys, tried
in order in one statement (``CASE WHEN pg_try_advisory_lock(slot0) THEN 0 WHEN ...``); a waiter
waits on one slot per slice, starting from one chosen by its owner id and moving on each
slice. The fencing row records the limit its holders use (``sem_limit``); a slot taken with
another limit while they hold is given back and :class:`~aiodlock.LimitMismatchError` raised.
Fair locks are not offered: PostgreSQL's lock queue is not a documented FIFO (and a slice
that times out re-queues at the end), so ``fair=True`` raises ``UnsupportedError``.

**Failures.** Every asyncpg exception is translated to :class:`~aiodlock.BackendError`,
chained, its message free of the password. A keep-alive that fails because the connection is
gone reports the lease lost (the lock went with the session); it is not retried.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fnmatch
import json
import logging
import math
import ssl
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, NoReturn

from .._exceptions import BackendError, LimitMismatchError, UnsupportedError
from .._validate import check_seconds
from ._deadlines import Deadlines
from ._local_holders import LocalHolders
from ._pg_conn import DRIVER_ERRORS, LOCK_TIMEOUT, Conn, ConnectSettings, sqlstate
from ._pg_keys import advisory_key, check_table_name, fence_key, split_key
from ._protocol import (
    Busy,
    Capability,
    Grant,
    HolderInfo,
    Kind,
    LockInfo,
    LockSpec,
    LossSignal,
    Waiter,
)

if TYPE_CHECKING:
    from .._url import ParsedURL

__all__ = ["MAX_SEMAPHORE_LIMIT", "PostgresBackend"]

logger = logging.getLogger("aiodlock.postgres")

_DEFAULT_PORT: Final = 5432
_DEFAULT_CONNECT_TIMEOUT: Final = 10.0
_DEFAULT_QUERY_TIMEOUT: Final = 10.0
_DEFAULT_WAIT_SLICE: Final = 1.0
_DEFAULT_MAX_CONNECTIONS: Final = 100
_DEFAULT_MAX_IDLE: Final = 8
_DEFAULT_FENCE_TABLE: Final = "aiodlock_fence"
_DEFAULT_FENCE_TTL: Final = 7 * 24 * 3600.0
_MAX_SWEEP_INTERVAL: Final = 3600.0
_SWEEP_BATCH: Final = 1000
_SWEEP_BATCHES: Final = 10  # per sweep: a huge backlog is worked off over several sweeps
MAX_SEMAPHORE_LIMIT: Final = 256
"""One advisory key per permit, all tried in one statement: keep N reasonable."""
_PING_AFTER_IDLE: Final = 2.0
"""Seconds idle after which a pooled connection is checked (``SELECT 1``) before use."""
_CLOSE_TIMEOUT: Final = 1.0  # seconds a connection may take to close politely at aclose()
_MAX_TIMEOUT_MS: Final = 2_147_483_647  # the largest value of an integer GUC
_SSL_MODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_UNDEFINED_TABLE: Final = "42P01"
_DUPLICATE: Final = ("42P07", "23505")  # a concurrent CREATE of the same table or index

_CLOCK_US: Final = "(extract(epoch from clock_timestamp()) * 1000000)::bigint"

_FENCE_DDL: Final = """CREATE TABLE IF NOT EXISTS {table} (
    lock_key bigint PRIMARY KEY,
    namespace text NOT NULL,
    name text NOT NULL,
    token bigint NOT NULL,
    sem_limit integer,
    touched timestamptz NOT NULL DEFAULT clock_timestamp()
)"""
_FENCE_INDEX: Final = "CREATE INDEX IF NOT EXISTS {table}_touched ON {table} (touched)"
_FENCE_COMMENT: Final = (
    "COMMENT ON TABLE {table} IS 'aiodlock fencing tokens: one row per lock name "
    "(lock_key = 64 bits of sha256(namespace NUL name))'"
)

# $1 fence key, $2 namespace, $3 name, $4 the semaphore's limit (NULL for other kinds). A new
# row starts at the server clock in microseconds, and every bump keeps up with that clock, so a
# row deleted after fence_ttl comes back above every token it ever handed out. A row of
# another name (a hash collision) is left alone: no row comes back.
_BUMP: Final = """bump AS (
    INSERT INTO {table} AS f (lock_key, namespace, name, token, sem_limit, touched)
    SELECT $1, $2, $3, {clock}, $4::integer, clock_timestamp() {source}
    ON CONFLICT (lock_key) DO UPDATE
        SET token = GREATEST(f.token + 1, {clock}), touched = clock_timestamp(),
            sem_limit = COALESCE(f.sem_limit, EXCLUDED.sem_limit)
        WHERE f.namespace = EXCLUDED.namespace AND f.name = EXCLUDED.name
    RETURNING f.token, f.sem_limit)"""

# The grant: try the key(s) ($6, in order, stopping at the first taken) and bump the fencing
# row in the same statement, and set the holder's idle_session_timeout ($5, ms) — one round
# trip. Returns (slot taken or -1, token, sem_limit).
_GRANT: Final = """WITH got AS MATERIALIZED (SELECT CASE {whens} ELSE -1 END AS slot),
{bump}
SELECT got.slot, bump.token, bump.sem_limit,
       set_config('idle_session_timeout', CASE WHEN got.slot >= 0 THEN $5 ELSE '0' END, false),
       set_config('application_name', CASE WHEN got.slot >= 0 THEN $7 ELSE 'aiodlock' END, false)
FROM got LEFT JOIN bump ON true"""

# A wait that fences: under lock_timeout ($8 ms, set for this statement only, and back to 0
# once the key is ours: the bump must not time out holding it), wait for the key ($7) and
# bump the fencing row in the same statement, so a grant inside the wait arrives with its
# token. A wait that runs out fails with lock_not_available; nothing of it remains.
_FENCED_WAIT: Final = """WITH armed AS MATERIALIZED (SELECT set_config('lock_timeout', $8, true)),
got AS MATERIALIZED (SELECT {lock}($7::bigint) FROM armed),
disarmed AS MATERIALIZED (SELECT set_config('lock_timeout', '0', true) FROM got),
{bump}
SELECT 0, bump.token, bump.sem_limit, set_config('idle_session_timeout', $5, false),
       set_config('application_name', $6, false)
FROM disarmed LEFT JOIN bump ON true"""

# The claim of a lock the session got inside a wait: the bump alone.
_CLAIM: Final = """WITH {bump}
SELECT 0, bump.token, bump.sem_limit, set_config('idle_session_timeout', $5, false),
       set_config('application_name', $6, false)
FROM (SELECT 1) AS one LEFT JOIN bump ON true"""

_DATABASE: Final = "(SELECT oid FROM pg_database WHERE datname = current_database())"
_APPLICATION: Final = "aiodlock:"
"""A session holding a lock is named ``aiodlock:OWNER`` (``application_name``, set by the
grant statement itself, back to ``aiodlock`` by the release), so that an operator's
``inspect`` can name the owner."""
_ADVISORY_KEY: Final = "((l.classid::bigint << 32) | l.objid::bigint)"
# inspect: the namespace's fencing rows (name, newest token, sem_limit), and every advisory
# lock of this database (key, mode, granted, pid, application_name): JSON, in one row.
_INSPECT: Final = f"""SELECT
  (SELECT coalesce(json_agg(json_build_array(name, token, sem_limit)), '[]')::text
     FROM {{table}} WHERE namespace = $1),
  (SELECT coalesce(json_agg(json_build_array({_ADVISORY_KEY}, l.mode, l.granted, l.pid,
                                             a.application_name)), '[]')::text
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.database = {_DATABASE})"""
# break: end every session holding one of the keys ($1), waiting up to $2 ms for each to be
# gone (so its locks are free when this returns); how many were ended.
_TERMINATE: Final = f"""SELECT count(*) FILTER (WHERE pg_terminate_backend(holder.pid, $2))
FROM (SELECT DISTINCT l.pid FROM pg_locks l
      WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
        AND l.database = {_DATABASE} AND l.pid <> pg_backend_pid()
        AND {_ADVISORY_KEY} = ANY($1::bigint[])) AS holder"""
_TERMINATE_WAIT_MS: Final = 5000
# break: move the fencing row on, as a grant would (a row of another name is left alone).
_FENCE_MOVE: Final = """UPDATE {table} SET token = GREATEST(token + 1, {clock}),
    touched = clock_timestamp()
WHERE lock_key = $1 AND namespace = $2 AND name = $3"""
_KEEP_ALIVE: Final = f"""SELECT EXISTS (
    SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
    AND pid = pg_backend_pid() AND classid = $1::oid AND objid = $2::oid
    AND database = {_DATABASE}), set_config('idle_session_timeout', $3, false)"""
_HELD_BY_OTHERS: Final = f"""SELECT EXISTS (
    SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
    AND pid <> pg_backend_pid() AND database = {_DATABASE}
    AND ((classid::bigint << 32) | objid::bigint) = ANY($1::bigint[]))"""
# Left to right: the key, then anything stacked on the session by mistake.
_RELEASE: Final = (
    "SELECT {unlock}($1), pg_advisory_unlock_all(), "
    "set_config('idle_session_timeout', '0', false), "
    "set_config('application_name', 'aiodlock', false)"
)
_RELEASE_EXCLUSIVE: Final = _RELEASE.format(unlock="pg_advisory_unlock")
_RELEASE_SHARED: Final = _RELEASE.format(unlock="pg_advisory_unlock_shared")
_CLEAN: Final = (
    "SELECT pg_advisory_unlock_all(); SET idle_session_timeout = 0; SET lock_timeout = 0; "
    "SET application_name = 'aiodlock'"
)
_SWEEP: Final = """WITH gone AS (DELETE FROM {table} WHERE lock_key IN (
    SELECT lock_key FROM {table} WHERE touched < clock_timestamp() - make_interval(secs => $1)
    LIMIT {batch} FOR UPDATE SKIP LOCKED) RETURNING 1)
SELECT count(*) FROM gone"""


def _family(kind: Kind) -> str:
    if kind is Kind.MUTEX:
        return "m"
    if kind is Kind.SEMAPHORE:
        return "s"
    return "rw"


def _session_timeout_ms(ttl: float) -> int:
    """The holder session's ``idle_session_timeout``: never shorter than the lease."""
    return max(1, min(math.ceil(ttl * 1000), _MAX_TIMEOUT_MS))


def _check_int(value: object, *, argument: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{argument} must be >= {minimum}, not {value}")
    return value


def _tls(options: Mapping[str, Any]) -> ssl.SSLContext | str | bool | None:
    """asyncpg's ``ssl`` argument from libpq's option names (``sslmode``, ``sslrootcert``,
    ``sslcert``, ``sslkey``), with libpq's meaning: ``verify-full`` checks the certificate
    and the host name, ``verify-ca`` the certificate only, ``require`` encrypts (and checks
    the certificate if ``sslrootcert`` is given)."""
    given: dict[str, str | None] = {}
    for option in ("sslmode", "sslrootcert", "sslcert", "sslkey"):
        value = options.get(option)
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{option} must be a non-empty str")
        given[option] = value
    mode, root = given["sslmode"], given["sslrootcert"]
    cert, key = given["sslcert"], given["sslkey"]
    if mode is not None and mode not in _SSL_MODES:
        raise ValueError(f"sslmode must be one of {', '.join(_SSL_MODES)}, not {mode!r}")
    if (cert is None) != (key is None):
        raise ValueError("sslcert and sslkey go together (a client certificate and its key)")
    files = root is not None or cert is not None
    if mode == "disable":
        if files:
            raise ValueError("sslmode=disable contradicts sslrootcert/sslcert: drop one")
        return False
    if mode in ("verify-ca", "verify-full") and root is None:
        raise ValueError(f"sslmode={mode} needs sslrootcert (the CA certificate file)")
    if mode is None and not files:
        return None  # asyncpg's default, libpq's: prefer
    if mode in (None, "allow", "prefer") and not files:
        return mode
    if mode in (None, "allow", "prefer"):
        raise ValueError(
            f"sslmode={mode or 'prefer'} may fall back to a plain connection: with "
            "certificate files, say sslmode=require, verify-ca or verify-full"
        )
    context = ssl.create_default_context(cafile=root)
    context.check_hostname = mode == "verify-full"
    if root is None:  # require without a CA: encrypted, not authenticated (as libpq)
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


@dataclass(slots=True)
class _Held:
    """The advisory key a session holds for an acquisition."""

    key: int
    shared: bool

    @property
    def release_sql(self) -> str:
        """The statement that gives the key back (and anything stacked by mistake)."""
        return _RELEASE_SHARED if self.shared else _RELEASE_EXCLUSIVE


class _Acquisition:
    """One acquisition (one owner): its connection, and what that session holds."""

    __slots__ = (
        "claim", "conn", "event", "granted", "held", "lost", "owner", "start_slot", "ttl", "waits",
    )

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.conn: Conn | None = None
        self.held: _Held | None = None
        """The key the session holds (a semaphore's slot), or None."""
        self.granted = False
        """Reported to the core as a Grant (with a fencing token)."""
        self.lost = False
        """The lock is known gone (keep-alive refused, connection dropped)."""
        self.event: asyncio.Event | None = None
        self.claim: Grant | None = None
        """A grant made inside a wait, token included, for the next attempt to report."""
        self.ttl: float | None = None
        """The lease asked for by the acquisition's attempts (its waits fence with it)."""
        self.start_slot = zlib.crc32(owner.encode())
        self.waits = 0


class _PostgresWaiter:
    """Waits on the server: ``pg_advisory_lock`` under ``lock_timeout`` on its connection."""

    __slots__ = ("_acq", "_backend", "_spec")

    def __init__(self, backend: PostgresBackend, spec: LockSpec, acq: _Acquisition) -> None:
        self._backend = backend
        self._spec = spec
        self._acq = acq

    async def wait(self, timeout: float | None) -> None:
        """One server-side wait of at most ``min(timeout, wait_slice)`` seconds."""
        if self._acq.held is not None:
            return  # the server already granted it: the next attempt claims it
        slice_ = self._backend._wait_slice
        if timeout is not None:
            if timeout <= 0:
                return
            slice_ = min(slice_, timeout)
        await self._backend._wait_once(self._spec, self._acq, slice_)


class PostgresBackend:
    """Locks on one PostgreSQL server (see the module docstring for the design).

    URL: ``postgresql://user:password@host:port/database`` (also ``postgres://``; port 5432 by
    default; the database holds the fencing table). Options (URL query or keyword):

    - ``connect_timeout`` (seconds, default 10): TCP connect, TLS, authentication;
    - ``query_timeout`` (seconds, default 10): any one statement, beyond a wait's own slice;
    - ``wait_slice`` (seconds, default 1): the longest single server-side lock wait;
    - ``max_connections`` (default 100): connections this client may open (every held lock and
      every waiting acquisition uses one); at the limit, a new one waits for a free one up to
      ``connect_timeout``, then fails with ``BackendError``;
    - ``max_idle`` (default 8): lock-free connections kept for reuse;
    - ``fence_table`` (default ``aiodlock_fence``): the fencing-token table;
    - ``fence_ttl`` (seconds, default 7 days; 0 = never): fencing rows idle this long are
      deleted (tokens still increase: a new row starts at the server clock);
    - ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``: TLS, with libpq's names and
      meanings (``disable``, ``allow``, ``prefer`` — the default —, ``require``,
      ``verify-ca``, ``verify-full``).

    Example::

        async with aiodlock.connect("postgresql://app:secret@db:5432/shop") as locks:
            async with locks.lock("order:42", ttl=10) as lease:
                print(lease.fencing_token)
    """

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.EXCLUSIVE,
            Capability.SHARED,
            Capability.COUNTING,
            Capability.FENCING,
            Capability.SESSION_LEASE,
            Capability.SERVER_WAKEUP,
            Capability.INSPECT,
            Capability.BREAK,
        }
    )
    queues_on_busy: ClassVar[bool] = False
    """A refused ``pg_try_advisory_lock`` leaves nothing queued on the server."""
    options: ClassVar[Mapping[str, type]] = {
        "connect_timeout": float,
        "query_timeout": float,
        "wait_slice": float,
        "max_connections": int,
        "max_idle": int,
        "fence_table": str,
        "fence_ttl": float,
        "sslmode": str,
        "sslrootcert": str,
        "sslcert": str,
        "sslkey": str,
    }

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        if len(url.hosts) > 1:
            raise ValueError(f"{url.scheme}:// takes one host, got {len(url.hosts)}")
        host, port = url.hosts[0] if url.hosts else ("localhost", None)
        database = url.path.strip("/")
        if not database:
            raise ValueError(
                f"{url.scheme}:// url needs a database for the fencing table: "
                f"{url.scheme}://user:password@host:5432/database"
            )

        def seconds(name: str, default: float, *, allow_zero: bool = False) -> float:
            value = options.get(name)
            if value is None:
                return default
            checked = check_seconds(value, argument=name, allow_none=False, allow_zero=allow_zero)
            assert checked is not None
            return checked

        self._connect_timeout = seconds("connect_timeout", _DEFAULT_CONNECT_TIMEOUT)
        self._query_timeout = seconds("query_timeout", _DEFAULT_QUERY_TIMEOUT)
        self._bounds = Deadlines(self._query_timeout)  # the usual statements' limit
        self._wait_slice = seconds("wait_slice", _DEFAULT_WAIT_SLICE)
        self._fence_ttl = seconds("fence_ttl", _DEFAULT_FENCE_TTL, allow_zero=True)
        self._max_connections = _check_int(
            options.get("max_connections", _DEFAULT_MAX_CONNECTIONS),
            argument="max_connections",
            minimum=1,
        )
        self._max_idle = _check_int(
            options.get("max_idle", _DEFAULT_MAX_IDLE), argument="max_idle", minimum=0
        )
        self._table = check_table_name(options.get("fence_table", _DEFAULT_FENCE_TABLE))
        self._settings = ConnectSettings(
            host=host or "localhost",
            port=port or _DEFAULT_PORT,
            user=url.username,
            password=url.password,
            database=database,
            connect_timeout=self._connect_timeout,
            ssl=_tls(options),
        )
        self._password = url.password
        self._where = url.redacted()
        self._state = "new"
        self._tg: asyncio.TaskGroup | None = None
        self._janitor: asyncio.Task[None] | None = None
        self._dirty: collections.deque[Conn] = collections.deque()
        self._sweep_due = False
        self._next_sweep = 0.0
        self._conns: set[Conn] = set()
        self._idle: collections.deque[Conn] = collections.deque()
        self._opening = 0
        self._room: collections.deque[asyncio.Future[None]] = collections.deque()
        self._acqs: dict[tuple[str, str, str, str], _Acquisition] = {}
        self._holders: LocalHolders[int, _Acquisition] = LocalHolders()
        self._waiting = 0
        self._server_version = ""
        self._sql: dict[tuple[bool | int | str, ...], str] = {}

    # ------------------------------------------------------------------ lifetime

    async def open(self) -> None:
        """Connect once (bounded by ``connect_timeout``) and make sure the fencing table
        exists."""
        if self._state != "new":
            raise RuntimeError("a PostgresBackend is opened once")
        self._state = "open"
        tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._tg = tg
        try:
            conn = await self._checkout()
            row = await conn.fetchrow(
                "SELECT current_setting('server_version'), "
                "current_setting('server_version_num')::integer, to_regclass($1) IS NOT NULL",
                self._table,
                timeout=self._bounds,
            )
            version, number, exists = row
            if int(number) < 140000:
                raise BackendError(
                    f"{self._where}: PostgreSQL {version} is too old: the postgres backend "
                    "needs 14 or later (idle_session_timeout)"
                )
            if not exists:
                await self._create_fence_table(conn)
        except BaseException as exc:
            await self.aclose()
            self._raise_translated(exc, "connect")
        self._server_version = str(version)
        self._checkin(conn)

    async def aclose(self) -> None:
        """Close every connection (the server frees what they held). Idempotent."""
        if self._state in ("closing", "closed"):
            return
        self._state = "closing"
        try:
            if self._janitor is not None:
                self._janitor.cancel()
            tg, self._tg = self._tg, None
            if tg is not None:
                await tg.__aexit__(None, None, None)
        finally:
            self._bounds.close()
            conns, self._conns = list(self._conns), set()
            self._idle.clear()
            self._acqs.clear()
            self._holders.clear()
            self._dirty.clear()
            # In parallel, each bounded: a held lock's session ends with its connection.
            await asyncio.gather(
                *(conn.aclose(timeout=_CLOSE_TIMEOUT) for conn in conns), return_exceptions=True
            )
            for future in self._room:
                if not future.done():
                    future.set_result(None)
            self._state = "closed"

    async def settle(self) -> None:
        """Wait for the janitor (:class:`~aiodlock.backends.Settler`): sessions in doubt
        cleaned or closed, and a fencing-row sweep under way finished."""
        while self._janitor is not None and not self._janitor.done():
            await asyncio.wait((self._janitor,))

    def check(self, spec: LockSpec) -> None:
        """Semaphores are N advisory keys: refuse an unreasonable N when the lock is built."""
        if spec.kind is Kind.SEMAPHORE and spec.limit > MAX_SEMAPHORE_LIMIT:
            raise UnsupportedError(
                f"{self._where} serves semaphores with limit <= {MAX_SEMAPHORE_LIMIT} "
                f"(one advisory key per permit), not {spec.limit}"
            )

    def describe(self) -> str:
        """The URL without its password."""
        return self._where

    def statistics(self) -> Mapping[str, Any]:
        """Connections (open, idle), locks held, waiting acquisitions, server version."""
        return {
            "connections": len(self._conns),
            "idle": len(self._idle),
            "held": sum(1 for a in self._acqs.values() if a.granted and not a.lost),
            "waiters": self._waiting,
            "server": self._server_version,
        }

    # ------------------------------------------------------------------ protocol

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """Try the key (every slot for a semaphore) and bump the fencing row, in one
        statement."""
        self._require_open()
        ident = _ident(spec, owner)
        acq = self._acqs.get(ident)
        waiting = acq is not None  # a waiter of this acquisition owns the connection
        if acq is not None and acq.granted:
            raise RuntimeError(f"owner {owner!r} already holds {spec.name!r}")
        if (acq is None or acq.held is None) and self._held_here(spec):
            if acq is not None:
                acq.ttl = ttl  # its waits fence with it
            return Busy(None)
        if acq is None:
            acq = self._acqs[ident] = _Acquisition(owner)
        acq.ttl = ttl
        sent = None
        try:
            if acq.conn is not None and acq.conn.closed:
                # The waiter's session ended (server restart...): what it got went with it.
                self._discard(acq.conn)
                acq.conn = None
                acq.held = acq.claim = None
            if acq.conn is None:
                acq.conn = await self._checkout()
            conn = acq.conn
            claiming = acq.held is not None
            token: int | None
            recorded: int | None
            if acq.claim is not None:  # granted and fenced by the wait's own statement
                claim, acq.claim = acq.claim, None
                slot, token, recorded, sent = 0, claim.fencing_token, None, claim.sent
            else:
                slot, token, recorded = await self._grant(
                    spec, conn, ttl, owner, claiming=claiming
                )
            if slot < 0:
                # Every slot of ours is taken: by holders of another limit? Then say so now,
                # instead of waiting for a slot (with a lower limit, forever).
                in_use = await self._limit_in_use(spec, conn)
                if not waiting:
                    del self._acqs[ident]
                    self._checkin(conn)
                    acq.conn = None
                if in_use is not None:
                    raise LimitMismatchError(spec.name, in_use, spec.limit)
                return Busy(None)
            if not claiming:
                acq.held = self._held(spec, slot)
            in_use = None
            if token is not None and spec.kind is Kind.SEMAPHORE and recorded != spec.limit:
                in_use = await self._claim_limit(spec, conn)
        except LimitMismatchError:
            raise  # refused holding nothing; a waiter's connection goes back with its waiter
        except BaseException as exc:
            # Outcome unknown (cancelled, connection lost): the session may hold the key.
            # Clean it (or close it, which frees anything it held) before any reuse.
            self._scrap(acq)
            if not waiting:
                self._acqs.pop(ident, None)
            self._raise_translated(exc, f"acquire of {spec.name!r}")
        if token is None:
            if not waiting:
                del self._acqs[ident]
            await self._retire(acq)
            raise BackendError(
                f"{self._where}: the fencing row of {spec.name!r} (key "
                f"{fence_key(spec.namespace, spec.name)}) belongs to another name in table "
                f"{self._table}: a 64-bit hash collision; rename one of the two locks"
            )
        if in_use is not None:
            # Give the slot back at once (a waiter's acquisition is left to its waiter).
            if not waiting:
                del self._acqs[ident]
            await self._retire(acq)
            raise LimitMismatchError(spec.name, in_use, spec.limit)
        acq.granted = True
        if spec.kind is Kind.MUTEX and acq.held is not None:
            self._holders.hold(acq.held.key, acq)
        acq.event = conn.lease_event = LossSignal()
        if conn.peer_closed:  # the server hung up right after the grant
            acq.event.set()
        self._maybe_sweep()
        return Grant(int(token), sent)

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """``pg_advisory_unlock`` on the holding connection, which then rejoins the idle list."""
        acq = self._acqs.pop(_ident(spec, owner), None)
        if acq is None:
            return False
        self._unhold(acq)
        conn = acq.conn
        if conn is None:
            return False
        async with conn.io:  # let a keep-alive in flight finish first
            acq.conn = None
            conn.lease_event = None
            if conn.closed:
                self._discard(conn)
                return False
            if acq.held is None:
                self._checkin(conn)
                return False
            return await self._release_on(conn, acq.held)

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Ask ``pg_locks`` whether our backend pid still holds the key (and keep the
        session's ``idle_session_timeout`` at the ttl).

        A keep-alive cancelled midway (its lease is being released) must not close the
        session: the server would free the lock some time after ``release()`` returned, and a
        contender trying right after would still find it taken. So the statement finishes in
        our task group (bounded by ``query_timeout``) and the release waits for it.
        """
        acq = self._acqs.get(_ident(spec, owner))
        if acq is None or not acq.granted or acq.lost or acq.held is None:
            return False
        conn = acq.conn
        if conn is None or conn.closed:
            self._lose(acq)
            return False
        confirm = self._confirm(acq, conn, ttl)
        if self._tg is None or self._state != "open":
            return await confirm
        return await asyncio.shield(
            self._tg.create_task(confirm, name="aiodlock-postgres-keepalive")
        )

    async def _confirm(self, acq: _Acquisition, conn: Conn, ttl: float) -> bool:
        """The keep-alive's statement; a failure loses the lease."""
        async with conn.io:
            held = acq.held
            if acq.conn is not conn or held is None:
                return False  # released while we waited for the connection
            classid, objid = split_key(held.key)
            wanted = _session_timeout_ms(ttl)
            try:
                row = await conn.fetchrow(
                    _KEEP_ALIVE, classid, objid, str(wanted), timeout=self._bounds
                )
            except DRIVER_ERRORS:  # TimeoutError among them
                # The connection is gone (and the lock went with the session), or the
                # server did not answer in time: the lease cannot be confirmed.
                self._lose(acq)
                return False
            except asyncio.CancelledError:
                # The client is closing: close the session, which frees the lock, rather
                # than wait for asyncpg's cancel to be answered.
                self._lose(acq)
                self._scrap(acq, close=True)
                raise
        if not row or row[0] is not True:
            self._lose(acq)
            return False
        return True

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """Set the moment the server closes the holding connection (or a keep-alive fails)."""
        acq = self._acqs.get(_ident(spec, owner))
        if acq is None or not acq.granted:
            return None
        return acq.event

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """None: the holding session's ``idle_session_timeout`` is the ttl, so the server
        keeps a silent holder's session at least ``ttl`` after its last keep-alive, and the
        ttl-based validity (last confirmed keep-alive + ttl - drift) already passes first."""
        return None

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        """Reserve the acquisition's connection; waits run ``pg_advisory_lock`` on it."""
        self._require_open()
        ident = _ident(spec, owner)
        acq = self._acqs.get(ident)
        if acq is None:
            acq = self._acqs[ident] = _Acquisition(owner)
        self._waiting += 1
        try:
            if acq.conn is None:
                try:
                    acq.conn = await self._checkout()
                except BaseException as exc:
                    self._raise_translated(exc, f"wait for {spec.name!r}")
            yield _PostgresWaiter(self, spec, acq)
        finally:
            self._waiting -= 1
            if not acq.granted:
                if self._acqs.get(ident) is acq:
                    del self._acqs[ident]
                await self._retire(acq)

    # ------------------------------------------------------------------ operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern``, sorted by name.

        Names come from the fencing table (advisory keys are hashes), holders and waiters from
        ``pg_locks``: one statement. A holder's owner is its session's ``application_name``
        (``aiodlock:OWNER``, set by the grant), else ``pid N``; ``expires_in`` is ``None``
        (the lease lives as long as the session).
        """
        sql = _INSPECT.format(table=self._table)
        rows, locks = await self._operator_row("inspect", sql, namespace)
        by_key: dict[int, list[tuple[str, bool, int, str | None]]] = collections.defaultdict(list)
        for key, mode, granted, pid, application in json.loads(locks):
            by_key[int(key)].append((str(mode), bool(granted), int(pid), application))
        found: list[LockInfo] = []
        for name, token, sem_limit in sorted(json.loads(rows)):
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
                holders = [e for e in entries if e[1]]
                if not holders:
                    continue
                if kind is Kind.WRITE and all(e[0] == "ShareLock" for e in holders):
                    kind = Kind.READ
                infos = tuple(HolderInfo(_owner_of(pid, app), None) for _, _, pid, app in holders)
                waiters = len(entries) - len(holders)
                found.append(LockInfo(name, kind, infos, int(token), waiters))
        return found

    async def break_lock(self, spec: LockSpec) -> int:
        """End every session holding ``spec``'s lock (``pg_terminate_backend``, waiting for
        each to be gone), then move its fencing row on. The holders' sockets close, so their
        leases are lost at once. Needs the right to terminate those sessions (the same role,
        a superuser, or ``pg_signal_backend``)."""
        family = _family(spec.kind)
        if spec.kind is Kind.SEMAPHORE:
            keys = [
                advisory_key(spec.namespace, family, spec.name, i)
                for i in range(MAX_SEMAPHORE_LIMIT)
            ]
        else:
            keys = [advisory_key(spec.namespace, family, spec.name)]
        (ended,) = await self._operator_row("break", _TERMINATE, keys, _TERMINATE_WAIT_MS)
        if ended:
            await self._operator_row(
                "break",
                _FENCE_MOVE.format(table=self._table, clock=_CLOCK_US),
                fence_key(spec.namespace, spec.name),
                spec.namespace,
                spec.name,
            )
        return int(ended)

    async def _operator_row(self, action: str, sql: str, *args: Any) -> tuple[Any, ...]:
        """One statement on a lock-free connection of ours, for inspect and break."""
        self._require_open()
        conn = await self._checkout()
        try:
            row = await conn.fetchrow(sql, *args, timeout=self._bounds)
        except BaseException as exc:
            self._checkin(conn)  # or to the janitor, if the reply was abandoned
            self._raise_translated(exc, action)
        self._checkin(conn)
        return row

    # ------------------------------------------------------------------ lock steps

    def _keys(self, spec: LockSpec) -> list[int]:
        ns, family, name = spec.namespace, _family(spec.kind), spec.name
        if spec.kind is Kind.SEMAPHORE:
            return [advisory_key(ns, family, name, i) for i in range(spec.limit)]
        return [advisory_key(ns, family, name)]

    def _held(self, spec: LockSpec, slot: int) -> _Held:
        return _Held(self._keys(spec)[slot], shared=spec.kind is Kind.READ)

    async def _grant(
        self, spec: LockSpec, conn: Conn, ttl: float, owner: str, *, claiming: bool
    ) -> tuple[int, int | None, int | None]:
        """Take the lock and bump its fencing row in one statement (``claiming``: the session
        got it inside a wait; bump only). ``(slot or -1, token, recorded sem_limit)``; the
        token is None when the row belongs to another name."""
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
        args.append(_APPLICATION + owner)
        sql = self._grant_sql(spec.kind is Kind.READ, len(keys), claiming)
        row = await conn.fetchrow(sql, *args, timeout=self._bounds)
        slot, token, recorded = row[0], row[1], row[2]
        return (
            int(slot),
            None if token is None else int(token),
            None if recorded is None else int(recorded),
        )

    def _grant_sql(self, shared: bool, slots: int, claiming: bool) -> str:
        """The grant (or claim) statement for this many slots, made once per shape."""
        shape = (shared, slots, claiming)
        sql = self._sql.get(shape)
        if sql is None:
            if claiming:
                bump = _BUMP.format(table=self._table, clock=_CLOCK_US, source="")
                sql = _CLAIM.format(bump=bump)
            else:
                try_ = f"pg_try_advisory_lock{'_shared' if shared else ''}"
                whens = " ".join(
                    f"WHEN {try_}(($6::bigint[])[{i + 1}]) THEN {i}" for i in range(slots)
                )
                source = "FROM got WHERE got.slot >= 0"
                bump = _BUMP.format(table=self._table, clock=_CLOCK_US, source=source)
                sql = _GRANT.format(whens=whens, bump=bump)
            self._sql[shape] = sql
        return sql

    async def _claim_limit(self, spec: LockSpec, conn: Conn) -> int | None:
        """Check the semaphore's recorded limit, on the session that just took a slot; None
        if it is ours (now), else the limit its holders use.

        The grant recorded our limit if the row had none. Every holder checks after taking its
        slot, so while a holder of limit R lives, one of the slots ``#0..#R-1`` is taken: a
        different recorded limit ``R`` is stale — left by holders that are all gone — exactly
        when no other session holds one of those slots. That check and the overwrite run under
        the row's lock (``FOR UPDATE``), so two clients cannot both replace it. Accepted race:
        a session that has taken a slot but not checked yet counts as a holder of R, so right
        after a limit change two first acquirers may refuse each other (never grant too
        many); the next attempt succeeds.
        """
        key = fence_key(spec.namespace, spec.name)
        timeout = self._bounds
        await conn.script("BEGIN", timeout=timeout)
        row = await conn.fetchrow(
            f"SELECT sem_limit FROM {self._table} WHERE lock_key = $1 FOR UPDATE",
            key,
            timeout=timeout,
        )
        recorded = row[0] if row else None
        in_use = spec.limit if recorded is None else int(recorded)
        if in_use != spec.limit and await self._slots_held_by_others(spec, conn, in_use):
            await conn.script("ROLLBACK", timeout=timeout)
            return in_use
        await conn.fetchrow(
            f"UPDATE {self._table} SET sem_limit = $2 WHERE lock_key = $1",
            key,
            spec.limit,
            timeout=timeout,
        )
        await conn.script("COMMIT", timeout=timeout)
        return None

    async def _limit_in_use(self, spec: LockSpec, conn: Conn) -> int | None:
        """For a refused semaphore attempt: the recorded limit if it differs from ours and
        holders of it are still there, else None (a plain read: it only refuses)."""
        if spec.kind is not Kind.SEMAPHORE:
            return None
        row = await conn.fetchrow(
            f"SELECT sem_limit FROM {self._table} WHERE lock_key = $1",
            fence_key(spec.namespace, spec.name),
            timeout=self._bounds,
        )
        recorded = row[0] if row else None
        if recorded is None or int(recorded) == spec.limit:
            return None
        if await self._slots_held_by_others(spec, conn, int(recorded)):
            return int(recorded)
        return None

    async def _slots_held_by_others(self, spec: LockSpec, conn: Conn, limit: int) -> bool:
        """Whether another session holds one of the slots of a semaphore of ``limit``."""
        ns, family = spec.namespace, _family(spec.kind)
        keys = [advisory_key(ns, family, spec.name, i) for i in range(limit)]
        row = await conn.fetchrow(_HELD_BY_OTHERS, keys, timeout=self._bounds)
        return bool(row and row[0])

    async def _wait_once(self, spec: LockSpec, acq: _Acquisition, slice_: float) -> None:
        """One ``pg_advisory_lock`` under ``lock_timeout``; on success the session holds it."""
        if acq.conn is not None and acq.conn.closed:
            self._discard(acq.conn)
            acq.conn = None
        if acq.conn is None:
            try:
                acq.conn = await self._checkout()
            except BaseException as exc:
                self._raise_translated(exc, f"wait for {spec.name!r}")
        conn = acq.conn
        keys = self._keys(spec)
        slot = (acq.start_slot + acq.waits) % len(keys)
        acq.waits += 1
        held = self._held(spec, slot)
        # A lock's wait is its fencing statement (a semaphore slot's is a plain script). A
        # lease granted at the end of a slice then starts with at least 2/3 of its ttl.
        fenced = acq.ttl if spec.kind is not Kind.SEMAPHORE else None
        if fenced is not None:
            slice_ = min(slice_, fenced / 3)
        ms = max(1, min(math.ceil(slice_ * 1000), _MAX_TIMEOUT_MS))
        sent = asyncio.get_running_loop().time()
        try:
            if fenced is not None:
                row = await conn.fetchrow(
                    self._fenced_wait_sql(held.shared),
                    *self._fenced_wait_args(spec, acq.owner, fenced, held, ms),
                    timeout=slice_ + self._query_timeout,
                )
            else:
                # One implicit transaction: if the wait times out, the SET is rolled back.
                lock = "pg_advisory_lock_shared" if held.shared else "pg_advisory_lock"
                await conn.script(
                    f"SET lock_timeout = {ms}; SELECT {lock}({held.key}); SET lock_timeout = 0",
                    timeout=slice_ + self._query_timeout,
                )
                row = None
        except BaseException as exc:
            if sqlstate(exc) == LOCK_TIMEOUT:
                return  # the slice ran out on the server; the caller re-checks
            acq.conn = None
            self._give_up(conn)
            self._raise_translated(exc, f"wait for {spec.name!r}")
        acq.held = held  # so that leaving without a claim releases it
        if row and row[1] is not None:
            # Granted and fenced: the next attempt claims it with its token, the lease timed
            # from this statement's start (the server's idle clock starts when it ends). No
            # token: the next attempt's claim reports the collision.
            acq.claim = Grant(int(row[1]), sent)

    @staticmethod
    def _fenced_wait_args(
        spec: LockSpec, owner: str, ttl: float, held: _Held, ms: int
    ) -> list[Any]:
        return [
            fence_key(spec.namespace, spec.name),
            spec.namespace,
            spec.name,
            None,
            str(_session_timeout_ms(ttl)),
            _APPLICATION + owner,
            held.key,
            str(ms),
        ]

    def _fenced_wait_sql(self, shared: bool) -> str:
        shape = ("wait", shared)
        sql = self._sql.get(shape)
        if sql is None:
            bump = _BUMP.format(table=self._table, clock=_CLOCK_US, source="FROM disarmed")
            lock = "pg_advisory_lock_shared" if shared else "pg_advisory_lock"
            sql = self._sql[shape] = _FENCED_WAIT.format(lock=lock, bump=bump)
        return sql

    async def _release_on(self, conn: Conn, held: _Held) -> bool:
        """Unlock on ``conn`` (and anything stacked by mistake); keep the connection."""
        try:
            row = await conn.fetchrow(
                held.release_sql, held.key, timeout=self._bounds
            )
        except BaseException as exc:
            self._give_up(conn)
            if isinstance(exc, DRIVER_ERRORS):
                return False
            raise
        self._checkin(conn)
        return bool(row and row[0] is True)

    async def _retire(self, acq: _Acquisition) -> None:
        """A waiter leaves without a grant: free what its session holds, keep nothing."""
        conn, held = acq.conn, acq.held
        acq.conn = acq.held = acq.claim = None
        if conn is None:
            return
        if held is None:
            self._checkin(conn)
            return
        with contextlib.suppress(*DRIVER_ERRORS):
            await self._release_on(conn, held)

    def _held_here(self, spec: LockSpec) -> bool:
        """Whether another acquisition of this client holds the mutex ``spec`` (its session
        has it: the server would refuse this attempt too). See :class:`LocalHolders`."""
        if spec.kind is not Kind.MUTEX or not self._holders:
            return False
        (key,) = self._keys(spec)

        def alive(holder: _Acquisition) -> bool:
            conn, held = holder.conn, holder.held
            live = conn is not None and not conn.closed
            return live and not holder.lost and held is not None and held.key == key

        return self._holders.held(key, alive=alive)

    def _unhold(self, acq: _Acquisition) -> None:
        if acq.held is not None:
            self._holders.unhold(acq.held.key, acq)

    def _lose(self, acq: _Acquisition) -> None:
        self._unhold(acq)
        acq.lost = True
        if acq.event is not None:
            acq.event.set()
        if acq.conn is not None and acq.conn.closed:
            self._discard(acq.conn)
            acq.conn = None

    def _scrap(self, acq: _Acquisition, *, close: bool = False) -> None:
        """Take the acquisition's connection away: closed, or cleaned before reuse."""
        self._unhold(acq)
        conn, acq.conn, acq.held, acq.claim = acq.conn, None, None, None
        if conn is None:
            return
        conn.lease_event = None
        if close:
            self._discard(conn)
        else:
            self._give_up(conn)

    # ------------------------------------------------------------------ connections

    async def _create_fence_table(self, conn: Conn) -> None:
        timeout = self._bounds
        for ddl in (_FENCE_DDL, _FENCE_INDEX, _FENCE_COMMENT):
            try:
                await conn.script(ddl.format(table=self._table), timeout=timeout)
            except DRIVER_ERRORS as exc:
                if sqlstate(exc) not in _DUPLICATE:
                    raise  # another client creating it at the same moment is fine

    async def _checkout(self) -> Conn:
        """A connection that holds no lock: a recent idle one, or a new one.

        At ``max_connections``, waits (up to ``connect_timeout``) for one to come back idle or
        to close.
        """
        deadline: float | None = None
        while True:
            conn = await self._take_idle()
            if conn is not None:
                return conn
            if len(self._conns) + self._opening < self._max_connections:
                break
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self._connect_timeout
            await self._wait_for_room(deadline)
        self._opening += 1
        try:
            conn = await Conn.open(self._settings)
        except BaseException:
            self._wake_room()
            raise
        finally:
            self._opening -= 1
        self._conns.add(conn)
        return conn

    async def _take_idle(self) -> Conn | None:
        loop = asyncio.get_running_loop()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: warm
            if conn.closed:
                self._discard(conn)
                continue
            if loop.time() - conn.idle_since > _PING_AFTER_IDLE:
                try:
                    await conn.fetchrow("SELECT 1", timeout=self._bounds)
                except DRIVER_ERRORS:
                    self._discard(conn)
                    continue
                except BaseException:
                    self._give_up(conn)
                    raise
            return conn
        return None

    def _checkin(self, conn: Conn) -> None:
        """Keep a lock-free connection for reuse (or close it if there is no room)."""
        if conn.doubtful:
            self._give_up(conn)
            return
        if self._state != "open" or conn.closed or self._max_idle == 0:
            self._discard(conn)
            return
        conn.lease_event = None
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.append(conn)
        while len(self._idle) > self._max_idle:
            self._discard(self._idle.popleft())
        self._wake_room()

    def _discard(self, conn: Conn) -> None:
        """Close ``conn`` for good: the server ends the session, freeing what it held."""
        self._conns.discard(conn)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)
        conn.close()
        self._wake_room()

    def _give_up(self, conn: Conn) -> None:
        """A connection in doubt (an abandoned reply): the janitor cleans it, or closes it."""
        if conn.closed or not conn.doubtful or self._state != "open" or self._tg is None:
            self._discard(conn)
            return
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)
        self._dirty.append(conn)
        self._start_janitor()

    async def _wait_for_room(self, deadline: float) -> None:
        """Wait until a connection is checked in or closed (one wakeup per event)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room.append(future)
        try:
            async with asyncio.timeout_at(deadline):
                await future
        except TimeoutError:
            raise BackendError(
                f"{self._where}: all max_connections={self._max_connections} connections "
                f"stayed busy for {self._connect_timeout:g} s"
            ) from None
        except BaseException:
            if future.done() and not future.cancelled():
                self._wake_room()  # pass the wakeup we were given on
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._room.remove(future)
        self._require_open()

    def _wake_room(self) -> None:
        while self._room:
            future = self._room.popleft()
            if not future.done():
                future.set_result(None)
                return

    # ------------------------------------------------------------------ the janitor

    def _maybe_sweep(self) -> None:
        """Have the janitor delete idle fencing rows, at most once per sweep interval."""
        if self._fence_ttl == 0:
            return
        now = asyncio.get_running_loop().time()
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(self._fence_ttl, _MAX_SWEEP_INTERVAL)
        self._sweep_due = True
        self._start_janitor()

    def _start_janitor(self) -> None:
        if self._state != "open" or self._tg is None:
            return
        if self._janitor is None or self._janitor.done():
            self._janitor = self._tg.create_task(self._work(), name="aiodlock-postgres-janitor")

    async def _work(self) -> None:
        # A child of our TaskGroup must never fail: that would cancel the task that opened us.
        while self._state == "open" and (self._dirty or self._sweep_due):
            if self._dirty:
                conn = self._dirty.popleft()
                await self._clean(conn)
                continue
            self._sweep_due = False
            try:
                await self._sweep()
            except Exception as exc:
                logger.debug("fencing-row sweep failed on %s: %s", self._where, exc)

    async def _clean(self, conn: Conn) -> None:
        """Drop whatever a session in doubt holds, then reuse it (or close it)."""
        if conn.closed or conn not in self._conns:
            self._discard(conn)
            return
        try:
            await conn.script(_CLEAN, timeout=self._bounds)
            # Abandoned inside a transaction (a semaphore's limit check): closing is simpler
            # than knowing what the transaction did.
            if conn.in_transaction:
                raise RuntimeError("left inside a transaction")
        except Exception as exc:
            logger.debug("janitor closes a connection to %s: %s", self._where, exc)
            self._discard(conn)
            return
        conn.doubtful = False
        self._checkin(conn)

    async def _sweep(self) -> None:
        """Delete fencing rows idle for ``fence_ttl``, a batch at a time (short statements
        that skip rows a grant is bumping), until a batch comes back short."""
        conn = await self._checkout()
        sql = _SWEEP.format(table=self._table, batch=_SWEEP_BATCH)
        try:
            for _ in range(_SWEEP_BATCHES):
                row = await conn.fetchrow(sql, self._fence_ttl, timeout=self._bounds)
                if not row or int(row[0]) < _SWEEP_BATCH:
                    break
        finally:
            self._checkin(conn)

    # ------------------------------------------------------------------ helpers

    def _require_open(self) -> None:
        if self._state != "open":
            raise BackendError(f"the postgres backend for {self._where} is {self._state}")

    def _raise_translated(self, exc: BaseException, action: str) -> NoReturn:
        """Re-raise ``exc``; a driver exception becomes a chained :class:`BackendError`."""
        if isinstance(exc, DRIVER_ERRORS):
            detail = str(exc)
            if self._password:
                detail = detail.replace(self._password, "***")
            raise BackendError(
                f"postgres {action} failed on {self._where}: {type(exc).__name__}: {detail}"
            ) from exc
        raise exc


def _owner_of(pid: int, application: str | None) -> str:
    """The owner a session holds a lock for (its ``application_name``), else its pid."""
    if application and application.startswith(_APPLICATION):
        return application.removeprefix(_APPLICATION)
    return f"pid {pid}"


def _ident(spec: LockSpec, owner: str) -> tuple[str, str, str, str]:
    return (spec.namespace, _family(spec.kind), spec.name, owner)
