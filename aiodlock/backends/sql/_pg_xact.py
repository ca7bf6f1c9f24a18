"""Transaction-scoped PostgreSQL locks on the caller's own asyncpg connection.

:func:`lock_in_transaction` takes ``pg_advisory_xact_lock`` inside a transaction the caller
already has open, bumps the name's fencing row in that same transaction and returns the
token; the server releases the lock when the transaction commits or rolls back. Nothing is
left on the session afterwards (no session lock, no plain ``SET``), so it works through
PgBouncer in transaction pooling mode, where a session lock of the backend cannot.

It shares the backend's keys and fencing table: a transaction lock ``x`` and a
``LockClient`` mutex ``x`` of the same namespace exclude each other, and their tokens come
from one counter. Every step runs inside a savepoint, so whatever this module raises (a
cancellation aside), the caller's transaction is as it was before the call (a timed-out wait
included).

Example::

    async with conn.transaction():
        token = await lock_in_transaction(conn, "order:42", namespace="shop", timeout=5)
        await conn.execute("UPDATE orders SET state = 'paid', fence = $1 WHERE id = 42", token)

docs/postgres.md ("Locks inside your own transaction") tells when to use it.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Final

from .. import BackendError, LockTimeoutError, check_name, check_namespace, check_timeout
from . import _pg_sql as sql
from ._pg_conn import DRIVER_ERRORS, LOCK_TIMEOUT, sqlstate
from ._pg_keys import advisory_key, fence_key
from ._settings import DEFAULTS, check_table_name

if TYPE_CHECKING:
    import asyncpg

__all__ = ["DEFAULT_FENCE_TABLE", "lock_in_transaction", "try_lock_in_transaction"]

DEFAULT_FENCE_TABLE: Final = DEFAULTS["fence_table"]
"""The backend's default ``fence_table``: transaction locks share its tokens."""

_check_table: Final = functools.partial(check_table_name, longest=63, fold=True)

# One name, always the newest savepoint of the transaction while it exists, so ROLLBACK TO and
# RELEASE find ours even if the caller uses the same name.
_SAVEPOINT: Final = "SAVEPOINT aiodlock_xact"
_RELEASE: Final = "RELEASE SAVEPOINT aiodlock_xact"
_UNDO: Final = "ROLLBACK TO SAVEPOINT aiodlock_xact; RELEASE SAVEPOINT aiodlock_xact"

# The fencing bump, as the backend's (the rule GREATEST(token + 1, server clock in µs) keeps
# both counters one): $2 fence key, $3 namespace, $4 name. A row of another name (a hash
# collision) is left alone and no row comes back. sem_limit is left as it is: a mutex has none.
_BUMP: Final = """bump AS (
    INSERT INTO {table} AS f (lock_key, namespace, name, token, sem_limit, touched)
    SELECT $2, $3, $4, {clock}, NULL, clock_timestamp() FROM {source}
    ON CONFLICT (lock_key) DO UPDATE
        SET token = GREATEST(f.token + 1, {clock}), touched = clock_timestamp()
        WHERE f.namespace = EXCLUDED.namespace AND f.name = EXCLUDED.name
    RETURNING f.token)"""

# The wait: $1 advisory key, $5 lock_timeout ('0': none). lock_timeout is set for the
# transaction (is_local) just before the wait, and set back to the caller's value once the
# key is ours, in the same statement; a wait that runs out fails with lock_not_available and
# the savepoint's rollback restores the setting. Returns the token (NULL: collision).
_WAIT: Final = """WITH prev AS MATERIALIZED (SELECT current_setting('lock_timeout') AS setting),
armed AS MATERIALIZED (SELECT set_config('lock_timeout', $5, true) FROM prev),
got AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::bigint) FROM armed),
disarmed AS MATERIALIZED (
    SELECT set_config('lock_timeout', prev.setting, true) FROM got, prev),
{bump}
SELECT bump.token FROM disarmed LEFT JOIN bump ON true"""

# The try: $1 advisory key; (taken, token) — the bump runs only if the key was taken.
_TRY: Final = """WITH got AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($1::bigint) AS taken),
{bump}
SELECT got.taken, bump.token FROM got LEFT JOIN bump ON true"""


