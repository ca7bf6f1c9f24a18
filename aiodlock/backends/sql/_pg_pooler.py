"""Refusing a pooler that does not keep our session: PgBouncer's transaction pooling.

A session-level advisory lock belongs to one server session. Behind a pooler in transaction
(or statement) pooling mode, each statement of a client connection may run on a different
server session: a lock taken by one statement is then held by a server session that the next
client may get, and it excludes nobody — the lock would look held and not be. So the backend
checks, when it opens, that its statements keep their server session, and refuses to open if
they do not (:func:`refuse_transaction_pooling`).

The check costs one statement on a direct connection: the backend process id the server
announced at connect is the one that answers (``pg_backend_pid()``). A pooler answers the
connect itself, with an id of its own; then a second client connection and a few alternating
statements tell session pooling (each client keeps its server session) from transaction
pooling (statements move between sessions, or two clients share one). docs/postgres.md
("Behind PgBouncer") tells what to do instead.

Example::

    await refuse_transaction_pooling(conn, open_other=dialect_open, where=url, bounds=bounds)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from .. import BackendError, Limit
from ._pg_conn import DRIVER_ERRORS, Conn, sqlstate

__all__ = ["refuse_transaction_pooling"]

_ROUNDS: Final = 3
"""Alternations of the two client connections' statements: each is a chance for a pooler
in transaction mode to show itself (it hands the most recently freed server session out
first, so the first round almost always does)."""
_PREPARED_STATEMENT_GONE: Final = "26000"
"""A statement prepared on one server session and run on another: transaction pooling."""
_CLOSE_TIMEOUT: Final = 1.0


def _refusal(where: str) -> str:
    return (
        f"{where} is a connection pooler in transaction pooling mode (PgBouncer "
        "pool_mode=transaction, or statement): the PostgreSQL backend holds session-level "
        "advisory locks, which would not exclude there, since each statement may run on "
        "another server session. Connect aiodlock straight to PostgreSQL, or to a pool in "
        "session mode (pool_mode=session); to lock inside your own transactions through "
        "transaction pooling, use aiodlock.backends.postgres.lock_in_transaction()"
    )


async def refuse_transaction_pooling(
    conn: Conn, *, open_other: Callable[[], Awaitable[Conn]], where: str, bounds: Limit
) -> None:
    """Raise :class:`BackendError` unless ``conn``'s statements keep their server session
    (see the module docstring); ``open_other`` opens a second, unconfigured connection."""
    try:
        if await _backend_pid(conn, bounds) == conn.pid:
            return  # straight to the server: the process we connected to answers
        other = await open_other()
        try:
            for _ in range(_ROUNDS):
                first = await _backend_pid(conn, bounds)
                theirs = await _backend_pid(other, bounds)
                again = await _backend_pid(conn, bounds)
                if theirs == first or again != first:
                    raise BackendError(_refusal(where))
        finally:
            await other.aclose(timeout=_CLOSE_TIMEOUT)
    except DRIVER_ERRORS as exc:
        if sqlstate(exc) == _PREPARED_STATEMENT_GONE:
            raise BackendError(_refusal(where)) from exc
        raise


async def _backend_pid(conn: Conn, bounds: Limit) -> int:
    (pid,) = await conn.fetchrow("SELECT pg_backend_pid()", timeout=bounds)
    return int(pid)
