"""One aiomysql connection, typed, cancellation-safe, and watched for the server closing it.

aiomysql is untyped (``Any`` to mypy); this module is the only place that touches it, so the
backend works with a small typed surface:

* :meth:`Conn.open` connects under one ``asyncio.timeout`` covering TCP, handshake and
  authentication, and closes the half-open socket if it is cancelled or times out part way
  (``aiomysql.connect()`` would drop the connection object unclosed). aiomysql's own
  ``connect_timeout`` is left unset: it goes through ``asyncio.wait_for``, which on Python 3.11
  can swallow a cancellation that arrives just as the connect completes.
* :meth:`Conn.query` sends one statement. aiomysql closes a connection whose reply is
  abandoned (cancelled, timed out) — the session then ends on the server and every user lock
  it held is freed — and this wrapper closes it on *any* other failure too, except for the
  server errors the caller names as harmless: a connection is never reused in a doubtful
  state. Results are read from the connection, not through a cursor, because aiomysql's cursor
  turns server notes (``CREATE TABLE IF NOT EXISTS`` on an existing table) into Python
  warnings.
* The transport's protocol is wrapped so that the moment the server closes the socket (``KILL
  CONNECTION``, ``wait_timeout``, shutdown) :attr:`Conn.peer_closed` becomes true and the
  lease event attached to the connection, if any, is set: an idle lock holder learns of its
  loss at once, not at its next keep-alive.
* :meth:`Conn.ping` is ``ping(reconnect=False)``: aiomysql's default reconnects silently into
  a new session, one that no longer holds the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Final

import aiomysql

from .. import BackendError, Deadlines, Limit
from ._connection import ConnectSettings

__all__ = ["DRIVER_ERRORS", "Conn", "error_code"]

DRIVER_ERRORS: Final[tuple[type[BaseException], ...]] = (aiomysql.MySQLError, OSError, EOFError)
"""What aiomysql raises (``TimeoutError`` is an ``OSError``): translated by the backend."""

_COM_QUIT: Final = b"\x01\x00\x00\x00\x01"  # payload length 1, sequence 0, COM_QUIT


def error_code(exc: BaseException) -> int | None:
    """The MySQL error number of a driver exception (``1146``, ``2013``...), or None."""
    if isinstance(exc, aiomysql.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return int(exc.args[0])
    return None


class _LossWatch(asyncio.Protocol):
    """Delegates to aiomysql's stream protocol; reports the peer closing the connection."""

    def __init__(
        self,
        inner: asyncio.Protocol,
        on_peer_closed: Callable[[], None],
        on_lost: Callable[[Exception | None], None],
    ) -> None:
        self._inner = inner
        self._on_peer_closed = on_peer_closed
        self._on_lost = on_lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        self._on_peer_closed()
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_lost(exc)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class Conn:
    """A dedicated server session: used by one acquisition at a time, never shared."""

    __slots__ = (
        "_raw",
        "abandoned",
        "idle_since",
        "io",
        "lease_event",
        "peer_closed",
        "thread_id",
        "wait_timeout",
    )

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.thread_id: int = int(raw.server_thread_id[0])
        """``CONNECTION_ID()`` of the session, for ``KILL`` and ``IS_USED_LOCK``."""
        self.wait_timeout: int | None = None
        """The session's ``wait_timeout`` once we set it (None: the server's default)."""
        self.idle_since = 0.0
        self.peer_closed = False
        self.abandoned = False
        """A reply was abandoned (cancelled or timed out): the server may still be busy."""
        self.lease_event: asyncio.Event | None = None
        self.io = asyncio.Lock()
        """Serialises a keep-alive in flight with the release that follows it."""
        transport = raw._writer.transport
        watch = _LossWatch(transport.get_protocol(), self._on_peer_closed, self._on_lost)
        transport.set_protocol(watch)

    @classmethod
    async def open(cls, settings: ConnectSettings) -> Conn:
        """Connect and authenticate within ``settings.connect_timeout`` seconds."""
        raw = aiomysql.Connection(
            host=settings.host,
            port=settings.port,
            user=settings.user,
            password=settings.password or "",
            db=settings.database,
            unix_socket=settings.unix_socket,
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=None,
            program_name="aiodlock",
            ssl=settings.tls,
        )
        try:
            async with asyncio.timeout(settings.connect_timeout):
                await raw._connect()
            # aiomysql goes on in the clear when the server offers no TLS: refuse instead.
            if settings.tls is not None and not raw._secure:
                raise BackendError(
                    "TLS was asked for (ssl options) but the server does not offer it"
                )
            return cls(raw)
        except BaseException:
            raw.close()
            raise

    def _on_lost(self, exc: Exception | None) -> None:
        # A reset, or a close we did not make. A TLS transport reports the server hanging up
        # without a close_notify (as MariaDB does on KILL) as a clean loss, with no EOF first.
        if exc is not None or not self._raw.closed:
            self._on_peer_closed()

    def _on_peer_closed(self) -> None:
        self.peer_closed = True
        if self.lease_event is not None:
            self.lease_event.set()

    @property
    def closed(self) -> bool:
        """True once the connection cannot be used (closed by us or by the server)."""
        return bool(self._raw.closed) or self.peer_closed

    async def query(
        self, sql: str, *, timeout: Limit, harmless: Sequence[int] = ()
    ) -> tuple[tuple[tuple[Any, ...], ...], int]:
        """Run one statement; return its rows and its ``insert_id``.

        ``timeout``: seconds, the backend's shared :class:`Deadlines` (its usual limit, without
        a timer per statement), or None.

        On failure the connection is closed (the server then frees whatever the session
        held), unless the error is a server error listed in ``harmless``.
        """
        try:
            if timeout is None:
                await self._raw.query(sql)
            elif isinstance(timeout, Deadlines):
                await timeout.bound(self._raw.query(sql))
            else:
                async with asyncio.timeout(timeout):
                    await self._raw.query(sql)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError | TimeoutError):
                self.abandoned = True
            if error_code(exc) not in harmless:
                self.close()
            raise
        result = self._raw._result
        rows: tuple[tuple[Any, ...], ...] = tuple(result.rows or ())
        return rows, int(result.insert_id or 0)

    async def write(
        self, sql: str, *, timeout: Limit, harmless: Sequence[int] = ()
    ) -> tuple[int, int]:
        """Run an ``INSERT``; return how many rows it changed and its ``insert_id``."""
        _, insert_id = await self.query(sql, timeout=timeout, harmless=harmless)
        return int(self._raw._result.affected_rows or 0), insert_id

    async def change(self, sql: str, *, timeout: Limit) -> int:
        """Run an ``UPDATE``/``DELETE``; return how many rows it changed."""
        await self.query(sql, timeout=timeout)
        return int(self._raw._result.affected_rows or 0)

    async def value(self, sql: str, *, timeout: Limit) -> Any:
        """The first column of the first row of a ``SELECT``."""
        rows, _ = await self.query(sql, timeout=timeout)
        return rows[0][0] if rows else None

    async def row(self, sql: str, *, timeout: Limit) -> tuple[Any, ...]:
        """The first row of a ``SELECT``."""
        rows, _ = await self.query(sql, timeout=timeout)
        return rows[0] if rows else ()

    async def ping(self, *, timeout: float) -> None:
        """COM_PING without reconnecting; closes the connection if it fails."""
        try:
            async with asyncio.timeout(timeout):
                await self._raw.ping(reconnect=False)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError | TimeoutError):
                self.abandoned = True
            self.close()
            raise

    def close(self) -> None:
        """Close now. An idle session is told COM_QUIT first, so the server logs no abort."""
        raw = self._raw
        if raw.closed:
            return
        if not self.abandoned and not self.peer_closed:
            with contextlib.suppress(Exception):
                raw._writer.transport.write(_COM_QUIT)
        raw.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Conn id={self.thread_id} {state}>"