@functools.lru_cache(maxsize=64)
def _statement(table: str, *, wait: bool) -> str:
    """The wait or try statement for this (checked) fencing table."""
    source = "disarmed" if wait else "got WHERE got.taken"
    bump = _BUMP.format(table=table, clock=sql.CLOCK_US, source=source)
    return (_WAIT if wait else _TRY).format(bump=bump)


async def lock_in_transaction(
    conn: asyncpg.Connection,
    name: str,
    *,
    namespace: str = "aiodlock",
    timeout: float | None = None,
    fence_table: str = DEFAULT_FENCE_TABLE,
) -> int:
    """Wait (up to ``timeout`` seconds; ``None``: as long as it takes; ``0``: not at all) for
    the mutex ``name`` of ``namespace`` and return its fencing token; the lock is held until
    the caller's transaction ends.

    ``conn`` is an asyncpg connection (or a pool's connection) inside a transaction. The lock
    is ``pg_advisory_xact_lock`` on the key a ``LockClient`` mutex of the same name uses, so
    the two exclude each other; the token is bumped in the backend's fencing row
    (``fence_table``, created if missing) in this transaction, so it is larger than every token
    either handed out for the name. Nothing outlives the transaction: PgBouncer in transaction
    pooling mode is fine. There is no lease, loss signal or renewal: the transaction is the
    lease, and the lock ends with it (COMMIT, ROLLBACK, or the session ending).

    Raises:
        LockTimeoutError: not granted within ``timeout``; the caller's transaction is intact
            (the wait ran in a savepoint) and may go on.
        BackendError: the server failed (the asyncpg error is chained), or the name's fencing
            row belongs to another name (a 64-bit hash collision). The savepoint is rolled
            back, so the caller's transaction is as before the call, unless the connection
            itself failed.
        RuntimeError: ``conn`` is not inside a transaction.
        TypeError, ValueError: a bad argument.

    Cancelled while waiting, the transaction is left in an unknown state (the lock may have
    been granted): end it, as ``async with conn.transaction():`` does on the way out. The
    caller's ``statement_timeout`` still applies to the wait (a ``BackendError``). In
    REPEATABLE READ or SERIALIZABLE transactions a contended grant may fail with a
    serialization failure (``BackendError`` caused by ``asyncpg.SerializationError``): retry
    the transaction, as those levels require anyway. The fencing row stays locked until the
    transaction ends, so read/write locks and semaphores of the *same name* (which share it)
    cannot be granted until then.

    Example::

        async with pool.acquire() as conn, conn.transaction():
            token = await lock_in_transaction(conn, "order:42", namespace="shop", timeout=5)
            await conn.execute("UPDATE orders SET fence = $1 WHERE id = 42", token)
    """
    wait = check_timeout(timeout)
    checked = _check(conn, name, namespace, fence_table)
    if wait == 0:  # lock_timeout = 0 would mean no limit at all: one try instead
        token = await try_lock_in_transaction(
            conn, name, namespace=namespace, fence_table=fence_table
        )
        if token is None:
            raise LockTimeoutError(f"could not acquire lock {name!r} within 0 s")
        return token
    # At most lock_timeout's largest value (24.8 days).
    ms = "0" if wait is None else str(max(1, min(math.ceil(wait * 1000), sql.MAX_TIMEOUT_MS)))
    args = (advisory_key(namespace, "m", name), fence_key(namespace, name), namespace, name, ms)
    # With no timeout the wait runs under lock_timeout 0: only the bump, back under the
    # caller's own lock_timeout, can run out of time.
    late = f"within {wait} s" if wait is not None else "within the transaction's lock_timeout"
    statement = _statement(checked, wait=True)
    token = await _granted(conn, statement, args, name, checked, late=late)
    assert token is not None  # a wait gets the lock or raises
    return token


