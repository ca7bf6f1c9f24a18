"""MySQL's record of who each server session is: one row per connection in the sessions
table (``CONNECTION_ID()`` → the client's ``identity``), written when the session opens, read
by ``inspect``, swept once the connection is gone. docs/mysql.md, "Who holds it".

Example::

    records = SessionRecords(settings, "aiodlock_fence")
    await records.record(conn)             # at connect: REPLACE, the table made on first use
    names = records.identities_query({12, 15})  # for inspect: the statement to run
"""

from __future__ import annotations

import math
from typing import Any, Final

from . import _mysql_sql as sql
from ._mysql_conn import DRIVER_ERRORS, Conn, error_code
from ._settings import Settings, sessions_table

__all__ = ["SessionRecords"]

_SESSION_ROW_TTL: Final = 7 * 86400
"""Seconds a row of another user's session outlives its writing, when ``fence_ttl=0``."""
_MISSING: Final = (sql.ER_NO_SUCH_TABLE,)


class SessionRecords:
    """The sessions table of one fencing table, and the statements on it."""

    def __init__(self, settings: Settings, fence_table: str) -> None:
        self.table = sessions_table(fence_table, longest=64)
        self._row = sql.SESSION_ROW.format(
            sessions=self.table, identity=sql.hex_digits(settings.identity)
        )
        self._bounds = settings.bounds
        self._sweep = sql.SESSIONS_SWEEP.format(
            sessions=self.table, seconds=math.ceil(settings.fence_ttl) or _SESSION_ROW_TTL
        )

    async def record(self, conn: Conn) -> None:
        """Write this session's row (``REPLACE``: a reused connection id takes it over),
        making the table on first use as the fencing table is made."""
        try:
            await conn.query(self._row, timeout=self._bounds, harmless=_MISSING)
            return
        except DRIVER_ERRORS as exc:
            if error_code(exc) != sql.ER_NO_SUCH_TABLE:
                raise
        await conn.query(sql.SESSIONS_DDL.format(sessions=self.table), timeout=self._bounds)
        await conn.query(self._row, timeout=self._bounds)

    async def sweep(self, conn: Conn) -> None:
        """Delete the rows of sessions gone from ``PROCESSLIST`` (``sql.SESSIONS_SWEEP`` says
        whose); a missing table has nothing to sweep."""
        try:
            await conn.query(self._sweep, timeout=self._bounds, harmless=_MISSING)
        except DRIVER_ERRORS as exc:
            if error_code(exc) != sql.ER_NO_SUCH_TABLE:
                raise

    def identities_query(self, sessions: set[int]) -> str:
        """The statement reading the identities ``sessions`` recorded."""
        ids = ", ".join(str(int(session)) for session in sorted(sessions))
        return sql.SESSION_IDENTITIES.format(sessions=self.table, ids=ids)

    @staticmethod
    def identities(rows: tuple[tuple[Any, ...], ...]) -> dict[int, str]:
        """``identities_query``'s rows as ``{session: identity}`` (none: older code)."""
        return {
            int(session): bytes(identity).decode("utf-8", "surrogatepass")
            for session, identity in rows
        }
