"""The MySQL/MariaDB backend: ``mysql://user:password@host:port/database`` on aiomysql.

Locks are the server's user-level locks (``GET_LOCK``), each held by a **dedicated
connection**: the lock lives exactly as long as that session, so a crashed process, a killed
session or a dropped connection frees it at once, and nothing outlives its holder.

**Connection lease.** A grant pins its connection until the release; a pinned connection is
never lent to anything else (aiomysql's pool would hand a borrower a session that still holds
a lock — we keep our own small idle list instead, which only ever contains sessions that hold
nothing). Before the grant is reported, the session's ``wait_timeout`` is set to ``ceil(ttl)``
seconds, so a holder that stops talking (a stopped process, a stalled event loop, a network
partition) is disconnected — and its lock freed — by the server itself about ``ttl`` after its
last keep-alive; the client's own pessimistic deadline passes first. The keep-alive every
ttl/3 is ``SELECT IS_USED_LOCK(name) = CONNECTION_ID()`` on the pinned connection, and the
socket is watched: the moment the server closes it (``KILL CONNECTION``, ``wait_timeout``,
restart), the lease's loss signal is set and the guarded body is cancelled. Nothing ever
reconnects behind the lock's back (``ping(reconnect=False)``).

**Waiting on the server.** A refused acquisition waits in ``GET_LOCK(name, slice)`` on its own
connection, in slices of at most ``wait_slice`` seconds (default 1) and never beyond the
caller's ``timeout``: the server wakes it the moment the lock is free; nothing sleeps on the
client. When ``GET_LOCK`` succeeds inside a wait, that connection *is* the holder: the
following attempt of the same acquisition claims it instead of releasing and racing for it
again. A mutex's wait is the fencing statement itself, with ``GET_LOCK(name, slice)`` as its
condition (below), so a lock granted inside a wait arrives with its token: a contended handover
costs the release and that one reply, not a second round trip for the token. A waiter
cancelled mid-query has its connection closed by aiomysql, and a background janitor
``KILL``\\s that session so the server stops waiting for it at once (otherwise MariaDB notices
the disconnect within about a second); a waiter that leaves while holding an unclaimed grant
releases it first. No orphan lock survives a cancellation at any await point.

**Names** (see :mod:`._mysql_names`): ``namespace:family:name`` verbatim when it is at most 64
lowercase-safe characters, otherwise a readable prefix plus 200 bits of SHA-256 — every name
fits MySQL's 64-character limit and no server's case folding can merge two locks.

**Fencing.** The acquiring connection (autocommit) bumps a row ``INSERT INTO aiodlock_fence
... (key, name, LAST_INSERT_ID(<server clock in µs>)) ON DUPLICATE KEY UPDATE token =
LAST_INSERT_ID(token + 1)`` and takes the token from the reply's insert id: one atomic,
durable bump per grant, in the lock's holder's session. A mutex's first attempt sends the
``GET_LOCK(name, 0)`` as the condition of that same statement (``INSERT ... SELECT ... FROM
DUAL WHERE GET_LOCK(name, 0) = 1``), so taking a free lock with its token is one round trip;
its waits send the same statement with the slice as ``GET_LOCK``'s timeout (while one waits,
it holds a shared metadata lock on the table: ordinary statements pass, an ``ALTER TABLE``
waits for the slice to end). A semaphore slot is bumped by a second statement. The
table (``fence_table`` option) is created on first use. A row unused for ``fence_ttl`` seconds
(default 7 days) is deleted by a sweep each client runs at most once an hour, so the table
does not grow with every name ever locked (a grant refreshes the row's ``touched`` time only once
it is ``fence_ttl / 4``, at most an hour, old: moving the row in the sweep's index on every grant
would cost more than the rest of the statement); as a new row starts from the server's clock, the
next token is still larger than any the deleted row gave out.

**Semaphore** of limit N: N named slots ``name#0`` ... ``name#N-1``. One statement tries them
in order and stops at the first one it gets (``CASE WHEN GET_LOCK(slot0, 0) = 1 THEN 0 WHEN
...``); a waiter waits on one slot per slice, starting from one chosen by its owner id and
moving on each slice, so it is woken at once when *that* slot frees and re-tries all of them
at least every ``wait_slice``. The fencing row records the limit its holders use
(``sem_limit``); a slot taken with another limit while they hold is given back and
:class:`~aiodlock.LimitMismatchError` raised (see :meth:`MySQLBackend._claim_limit`).
Reader/writer and fair locks are not offered (``GET_LOCK`` has no shared mode and no
documented FIFO order): they raise ``UnsupportedError`` when built.

**Failures.** Every aiomysql exception is translated to :class:`~aiodlock.BackendError`,
chained. A keep-alive that fails because the connection is gone reports the lease lost (the
lock went with the session), it is not retried.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fnmatch
import functools
import logging
import math
import re
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Final, NoReturn

from .._exceptions import BackendError, LimitMismatchError, UnsupportedError
from .._validate import check_seconds
from ._deadlines import Deadlines, Limit
from ._local_holders import LocalHolders
from ._mysql_conn import DRIVER_ERRORS, Conn, ConnectSettings, error_code
from ._mysql_names import check_table_name, fence_key, lock_name
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
from ._tls import TLS_OPTIONS, tls_context

if TYPE_CHECKING:
    from .._url import ParsedURL

__all__ = ["MySQLBackend"]

logger = logging.getLogger("aiodlock.mysql")

_DEFAULT_PORT: Final = 3306
_DEFAULT_CONNECT_TIMEOUT: Final = 10.0
_DEFAULT_QUERY_TIMEOUT: Final = 10.0
_DEFAULT_WAIT_SLICE: Final = 1.0
_DEFAULT_MAX_CONNECTIONS: Final = 100
_DEFAULT_MAX_IDLE: Final = 8
_DEFAULT_FENCE_TABLE: Final = "aiodlock_fence"
_DEFAULT_FENCE_TTL: Final = 7 * 24 * 3600.0
_SWEEP_EVERY: Final = 3600.0
"""Seconds between two sweeps of idle fencing rows by one client (capped at ``fence_ttl``)."""
_SWEEP_BATCH: Final = 1000
_SWEEP_BATCHES: Final = 10  # per sweep: a huge backlog is worked off over several sweeps
MAX_SEMAPHORE_LIMIT: Final = 256
"""One named lock per permit, all tried in one statement: keep N reasonable."""
_PING_AFTER_IDLE: Final = 2.0
"""Seconds idle after which a pooled connection is pinged (``reconnect=False``) before use."""
_MAX_WAIT_TIMEOUT: Final = 31_536_000  # the server's upper bound for wait_timeout
_ER_NO_SUCH_TABLE: Final = 1146
_ER_BAD_FIELD: Final = 1054  # a fence table made before sem_limit existed
_ER_DUP_FIELDNAME: Final = 1060  # another client added the column first
_ER_NO_SUCH_THREAD: Final = 1094

_FENCE_DDL: Final = """CREATE TABLE IF NOT EXISTS {table} (
    lock_key BINARY(32) NOT NULL PRIMARY KEY COMMENT 'sha256(namespace NUL name)',
    lock_name VARCHAR(64) CHARACTER SET ascii NOT NULL COMMENT 'readable, for operators',
    token BIGINT UNSIGNED NOT NULL COMMENT 'last fencing token handed out',
    {limit_column},
    {touched_column},
    {who_columns}
) ENGINE=InnoDB COMMENT='aiodlock fencing tokens: one row per lock name used lately'"""
_LIMIT_COLUMN: Final = (
    "sem_limit SMALLINT UNSIGNED NULL COMMENT 'the limit of the semaphore holders, if any'"
)
_TOUCHED_COLUMN: Final = (
    "touched DATETIME(6) NOT NULL DEFAULT '1970-01-01' COMMENT 'last grant (UTC)', "
    "ADD INDEX idle (touched)"
)
# For operators (inspect names the locks of a namespace, and the owner of the newest grant).
_WHO_COLUMNS: Final = (
    "namespace VARBINARY(1024) NULL COMMENT 'the namespace (UTF-8), for operators', "
    "ADD COLUMN name VARBINARY(1024) NULL COMMENT 'the lock name (UTF-8), for operators', "
    "ADD COLUMN holder VARBINARY(64) NULL COMMENT 'owner id of the newest grant', "
    "ADD COLUMN holder_connection BIGINT UNSIGNED NULL COMMENT 'CONNECTION_ID() of it', "
    "ADD INDEX by_namespace (namespace(64))"
)
_WHO_INSERT: Final = "X'{ns}', X'{name}', X'{owner}', CONNECTION_ID()"
_WHO_UPDATE: Final = (
    "namespace = X'{ns}', name = X'{name}', holder = X'{owner}', "
    "holder_connection = CONNECTION_ID()"
)
# A new row starts from the server's clock in microseconds, not 1: then a name whose row was
# swept (or lost) still gets tokens above every earlier one. UNIX_TIMESTAMP() reads the epoch
# itself (UNIX_TIMESTAMP(NOW(6)) goes through the session's time zone and can step back an
# hour when daylight saving time ends); the microseconds of NOW(6), the same instant (the
# statement's start), do not depend on the time zone.
_SEED: Final = "UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))"
# A grant refreshes ``touched`` only once it is older than the client's refresh interval
# (a fraction of fence_ttl, at most an hour): moving the row in the ``idle`` index on every grant
# would cost more than the rest of the statement.
_RETOUCH: Final = (
    "touched = IF(touched < UTC_TIMESTAMP(6) - INTERVAL {refresh} SECOND, "
    "UTC_TIMESTAMP(6), touched)"
)
_FENCE_BUMP: Final = (
    "INSERT INTO {table} (lock_key, lock_name, token, touched, namespace, name, holder, "
    "holder_connection) VALUES (X'{key}', '{label}', "
    f"LAST_INSERT_ID({_SEED}), UTC_TIMESTAMP(6), {_WHO_INSERT}) ON DUPLICATE KEY UPDATE "
    f"token = LAST_INSERT_ID(token + 1), {_RETOUCH}, {_WHO_UPDATE}"
)
# A mutex is taken and fenced in one round trip: the row is written only if GET_LOCK says 1
# (one row FROM DUAL: the condition runs once), so no row changed means busy (or, for a wait,
# not granted within the slice).
_TAKE_AND_BUMP: Final = (
    "INSERT INTO {table} (lock_key, lock_name, token, touched, namespace, name, holder, "
    "holder_connection) SELECT X'{key}', '{label}', "
    f"LAST_INSERT_ID({_SEED}), UTC_TIMESTAMP(6), {_WHO_INSERT} FROM DUAL "
    "WHERE GET_LOCK('{target}', {wait}) = 1 ON DUPLICATE KEY UPDATE "
    f"token = LAST_INSERT_ID(token + 1), {_RETOUCH}, {_WHO_UPDATE}"
)
# A semaphore's bump also records its limit on first use (a row without one).
_SEM_FENCE_BUMP: Final = (
    "INSERT INTO {table} (lock_key, lock_name, token, touched, sem_limit, namespace, name, "
    "holder, holder_connection) VALUES (X'{key}', "
    f"'{{label}}', LAST_INSERT_ID({_SEED}), UTC_TIMESTAMP(6), {{limit}}, {_WHO_INSERT}) "
    f"ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), {_RETOUCH}, "
    f"sem_limit = IFNULL(sem_limit, {{limit}}), {_WHO_UPDATE}"
)
# inspect: the statements of the sessions waiting in GET_LOCK (a wait has a timeout > 0).
_WAITS: Final = (
    "SELECT INFO FROM information_schema.PROCESSLIST "
    "WHERE ID <> CONNECTION_ID() AND INFO LIKE '%GET\\_LOCK(%'"
)
_WAIT_CALL: Final = re.compile(r"GET_LOCK\('([^']*)', ([0-9.]+)\)")
# break: the fencing row moves on, as a grant would.
_FENCE_MOVE: Final = "UPDATE {table} SET token = token + 1 WHERE lock_key = X'{key}'"
_SWEEP: Final = (
    "DELETE FROM {table} WHERE touched < UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND "
    f"LIMIT {_SWEEP_BATCH}"
)


def _family(kind: Kind) -> str:
    if kind is Kind.MUTEX:
        return "m"
    if kind is Kind.SEMAPHORE:
        return "s"
    return "rw"  # not served (check() refuses it); kept distinct all the same


def _wait_timeout(ttl: float) -> int:
    """The holder session's ``wait_timeout``: never shorter than the lease."""
    return max(1, min(math.ceil(ttl), _MAX_WAIT_TIMEOUT))


