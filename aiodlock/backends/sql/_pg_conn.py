"""One asyncpg connection, typed, bounded in time, and watched for the server closing it.

asyncpg is untyped (``Any`` to mypy); this module is the only place that touches it, so the
backend works with a small typed surface:

* :meth:`Conn.open` connects under one ``asyncio.timeout`` covering TCP, TLS, authentication
  and start-up (asyncpg closes the half-open socket when it is cancelled part way).
* :meth:`Conn.fetchrow` and :meth:`Conn.script` run one statement (a script: several, in the
  simple-query protocol, with literal values only). A reply abandoned by a cancellation or a
  timeout marks the connection :attr:`~Conn.doubtful`: asyncpg has sent the server a cancel
  request, but the statement may have finished first — a lock wait may have *got* the lock —
  so the backend never reuses such a connection before cleaning it (``pg_advisory_unlock_all``).
* asyncpg's termination listener sets :attr:`Conn.peer_closed`, and the lease event attached
  to the connection, the moment the server closes it (``pg_terminate_backend``, an
  ``idle_session_timeout``, a restart): an idle lock holder learns of its loss at once, not at
  its next keep-alive. Closing it ourselves (:meth:`Conn.close`) does not count as a loss.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import asyncpg

from .. import Deadlines, Limit
from ._connection import ConnectSettings

__all__ = ["DRIVER_ERRORS", "LOCK_TIMEOUT", "Conn", "sqlstate"]

DRIVER_ERRORS: Final[tuple[type[BaseException], ...]] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,  # TimeoutError is one
    EOFError,
)
"""What asyncpg raises: translated by the backend."""

LOCK_TIMEOUT: Final = "55P03"
"""SQLSTATE ``lock_not_available``: a wait ran out its ``lock_timeout``."""


_SESSION_SETTINGS: Final = (
    # A session whose client vanished during a lock wait ends within this, not when the
    # wait does (PostgreSQL 14+).
    "SET client_connection_check_interval = 500; "
    # The fencing bump commits without waiting for the WAL flush (about half the cost of a
    # grant). Safe: every bump is at least the server clock in microseconds, so after a crash
    # that lost the last commits the next token is still above every token handed out (a
    # restart takes far longer than the microseconds a token can run ahead of the clock).
    "SET synchronous_commit = off"
)


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a server error (``"55P03"``, ``"42P01"``...), or None."""
    if isinstance(exc, asyncpg.PostgresError):
        code = getattr(exc, "sqlstate", None)
        return str(code) if code is not None else None
    return None


class Conn:
    """A dedicated server session: used by one acquisition at a time, never shared."""

    __slots__ = (
        "_closing",
        "_raw",
        "doubtful",
        "idle_since",
        "io",
        "lease_event",
        "peer_closed",
        "pid",
    )

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._closing = False
        self.pid: int = int(raw.get_server_pid())
        """The backend process id of the session (``pg_backend_pid()``)."""
        self.idle_since = 0.0
        self.peer_closed = False
        self.doubtful = False
        """A reply was abandoned: the session may hold something we did not see granted."""
        self.lease_event: asyncio.Event | None = None
        self.io = asyncio.Lock()
        """Serialises a keep-alive in flight with the release that follows it."""
        raw.add_termination_listener(self._on_terminated)

    @classmethod
    async def open(cls, settings: ConnectSettings) -> Conn:
        """Connect and authenticate within ``settings.connect_timeout`` seconds."""
        async with asyncio.timeout(settings.connect_timeout):
            raw = await asyncpg.connect(
                host=settings.host,
                port=settings.port,
                user=settings.user,
                password=settings.password,
                database=settings.database,
                ssl=settings.tls,
                timeout=settings.connect_timeout,
                # Only what a pooler passes on (PgBouncer refuses other startup
                # parameters): the rest is set by configure(), once the backend knows the
                # session is its own.
                server_settings={"application_name": "aiodlock"},
            )
        return cls(raw)

    async def configure(self, *, timeout: Limit, then: str = "") -> None:
        """The session settings the backend relies on, and ``then`` (a literal statement:
        the session's identity row), in one round trip after connect."""
        await self.script(
            f"{_SESSION_SETTINGS}; {then}" if then else _SESSION_SETTINGS, timeout=timeout
        )

    def _on_terminated(self, _raw: Any) -> None:
        if self._closing:
            return
        self.peer_closed = True
        if self.lease_event is not None:
            self.lease_event.set()

    @property
    def closed(self) -> bool:
        """True once the connection cannot be used (closed by us or by the server)."""
        return bool(self._raw.is_closed()) or self.peer_closed

    @property
    def in_transaction(self) -> bool:
        """True inside an explicit transaction (left open by an abandoned statement)."""
        return bool(self._raw.is_in_transaction())

    async def fetchrow(self, sql: str, *args: Any, timeout: Limit) -> tuple[Any, ...]:
        """Run one statement (prepared and cached by asyncpg); its first row, or ``()``.

        ``timeout``: seconds, the backend's shared :class:`Deadlines` (its usual limit,
        without a timer per statement), or None.
        """
        try:
            if isinstance(timeout, Deadlines):
                row = await timeout.bound(self._raw.fetchrow(sql, *args))
            else:
                row = await self._raw.fetchrow(sql, *args, timeout=timeout)
        except BaseException as exc:
            self._failed(exc)
            raise
        return tuple(row) if row is not None else ()

    async def script(self, sql: str, *, timeout: Limit) -> None:
        """Run a script of statements (simple-query protocol: literal values only).

        The server runs them as one implicit transaction: on an error, a ``SET`` before it is
        rolled back too.
        """
        try:
            if isinstance(timeout, Deadlines):
                await timeout.bound(self._raw.execute(sql))
            else:
                await self._raw.execute(sql, timeout=timeout)
        except BaseException as exc:
            self._failed(exc)
            raise

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError | TimeoutError):
            self.doubtful = True
        elif not isinstance(exc, asyncpg.PostgresError) or isinstance(
            exc, asyncpg.FatalPostgresError
        ):
            self.doubtful = True  # the protocol failed: never reuse the connection

    def close(self) -> None:
        """Close now: the server ends the session, which frees whatever it held."""
        self._closing = True
        self.lease_event = None
        self._raw.terminate()

    async def aclose(self, *, timeout: float) -> None:
        """Close politely and wait until the connection is gone (over TLS, the TLS shutdown
        too, so that nothing is left for a closing event loop); :meth:`close` if that fails."""
        self._closing = True
        self.lease_event = None
        try:
            await self._raw.close(timeout=timeout)
        except Exception:  # timed out, or already broken: end it the hard way
            self._raw.terminate()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Conn pid={self.pid} {state}>"