async def try_lock_in_transaction(
    conn: asyncpg.Connection,
    name: str,
    *,
    namespace: str = "aiodlock",
    fence_table: str = DEFAULT_FENCE_TABLE,
) -> int | None:
    """Take the mutex ``name`` of ``namespace`` without waiting: its fencing token, or
    ``None`` if another session or transaction holds it (nothing is then left behind).

    The same lock, token and errors as :func:`lock_in_transaction` (no ``LockTimeoutError``).

    Example::

        async with conn.transaction():
            token = await try_lock_in_transaction(conn, "nightly-report")
            if token is None:
                return  # another worker is on it
    """
    checked = _check(conn, name, namespace, fence_table)
    args = (advisory_key(namespace, "m", name), fence_key(namespace, name), namespace, name)
    return await _granted(conn, _statement(checked, wait=False), args, name, checked)


def _check(conn: Any, name: object, namespace: object, fence_table: object) -> str:
    """Check the arguments and that ``conn`` is in a transaction; the checked table name."""
    check_name(name)
    check_namespace(namespace)
    table = _check_table(fence_table)
    in_transaction = getattr(conn, "is_in_transaction", None)
    if not callable(in_transaction):
        raise TypeError(f"conn must be an asyncpg connection, not {type(conn).__name__}")
    if not in_transaction():
        raise RuntimeError(
            "a transaction lock needs a transaction to live in: call it inside "
            "`async with conn.transaction():` (the lock is held until that transaction "
            "ends), or use a LockClient for a lock of its own"
        )
    return table


async def _granted(
    conn: Any,
    statement: str,
    args: tuple[Any, ...],
    name: str,
    table: str,
    *,
    late: str | None = None,
) -> int | None:
    """Run the wait or try statement in a savepoint; the token, or None if not taken.

    A failure rolls the savepoint back: the key (if it was granted), the bump and the
    ``lock_timeout`` change go with it, and the caller's transaction is as it was. ``late``:
    a wait's ``lock_not_available`` is a ``LockTimeoutError`` saying it did not get the lock
    ``late`` ("within 5 s").
    """
    try:
        row = await _run(conn, statement, args, table)
        taken = len(row) == 1 or bool(row[0])  # the wait's row is the token alone
        token = row[-1]
        collision = taken and token is None
        await conn.execute(_UNDO if collision else _RELEASE)
    except DRIVER_ERRORS as exc:
        if late is not None and sqlstate(exc) == LOCK_TIMEOUT:
            raise LockTimeoutError(f"could not acquire lock {name!r} {late}") from exc
        raise BackendError(
            f"postgres transaction lock {name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if collision:
        raise BackendError(
            f"the fencing row of {name!r} (key {args[1]}) belongs to another name in table "
            f"{table}: a 64-bit hash collision; rename one of the two locks"
        )
    return int(token) if taken else None


async def _run(conn: Any, statement: str, args: tuple[Any, ...], table: str) -> Any:
    """The statement's row, its savepoint still open; a missing fencing table is created
    (as the backend does) and the statement run again."""
    try:
        return await _attempt(conn, statement, args)
    except DRIVER_ERRORS as exc:
        if sqlstate(exc) != sql.UNDEFINED_TABLE:
            raise
    try:
        await _create_table(conn, table)
    except DRIVER_ERRORS as exc:  # not the lock's own lock_not_available: a BackendError
        raise BackendError(
            f"postgres transaction lock: creating the fencing table {table} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return await _attempt(conn, statement, args)


async def _attempt(conn: Any, statement: str, args: tuple[Any, ...]) -> Any:
    """``SAVEPOINT``, then the statement's row; a failed statement undoes the savepoint
    (back to the caller's transaction as it was) and is raised."""
    await conn.execute(_SAVEPOINT)
    try:
        return await conn.fetchrow(statement, *args)
    except DRIVER_ERRORS:
        await conn.execute(_UNDO)
        raise


async def _create_table(conn: Any, table: str) -> None:
    """Create the fencing table as the backend does, each statement in a savepoint (another
    session creating it at the same moment is fine). It is part of the caller's transaction:
    others see it once that commits."""
    for ddl in (sql.FENCE_DDL, sql.FENCE_INDEX, sql.FENCE_COMMENT):
        await conn.execute(_SAVEPOINT)
        try:
            await conn.execute(ddl.format(table=table))
        except DRIVER_ERRORS as exc:
            await conn.execute(_UNDO)
            if sqlstate(exc) not in sql.DUPLICATE:
                raise
        else:
            await conn.execute(_RELEASE)