def _check_int(value: object, *, argument: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{argument} must be >= {minimum}, not {value}")
    return value


class _Acquisition:
    """One acquisition (one owner): its connection, and what that session holds."""

    __slots__ = (
        "claim", "conn", "event", "granted", "held", "lost", "owner", "start_slot",
        "ttl", "waits",
    )

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.conn: Conn | None = None
        self.held: str | None = None
        """The user-lock name the session holds (a semaphore's slot), or None."""
        self.granted = False
        """Reported to the core as a Grant (with a fencing token)."""
        self.lost = False
        """The lock is known gone (keep-alive refused, connection dropped)."""
        self.claim: Grant | None = None
        """A grant made inside a wait, token included, for the next attempt to report."""
        self.ttl: float | None = None
        """The lease asked for by the acquisition's attempts (its waits fence with it)."""
        self.event: asyncio.Event | None = None
        self.start_slot = zlib.crc32(owner.encode())
        self.waits = 0


class _MySQLWaiter:
    """Waits on the server: ``GET_LOCK(name, slice)`` on the acquisition's own connection."""

    __slots__ = ("_acq", "_backend", "_spec")

    def __init__(self, backend: MySQLBackend, spec: LockSpec, acq: _Acquisition) -> None:
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


class MySQLBackend:
    """Locks on one MySQL or MariaDB server (see the module docstring for the design).

    URL: ``mysql://user:password@host:port/database`` (port 3306 by default; the database
    holds the fencing table). Options (URL query or keyword):

    - ``connect_timeout`` (seconds, default 10): TCP connect, handshake and authentication;
    - ``query_timeout`` (seconds, default 10): any one statement, beyond a wait's own slice;
    - ``wait_slice`` (seconds, default 1): the longest single server-side ``GET_LOCK`` wait;
    - ``max_connections`` (default 100): connections this client may open (every held lock and
      every waiting acquisition uses one); at the limit, a new one waits for a free one up to
      ``connect_timeout``, then fails with ``BackendError``;
    - ``max_idle`` (default 8): lock-free connections kept for reuse;
    - ``fence_table`` (default ``aiodlock_fence``): the fencing-token table;
    - ``fence_ttl`` (seconds, default 7 days): a name's fencing row is deleted once unused for
      this long (0 keeps rows forever);
    - ``unix_socket``: connect through this socket path instead of TCP;
    - ``ssl`` (TLS with the system's CAs), ``ssl_ca`` (trust this CA bundle instead),
      ``ssl_cert`` / ``ssl_key`` (a client certificate), ``ssl_check_hostname`` (default true):
      TLS, refused with ``BackendError`` if the server does not offer it.

    Example::

        async with aiodlock.connect("mysql://app:secret@db:3306/shop") as locks:
            async with locks.lock("order:42", ttl=10) as lease:
                print(lease.fencing_token)
    """

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
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
    queues_on_busy: ClassVar[bool] = False
    """A refused ``GET_LOCK(name, 0)`` leaves nothing queued on the server."""
    options: ClassVar[Mapping[str, type]] = {
        "connect_timeout": float,
        "query_timeout": float,
        "wait_slice": float,
        "max_connections": int,
        "max_idle": int,
        "fence_table": str,
        "fence_ttl": float,
        "unix_socket": str,
        **TLS_OPTIONS,
    }

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        if len(url.hosts) > 1:
            raise ValueError(f"mysql:// takes one host, got {len(url.hosts)}")
        host, port = url.hosts[0] if url.hosts else ("localhost", None)
        database = url.path.strip("/")
        if not database:
            raise ValueError(
                "mysql:// url needs a database for the fencing table: "
                "mysql://user:password@host:3306/database"
            )
        unix_socket = options.get("unix_socket")
        if unix_socket is not None and (not isinstance(unix_socket, str) or not unix_socket):
            raise TypeError("unix_socket must be a non-empty str (a socket path)")

        def seconds(name: str, default: float) -> float:
            value = options.get(name)
            if value is None:
                return default
            checked = check_seconds(value, argument=name, allow_none=False)
            assert checked is not None
            return checked

        self._connect_timeout = seconds("connect_timeout", _DEFAULT_CONNECT_TIMEOUT)
        self._query_timeout = seconds("query_timeout", _DEFAULT_QUERY_TIMEOUT)
        self._bounds = Deadlines(self._query_timeout)  # the usual statements' limit
        self._wait_slice = seconds("wait_slice", _DEFAULT_WAIT_SLICE)
        self._max_connections = _check_int(
            options.get("max_connections", _DEFAULT_MAX_CONNECTIONS),
            argument="max_connections",
            minimum=1,
        )
        self._max_idle = _check_int(
            options.get("max_idle", _DEFAULT_MAX_IDLE), argument="max_idle", minimum=0
        )
        self._table = check_table_name(options.get("fence_table", _DEFAULT_FENCE_TABLE))
        fence_ttl = check_seconds(
            options.get("fence_ttl", _DEFAULT_FENCE_TTL),
            argument="option fence_ttl",
            allow_none=False,
            allow_zero=True,
        )
        assert fence_ttl is not None
        self._fence_ttl = math.ceil(fence_ttl)
        # A row in use is re-touched at least this often (seconds), well inside fence_ttl.
        self._touch_every = max(1, min(int(_SWEEP_EVERY), self._fence_ttl // 4))
        self._next_sweep = 0.0  # loop time; the first grant sweeps
        self._sweeper: asyncio.Task[None] | None = None
        self._settings = ConnectSettings(
            host=host or "localhost",
            port=port or _DEFAULT_PORT,
            user=url.username,
            password=url.password,
            database=database,
            unix_socket=unix_socket,
            connect_timeout=self._connect_timeout,
            tls=tls_context(options, scheme=url.scheme),
        )
        self._password = url.password
        self._where = url.redacted()
        self._state = "new"
        self._tg: asyncio.TaskGroup | None = None
        self._janitor: asyncio.Task[None] | None = None
        self._doomed: collections.deque[int] = collections.deque()
        self._conns: set[Conn] = set()
        self._idle: collections.deque[Conn] = collections.deque()
        self._opening = 0
        self._room: collections.deque[asyncio.Future[None]] = collections.deque()
        self._acqs: dict[tuple[str, str, str, str], _Acquisition] = {}
        self._holders: LocalHolders[str, _Acquisition] = LocalHolders()
        self._waiting = 0
        self._server_version = ""
        self.fractional_timeouts = True
        """MariaDB takes ``GET_LOCK(name, 0.25)``; MySQL rounds the timeout to whole seconds.
        Read from the server version at ``open()``; a test may set it to emulate the other."""

    # ------------------------------------------------------------------ lifetime

    async def open(self) -> None:
        """Connect once (bounded by ``connect_timeout``) and learn the server's flavour."""
        if self._state != "new":
            raise RuntimeError("a MySQLBackend is opened once")
        self._state = "open"
        tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._tg = tg
        try:
            conn = await self._checkout()
            version = await conn.value("SELECT VERSION()", timeout=self._bounds)
        except BaseException as exc:
            await self.aclose()
            self._raise_translated(exc, "connect")
        self._server_version = str(version)
        self.fractional_timeouts = "mariadb" in self._server_version.lower()
        self._checkin(conn)

    async def aclose(self) -> None:
        """Close every connection (the server frees what they held). Idempotent."""
        if self._state in ("closing", "closed"):
            return
        self._state = "closing"
        try:
            for task in (self._janitor, self._sweeper):
                if task is not None:
                    task.cancel()
            tg, self._tg = self._tg, None
            if tg is not None:
                await tg.__aexit__(None, None, None)
        finally:
            self._bounds.close()
            for conn in list(self._conns):
                self._discard(conn)
            self._idle.clear()
            self._acqs.clear()
            self._holders.clear()
            self._doomed.clear()
            for future in self._room:
                if not future.done():
                    future.set_result(None)
            self._state = "closed"

    def check(self, spec: LockSpec) -> None:
        """Semaphores are N named locks: refuse an unreasonable N when the lock is built."""
        if spec.kind is Kind.SEMAPHORE and spec.limit > MAX_SEMAPHORE_LIMIT:
            raise UnsupportedError(
                f"{self._where} serves semaphores with limit <= {MAX_SEMAPHORE_LIMIT} "
                f"(one named lock per permit), not {spec.limit}"
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
        """``GET_LOCK(name, 0)`` with the fencing bump in the same statement (a semaphore:
        all slots, then the bump)."""
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
        try:
            if acq.held is None:
                if acq.conn is not None and acq.conn.closed:
                    self._discard(acq.conn)  # the waiter's session ended (server restart...)
                    acq.conn = None
                if acq.conn is None:
                    acq.conn = await self._checkout()
                if spec.kind is not Kind.SEMAPHORE:
                    target = lock_name(spec.namespace, _family(spec.kind), spec.name)
                    token = await self._take_and_bump(spec, target, acq.conn, ttl, owner)
                    if token is not None:
                        acq.held = target
                        return self._granted(acq, token, spec=spec)
                else:
                    acq.held = await self._get_now(spec, acq.conn)
                if acq.held is None:
                    # Every slot of ours is taken: by holders of another limit? Then say so
                    # now, instead of waiting for a slot (with a lower limit, forever).
                    in_use = await self._limit_in_use(spec, acq.conn)
                    if not waiting:
                        del self._acqs[ident]
                        self._checkin(acq.conn)
                        acq.conn = None
                    if in_use is not None:
                        raise LimitMismatchError(spec.name, in_use, spec.limit)
                    return Busy(None)
            # The session holds the lock now (just taken, or granted inside a wait).
            assert acq.conn is not None
            if acq.claim is not None:  # granted and fenced by the wait's own statement
                claim, acq.claim = acq.claim, None
                return self._granted(acq, claim.fencing_token, claim.sent, spec=spec)
            token = await self._bump_fence(spec, acq.conn, ttl, owner)
            in_use = None
            if spec.kind is Kind.SEMAPHORE:
                in_use = await self._claim_limit(spec, acq.conn)
        except LimitMismatchError:
            raise  # refused holding nothing; a waiter's connection goes back with its waiter
        except BaseException as exc:
            # Outcome unknown (cancelled, connection lost): close the session, which frees
            # anything it held, so no orphan lock remains whatever happened on the server.
            self._scrap(acq)
            if not waiting:
                self._acqs.pop(ident, None)
            self._raise_translated(exc, f"acquire of {spec.name!r}")
        if in_use is not None:
            # Give the slot back at once (a waiter's acquisition is left to its waiter).
            if not waiting:
                del self._acqs[ident]
            await self._retire(acq)
            raise LimitMismatchError(spec.name, in_use, spec.limit)
        return self._granted(acq, token, spec=spec)

    def _granted(
        self, acq: _Acquisition, token: int, sent: float | None = None, *, spec: LockSpec
    ) -> Grant:
        """The acquisition's session holds the lock and has its token: watch for its loss."""
        assert acq.conn is not None
        acq.granted = True
        if spec.kind is Kind.MUTEX and acq.held is not None:
            self._holders.hold(acq.held, acq)
        acq.event = acq.conn.lease_event = LossSignal()
        if acq.conn.peer_closed:  # the server hung up right after the fencing bump
            acq.event.set()
        return Grant(token, sent)

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """``RELEASE_LOCK`` on the holding connection, which then rejoins the idle list."""
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
                return False  # the session ended, and the lock with it
            if acq.held is None:
                self._checkin(conn)
                return False
            return await self._release_on(conn, acq.held)

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """``IS_USED_LOCK(name) = CONNECTION_ID()`` on the holding connection.

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
            self._tg.create_task(confirm, name="aiodlock-mysql-keepalive")
        )

    async def _confirm(self, acq: _Acquisition, conn: Conn, ttl: float) -> bool:
        """The keep-alive's statements; a failure loses the lease (its session is closed)."""
        async with conn.io:
            try:
                held = acq.held
                if acq.conn is not conn or held is None:
                    return False  # released while we waited for the connection
                ours = await conn.value(
                    f"SELECT IS_USED_LOCK('{held}') = CONNECTION_ID()",
                    timeout=self._bounds,
                )
                wanted = _wait_timeout(ttl)
                if ours == 1 and conn.wait_timeout != wanted:
                    await conn.query(
                        f"SET SESSION wait_timeout = {wanted}", timeout=self._bounds
                    )
                    conn.wait_timeout = wanted
            except DRIVER_ERRORS:  # TimeoutError among them
                # The connection is closed (by the server, or by us on a timeout), and the
                # lock went with the session.
                self._lose(acq)
                return False
            except asyncio.CancelledError:
                self._lose(acq)  # the client is closing: the closed session frees the lock
                raise
        if ours != 1:
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
        """None: the holding connection's ``wait_timeout`` is ``ceil(ttl)``, so the server
        keeps a silent holder's session at least ``ttl`` after its last keep-alive, and the
        ttl-based validity (last confirmed keep-alive + ttl - drift) already passes first."""
        return None

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        """Reserve the acquisition's connection; waits run ``GET_LOCK`` on it."""
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
            yield _MySQLWaiter(self, spec, acq)
        finally:
            self._waiting -= 1
            if not acq.granted:
                if self._acqs.get(ident) is acq:
                    del self._acqs[ident]
                await self._retire(acq)

    # ------------------------------------------------------------------ lock steps

    async def _get_now(self, spec: LockSpec, conn: Conn) -> str | None:
        """Try to take the lock (a free slot) without waiting; the name taken, or None."""
        ns, family, name = spec.namespace, _family(spec.kind), spec.name
        if spec.kind is not Kind.SEMAPHORE:
            target = lock_name(ns, family, name)
            got = await conn.value(f"SELECT GET_LOCK('{target}', 0)", timeout=self._bounds)
            return target if got == 1 else None
        # CASE stops at the first WHEN that holds: at most one slot is taken.
        slots = [lock_name(ns, family, name, i) for i in range(spec.limit)]
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
        sql = self._fence_sql(_TAKE_AND_BUMP, spec, owner, target=target, wait="0")
        changed, token = await self._fence_query(conn, sql, ttl)
        if not changed:
            return None
        if token < 1:
            raise BackendError(f"{self._where}: the fencing bump returned no token")
        return token

    async def _bump_fence(self, spec: LockSpec, conn: Conn, ttl: float, owner: str) -> int:
        """Next fencing token, on the connection that holds the lock."""
        bump = _SEM_FENCE_BUMP if spec.kind is Kind.SEMAPHORE else _FENCE_BUMP
        _, token = await self._fence_query(conn, self._fence_sql(bump, spec, owner), ttl)
        if token < 1:
            raise BackendError(f"{self._where}: the fencing bump returned no token")
        return token

    def _fence_sql(
        self, template: str, spec: LockSpec, owner: str, *, target: str = "", wait: str = ""
    ) -> str:
        made = _fence_statement(
            template,
            self._table,
            spec.namespace,
            spec.name,
            spec.limit,
            self._touch_every,
            target,
            wait,
        )
        return made.replace(_OWNER, _hex(owner))

    async def _fence_query(
        self, conn: Conn, sql: str, ttl: float, *, timeout: float | None = None
    ) -> tuple[int, int]:
        """Run a fencing statement (rows changed, insert id) on a session whose
        ``wait_timeout`` suits ``ttl``; create or upgrade the table if it needs it.

        A missing table or column fails the statement before it runs, GET_LOCK included.
        ``timeout`` bounds the statement (default: the query timeout; a wait's is longer).
        """
        bound: Limit = self._bounds if timeout is None else timeout
        wanted = _wait_timeout(ttl)
        if conn.wait_timeout != wanted:
            await conn.query(f"SET SESSION wait_timeout = {wanted}", timeout=self._bounds)
            conn.wait_timeout = wanted
        try:
            result = await conn.write(
                sql, timeout=bound, harmless=(_ER_NO_SUCH_TABLE, _ER_BAD_FIELD)
            )
        except DRIVER_ERRORS as exc:
            if error_code(exc) not in (_ER_NO_SUCH_TABLE, _ER_BAD_FIELD):
                raise
            await self._upgrade_fence_table(conn, error_code(exc))
            result = await conn.write(sql, timeout=bound)
        self._maybe_sweep()
        return result

    async def _upgrade_fence_table(self, conn: Conn, code: int | None) -> None:
        """Create the fence table, or add the columns an older aiodlock did not make."""
        if code == _ER_NO_SUCH_TABLE:
            ddl = _FENCE_DDL.format(
                table=self._table,
                limit_column=_LIMIT_COLUMN,
                touched_column=_TOUCHED_COLUMN.replace("ADD INDEX", "INDEX"),
                who_columns=_WHO_COLUMNS.replace("ADD COLUMN ", "").replace("ADD INDEX", "INDEX"),
            )
            await conn.query(ddl, timeout=self._bounds)
            return
        for column in (_LIMIT_COLUMN, _TOUCHED_COLUMN, _WHO_COLUMNS):
            alter = f"ALTER TABLE {self._table} ADD COLUMN {column}"
            with contextlib.suppress(*DRIVER_ERRORS):  # it is there (made by another client)
                await conn.query(alter, timeout=self._bounds, harmless=(_ER_DUP_FIELDNAME,))

    def _maybe_sweep(self) -> None:
        """Start a sweep of idle fencing rows if this client has not run one lately."""
        if self._fence_ttl == 0 or self._tg is None or self._state != "open":
            return
        now = asyncio.get_running_loop().time()
        if now < self._next_sweep or (self._sweeper is not None and not self._sweeper.done()):
            return
        self._next_sweep = now + min(_SWEEP_EVERY, self._fence_ttl)
        self._sweeper = self._tg.create_task(self._sweep(), name="aiodlock-mysql-sweep")

    async def _sweep(self) -> None:
        # Best effort, in the background (a child of our TaskGroup must never fail): a row
        # left behind is swept by the next sweep, of this client or another.
        sql = _SWEEP.format(table=self._table, seconds=self._fence_ttl)
        try:
            conn = await self._checkout()
        except Exception as exc:
            logger.debug("fence sweep could not connect to %s: %s", self._where, exc)
            return
        try:
            for _ in range(_SWEEP_BATCHES):
                if await conn.change(sql, timeout=self._bounds) < _SWEEP_BATCH:
                    break
        except Exception as exc:
            logger.debug("fence sweep failed on %s: %s", self._where, exc)
            self._discard(conn)
            return
        self._checkin(conn)

    async def _claim_limit(self, spec: LockSpec, conn: Conn) -> int | None:
        """Check the semaphore's recorded limit, on the session that just took a slot; None
        if it is ours (now), else the limit its holders use.

        The fencing bump recorded our limit if the row had none. Every holder checks after
        taking its slot, so while a holder of limit R lives, one of the slots ``#0..#R-1`` is
        taken: a different recorded limit ``R`` is stale — left by holders that are all gone,
        released or crashed — exactly when no other session holds one of those slots. That
        check and the overwrite run under the row's lock (``FOR UPDATE``), so two clients
        cannot both replace it. Accepted race: a session that has taken a slot but not checked
        yet counts as a holder of R, so right after a limit change two first acquirers may
        refuse each other (never grant too many); the next attempt succeeds.
        """
        key = fence_key(spec.namespace, spec.name).hex()
        where = f"FROM {self._table} WHERE lock_key = X'{key}'"
        timeout = self._bounds
        if await conn.value(f"SELECT sem_limit {where}", timeout=timeout) == spec.limit:
            return None
        await conn.query("START TRANSACTION", timeout=timeout)
        recorded = await conn.value(f"SELECT sem_limit {where} FOR UPDATE", timeout=timeout)
        in_use = spec.limit if recorded is None else int(recorded)
        if in_use != spec.limit and await self._slots_held_by_others(spec, conn, in_use):
            await conn.query("ROLLBACK", timeout=timeout)
            return in_use
        await conn.query(
            f"UPDATE {self._table} SET sem_limit = {spec.limit} WHERE lock_key = X'{key}'",
            timeout=timeout,
        )
        await conn.query("COMMIT", timeout=timeout)
        return None

    async def _limit_in_use(self, spec: LockSpec, conn: Conn) -> int | None:
        """For a refused semaphore attempt: the recorded limit if it differs from ours and
        holders of it are still there, else None (a plain read: it only refuses, never
        grants)."""
        if spec.kind is not Kind.SEMAPHORE:
            return None
        key = fence_key(spec.namespace, spec.name).hex()
        sql = f"SELECT sem_limit FROM {self._table} WHERE lock_key = X'{key}'"
        try:
            rows, _ = await conn.query(
                sql, timeout=self._bounds, harmless=(_ER_NO_SUCH_TABLE, _ER_BAD_FIELD)
            )
        except DRIVER_ERRORS as exc:
            if error_code(exc) not in (_ER_NO_SUCH_TABLE, _ER_BAD_FIELD):
                raise
            return None  # no holder has recorded a limit yet
        recorded = rows[0][0] if rows else None
        if recorded is None or int(recorded) == spec.limit:
            return None
        if await self._slots_held_by_others(spec, conn, int(recorded)):
            return int(recorded)
        return None

    async def _slots_held_by_others(self, spec: LockSpec, conn: Conn, limit: int) -> bool:
        """Whether another session holds one of the slots of a semaphore of ``limit``."""
        me = "CONNECTION_ID()"
        family = _family(spec.kind)
        slots = [lock_name(spec.namespace, family, spec.name, i) for i in range(limit)]
        others = " + ".join(f"(IFNULL(IS_USED_LOCK('{s}'), {me}) <> {me})" for s in slots)
        return bool(int(await conn.value(f"SELECT {others}", timeout=self._bounds)))

    async def _wait_once(self, spec: LockSpec, acq: _Acquisition, slice_: float) -> None:
        """One ``GET_LOCK(name, slice)``; on success the session holds it (acq.held)."""
        if acq.conn is not None and acq.conn.closed:
            self._discard(acq.conn)
            acq.conn = None
        if acq.conn is None:
            try:
                acq.conn = await self._checkout()
            except BaseException as exc:
                self._raise_translated(exc, f"wait for {spec.name!r}")
        conn = acq.conn
        ns, family = spec.namespace, _family(spec.kind)
        if spec.kind is Kind.SEMAPHORE:
            slot = (acq.start_slot + acq.waits) % spec.limit
            target = lock_name(ns, family, spec.name, slot)
        else:
            target = lock_name(ns, family, spec.name)
        acq.waits += 1
        if self._fenced_wait(spec, acq, slice_):
            assert acq.ttl is not None
            await self._wait_fenced(spec, acq, conn, target, min(slice_, acq.ttl / 3))
            return
        cut_short = False
        if self.fractional_timeouts:
            sql = f"SELECT GET_LOCK('{target}', {slice_:.6f})"
            bound = slice_ + self._query_timeout
        elif slice_ >= 1:
            # MySQL takes whole seconds: wait the whole part; the rest is a later slice.
            whole = int(slice_)
            sql = f"SELECT GET_LOCK('{target}', {whole})"
            bound = whole + self._query_timeout
        else:
            # Under a second on MySQL: wait one second on the server, give up locally.
            sql = f"SELECT GET_LOCK('{target}', 1)"
            bound = slice_
            cut_short = True
        try:
            got = await conn.value(sql, timeout=bound)
        except BaseException as exc:
            acq.conn = None
            self._discard(conn)
            if cut_short and isinstance(exc, TimeoutError):
                return  # the janitor ends that session on the server
            self._raise_translated(exc, f"wait for {spec.name!r}")
        if got == 1:
            acq.held = target
        elif got is None:
            acq.conn = None
            self._discard(conn)
            raise BackendError(f"{self._where}: GET_LOCK of {spec.name!r} failed (session killed?)")

    def _fenced_wait(self, spec: LockSpec, acq: _Acquisition, slice_: float) -> bool:
        """Whether this wait can be the fencing statement: a mutex whose lease is known, on a
        server that waits the slice it is given (MySQL waits whole seconds: a slice capped
        below one, see :meth:`_wait_fenced`, is left to the plain wait)."""
        if spec.kind is not Kind.MUTEX or acq.ttl is None:
            return False
        return self.fractional_timeouts or min(slice_, acq.ttl / 3) >= 1

    async def _wait_fenced(
        self, spec: LockSpec, acq: _Acquisition, conn: Conn, target: str, slice_: float
    ) -> None:
        """One wait that takes the lock and its fencing token in one statement
        (``_TAKE_AND_BUMP`` with ``GET_LOCK(target, slice)``); a grant is kept in
        ``acq.claim`` for the next attempt.

        The lease of such a grant is timed from the moment the statement was sent: the server
        starts the session's idle clock (``wait_timeout``) later, when the statement ends, so
        the client never counts on more than the server keeps. Slices of at most ttl/3 leave
        such a grant at least two thirds of its lease.
        """
        assert acq.ttl is not None
        wait = f"{slice_:.6f}" if self.fractional_timeouts else str(int(slice_))
        sql = self._fence_sql(_TAKE_AND_BUMP, spec, acq.owner, target=target, wait=wait)
        sent = asyncio.get_running_loop().time()
        try:
            changed, token = await self._fence_query(
                conn, sql, acq.ttl, timeout=slice_ + self._query_timeout
            )
        except BaseException as exc:
            acq.conn = None
            self._discard(conn)
            self._raise_translated(exc, f"wait for {spec.name!r}")
        if changed:
            acq.held = target  # so that leaving without a claim releases it
            if token < 1:
                raise BackendError(f"{self._where}: the fencing bump returned no token")
            acq.claim = Grant(token, sent)

    async def _release_on(self, conn: Conn, held: str) -> bool:
        """RELEASE_LOCK on ``conn``; keep the connection only if it now holds nothing."""
        try:
            released, others = await conn.row(
                f"SELECT RELEASE_LOCK('{held}'), RELEASE_ALL_LOCKS()",
                timeout=self._bounds,
            )
        except BaseException as exc:
            self._discard(conn)  # closing the session frees the lock anyway
            if isinstance(exc, DRIVER_ERRORS):
                return False
            raise
        if released == 1 and others == 0:
            self._checkin(conn)
        else:
            self._discard(conn)
        return bool(released == 1)

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
        target = lock_name(spec.namespace, _family(spec.kind), spec.name)

        def alive(holder: _Acquisition) -> bool:
            conn = holder.conn
            live = conn is not None and not conn.closed
            return live and not holder.lost and holder.held == target

        return self._holders.held(target, alive=alive)

    def _unhold(self, acq: _Acquisition) -> None:
        if acq.held is not None:
            self._holders.unhold(acq.held, acq)

    def _lose(self, acq: _Acquisition) -> None:
        self._unhold(acq)
        acq.lost = True
        if acq.event is not None:
            acq.event.set()
        if acq.conn is not None and acq.conn.closed:
            self._discard(acq.conn)
            acq.conn = None

    def _scrap(self, acq: _Acquisition) -> None:
        """Close the acquisition's connection: whatever its session held is freed."""
        self._unhold(acq)
        conn, acq.conn, acq.held, acq.claim = acq.conn, None, None, None
        if conn is not None:
            conn.lease_event = None
            self._discard(conn)

    # ------------------------------------------------------------------ connections

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
            conn = self._idle.pop()  # the most recently used: warm, least likely timed out
            idle_for = loop.time() - conn.idle_since
            if conn.closed or idle_for > _idle_limit(conn):
                self._discard(conn)
                continue
            if idle_for > _PING_AFTER_IDLE:
                try:
                    await conn.ping(timeout=self._query_timeout)
                except DRIVER_ERRORS:
                    self._discard(conn)
                    continue
                except BaseException:
                    self._discard(conn)
                    raise
            return conn
        return None

    def _checkin(self, conn: Conn) -> None:
        """Keep a lock-free connection for reuse (or close it if there is no room)."""
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
        """Close ``conn`` for good; a session abandoned mid-query is killed by the janitor."""
        if conn not in self._conns:
            conn.close()
            return
        self._conns.discard(conn)
        self._wake_room()
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)
        if conn.abandoned and not conn.peer_closed:
            self._doom(conn.thread_id)
        conn.close()

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

    def _doom(self, thread_id: int) -> None:
        """Have the server end a session whose reply we abandoned (a wait still running)."""
        if self._state != "open" or self._tg is None:
            return
        self._doomed.append(thread_id)
        if self._janitor is None or self._janitor.done():
            self._janitor = self._tg.create_task(self._reap(), name="aiodlock-mysql-janitor")

    async def _reap(self) -> None:
        # A child of our TaskGroup must never fail: that would cancel the task that opened us.
        while self._doomed and self._state == "open":
            try:
                conn = await self._checkout()
            except Exception as exc:
                logger.debug("janitor could not connect to %s: %s", self._where, exc)
                self._doomed.clear()
                return
            try:
                while self._doomed:
                    thread_id = self._doomed.popleft()
                    await conn.query(
                        f"KILL CONNECTION {int(thread_id)}",
                        timeout=self._bounds,
                        harmless=(_ER_NO_SUCH_THREAD,),
                    )
            except Exception as exc:
                if error_code(exc) == _ER_NO_SUCH_THREAD:
                    self._checkin(conn)
                    continue
                logger.debug("janitor failed on %s: %s", self._where, exc)
                self._discard(conn)
                self._doomed.clear()
                return
            self._checkin(conn)

    # ------------------------------------------------------------------ helpers

    # ------------------------------------------------------------------ operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern``, sorted by name.

        Names come from the fencing table (server-side lock names may be hashes), holders from
        ``IS_USED_LOCK`` of each lock name (a semaphore: of each slot), in one statement per
        batch of names. A holder is named by the owner id its grant recorded in the row when
        its session is the one that made the newest grant, else as ``connection N`` (an older
        permit of a semaphore). ``expires_in`` is ``None`` (a session lease). Waiters are the
        sessions waiting in ``GET_LOCK(name, slice)`` as ``information_schema.PROCESSLIST``
        shows them (other users' sessions only with the ``PROCESS`` privilege).
        """
        waits = collections.Counter(
            match[0]
            for (info,) in await self._operator_query("inspect", _WAITS)
            for match in _WAIT_CALL.findall(str(info))
            if float(match[1]) > 0
        )
        sql = (
            f"SELECT name, token, sem_limit, holder, holder_connection FROM {self._table} "
            f"WHERE namespace = X'{_hex(namespace)}' AND name IS NOT NULL"
        )
        rows = await self._operator_query("inspect", sql)
        found: list[LockInfo] = []
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
                    "inspect", "SELECT " + ", ".join(f"IS_USED_LOCK('{x}')" for x in labels)
                )
                holders = tuple(
                    HolderInfo(_holder_name(int(conn), holder, holder_conn), None)
                    for conn in used[0]
                    if conn is not None
                )
                if holders:
                    waiters = sum(waits[label] for label in labels)
                    found.append(LockInfo(name, kind, holders, int(token), waiters))
        return found

    async def break_lock(self, spec: LockSpec) -> int:
        """``KILL CONNECTION`` every session holding ``spec``'s lock (a semaphore: any slot),
        then move its fencing row on. The holders' sockets close, so their leases are lost at
        once. Needs the right to kill those sessions (the same user, or ``CONNECTION ADMIN``
        / ``SUPER``)."""
        family = _family(spec.kind)
        if spec.kind is Kind.SEMAPHORE:
            labels = [
                lock_name(spec.namespace, family, spec.name, i)
                for i in range(MAX_SEMAPHORE_LIMIT)
            ]
        else:
            labels = [lock_name(spec.namespace, family, spec.name)]
        used = await self._operator_query(
            "break", "SELECT " + ", ".join(f"IS_USED_LOCK('{x}')" for x in labels)
        )
        sessions = sorted({int(conn) for conn in used[0] if conn is not None})
        for session in sessions:
            # A session gone meanwhile (no such thread) is fine: its lock went with it.
            await self._operator_query("break", f"KILL CONNECTION {session}")
        if sessions:
            key = fence_key(spec.namespace, spec.name).hex()
            await self._operator_query("break", _FENCE_MOVE.format(table=self._table, key=key))
        return len(sessions)

    async def _operator_query(self, action: str, sql: str) -> tuple[tuple[Any, ...], ...]:
        """One statement on a lock-free connection of ours, for inspect and break (a missing
        fencing table, or one made before the columns inspect reads, reads as empty, and
        so does a ``KILL`` of a session that is gone)."""
        self._require_open()
        conn = await self._checkout()
        try:
            rows, _ = await conn.query(
                sql,
                timeout=self._bounds,
                harmless=(_ER_NO_SUCH_TABLE, _ER_BAD_FIELD, _ER_NO_SUCH_THREAD),
            )
        except BaseException as exc:
            if conn.closed:
                self._discard(conn)
            else:
                self._checkin(conn)
            if error_code(exc) in (_ER_NO_SUCH_TABLE, _ER_BAD_FIELD, _ER_NO_SUCH_THREAD):
                return ()
            self._raise_translated(exc, action)
        self._checkin(conn)
        return rows

    def _require_open(self) -> None:
        if self._state != "open":
            raise BackendError(f"the mysql backend for {self._where} is {self._state}")

    def _raise_translated(self, exc: BaseException, action: str) -> NoReturn:
        """Re-raise ``exc``; a driver exception becomes a chained :class:`BackendError`."""
        if isinstance(exc, DRIVER_ERRORS):
            detail = str(exc)
            cause = exc.__cause__
            if cause is not None:  # aiomysql's "Can't connect" hides why (a TLS failure...)
                detail = f"{detail} ({type(cause).__name__}: {cause})"
            if self._password:
                detail = detail.replace(self._password, "***")
            raise BackendError(
                f"mysql {action} failed on {self._where}: {type(exc).__name__}: {detail}"
            ) from exc
        raise exc


def _holder_name(conn: int, holder: bytes | None, holder_conn: int | None) -> str:
    """The owner id recorded by the newest grant if session ``conn`` made it, else the
    session's id."""
    if holder is not None and holder_conn is not None and int(holder_conn) == conn:
        return bytes(holder).decode("ascii", "replace")
    return f"connection {conn}"


_OWNER: Final = "{owner}"  # left in a statement made for a lock, filled in per grant


# Cached: the same few names are locked again and again, and the hashes, hex and formatting
# of a statement cost more than the rest of the client's work on an uncontended grant.
@functools.lru_cache(maxsize=1024)
def _fence_statement(
    template: str,
    table: str,
    namespace: str,
    name: str,
    limit: int,
    refresh: int,
    target: str,
    wait: str,
) -> str:
    """A fencing statement for one lock, with ``{owner}`` still to fill in."""
    return template.format(
        table=table,
        key=fence_key(namespace, name).hex(),
        label=lock_name(namespace, "f", name),
        limit=limit,
        ns=_hex(namespace),
        name=_hex(name),
        owner=_OWNER,
        refresh=refresh,
        target=target,
        wait=wait,
    )


def _hex(text: str) -> str:
    """``text`` as the digits of an SQL hex literal (``X'...'``): no quoting to get wrong."""
    return text.encode("utf-8", "surrogatepass").hex()


def _ident(spec: LockSpec, owner: str) -> tuple[str, str, str, str]:
    return (spec.namespace, _family(spec.kind), spec.name, owner)


def _idle_limit(conn: Conn) -> float:
    """How long a lock-free connection may idle before its own ``wait_timeout`` is near."""
    if conn.wait_timeout is None:
        return math.inf
    return max(conn.wait_timeout - 0.5, 0.25)
