"""One TCP connection to a ZooKeeper server: aiozk's framing, hardened for a lock recipe.

Bounded connecting (aiozk#87), TLS when given a context (ZooKeeper's ``secureClientPort``:
the ``srvr`` probe and the session connection alike), a refused connection said in words
(:class:`ConnectFailed`: a certificate not trusted, a TLS port spoken to in the clear), the
end of the read loop reported at once (aiozk ended it silently on EOF), the requests of one
loop step written in one system call, a reply frame read whole, and the time the connection
last heard anything (docs/zookeeper.md, "How it is built" and "TLS").

Example::

    conn = ZKConnection(host, port, session, tls=ssl.create_default_context(cafile=ca))
    await conn.connect()  # ConnectFailed("127.0.0.1:2281: TLS: ...") if the CA is wrong
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol

from aiozk import exc as zk_exc, protocol
from aiozk.connection import Connection, version_regex

__all__ = ["ConnectFailed", "ConnectionOwner", "ZKConnection"]

logger = logging.getLogger("aiodlock.zookeeper")

_REPLY_HEADER: Final = struct.Struct("!iqi")  # xid, zxid, error code


class ConnectFailed(ConnectionError):
    """Why one server could not be connected to, in words for the user (the session keeps
    the newest, and a client that cannot connect in time says it). ``certain``: trying again
    cannot help (the TLS settings do not fit the server), so a first connect that meets it on
    every endpoint ends at once."""

    def __init__(self, message: str, *, certain: bool = False) -> None:
        super().__init__(message)
        self.certain = certain


class ConnectionOwner(Protocol):
    """What a connection needs of its session."""

    io_timeout: float
    spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]

    def event_dispatch(self, event: Any) -> None: ...

    def connection_broken(self, conn: ZKConnection) -> None: ...


class ZKConnection(Connection):  # type: ignore[misc]
    """One TCP connection: bounded connect, read loop among our tasks, EOF reported, the
    requests of one loop step written together, and the time it last heard from the server."""

    def __init__(
        self,
        host: str,
        port: int,
        session: ConnectionOwner,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(
            host, port, watch_handler=session.event_dispatch, read_timeout=session.io_timeout
        )
        self._session = session
        self.tls = tls  # None: in the clear
        self._outgoing: list[bytes] = []
        self.heard = 0.0  # loop time of the newest frame read (or of the session handshake)

    async def connect(self, timeout: float | None = None) -> None:
        """Connect and learn the server version, each step within ``timeout`` (the
        session's ``io_timeout`` by default): a hung server is given up after it."""
        if timeout is None:
            timeout = self._session.io_timeout
        try:
            reader, writer = await self._open(timeout)
            try:
                self.reader, self.writer = reader, writer
                async with asyncio.timeout(timeout):
                    await self._learn_version()
            finally:
                self._close(writer)
            self.reader, self.writer = await self._open(timeout)
        except ssl.SSLCertVerificationError as exc:
            raise ConnectFailed(
                f"{self._where}: TLS: the server's certificate is not trusted "
                f"({exc.verify_message}): check tls_ca, and that the certificate names "
                f"{self.host}",
                certain=True,
            ) from exc
        except (ssl.SSLError, ConnectionResetError) as exc:
            raise self._refused(exc) from exc

    @property
    def _where(self) -> str:
        return f"{self.host}:{self.port}"

    def _refused(self, exc: OSError) -> ConnectFailed:
        """A reset or a TLS alert while connecting, in words: over TLS, a certificate
        refused or a port without TLS; in the clear, a TLS port (it resets the connection)."""
        if self.tls is None:
            return self._silent()
        reason = exc.reason if isinstance(exc, ssl.SSLError) else None
        return ConnectFailed(
            f"{self._where}: TLS handshake failed ({reason or str(exc) or type(exc).__name__}): "
            "is it the server's secureClientPort, and does it require a client certificate "
            "(tls_cert)?",
            certain=reason is not None,  # a TLS alert; a bare reset may be a restart
        )

    def _silent(self) -> ConnectFailed:
        return ConnectFailed(
            f"{self._where} closed the connection without answering: if it is a "
            "secureClientPort, give the TLS options (tls, tls_ca)"
        )

    async def _open(self, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        # The handshake is bounded with the connect: a server that accepts the TCP
        # connection and never answers the ClientHello is given up after ``timeout`` too.
        async with asyncio.timeout(timeout):
            return await asyncio.open_connection(self.host, self.port, ssl=self.tls)

    async def _learn_version(self) -> None:
        """aiozk's ``srvr`` handshake (the server version, read-only mode), saying why a
        server that answers nothing does: a TLS port closes (or resets) a connection spoken
        in the clear without a word."""
        self.host_ip = self.writer.transport.get_extra_info("peername")[0]
        self.writer.write(b"srvr\n")  # as `echo srvr | nc`: 5 bytes, a TLS record header
        answer = await self.reader.read()
        match = version_regex.match(answer.split(b"\n")[0])
        if match is None:
            if not answer and self.tls is None:
                raise self._silent()
            raise ConnectFailed(f"{self._where} answered 'srvr' with {answer[:60]!r}")
        self.version_info = tuple(map(int, match.groups()))
        self.start_read_only = b"READ_ONLY" in answer

    async def send_connect(self, request: Any) -> Any:
        payload = request.serialize()
        self.writer.write(self._frame(payload))
        try:
            _, zxid, response = await self.read_response(initial_connect=True)
        except Exception as exc:  # EOF: the server refused us (it may lag behind our zxid)
            logger.debug("no session handshake answer from %s:%s: %r", self.host, self.port, exc)
            return None
        return zxid, response

    @staticmethod
    def _frame(payload: bytes) -> bytes:
        return len(payload).to_bytes(4, "big", signed=True) + payload

    def send(self, request: Any, xid: int | None = None) -> asyncio.Future[Any]:
        """aiozk's send, writing every request of one loop step in one system call.

        Under load (a cancellation storm queues hundreds of requests per step) a system call
        per request was about half of the client's CPU time. The requests keep their order;
        the reply future is registered at once, as in aiozk.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self.closing:
            future.set_exception(zk_exc.ConnectError(self.host, self.port))
            return future
        if request.special_xid:
            xid = request.special_xid
        payload = request.serialize(xid)
        self.opcode_xref[xid] = request.opcode
        if xid in protocol.SPECIAL_XIDS:
            self.pending_specials[xid].append(future)
        else:
            self.pending[xid] = future
        if not self._outgoing:
            loop.call_soon(self._flush)
        self._outgoing.append(self._frame(payload))
        return future

    def _flush(self) -> None:
        data = b"".join(self._outgoing)
        self._outgoing.clear()
        if self.closing or self.writer is None:
            return
        try:
            self.writer.write(data)
        except Exception as exc:  # the transport is gone: what is pending will not be answered
            logger.debug("zookeeper write to %s:%s failed: %r", self.host, self.port, exc)
            self.abort(zk_exc.ConnectError)

    async def read_response(self, initial_connect: bool = False) -> Any:
        """One frame. aiozk read every part under its own ``wait_for`` (a task per part);
        here a frame is read whole, unbounded: a connection that stops midway is silent,
        which the backend's liveness check (nothing heard for a session timeout) ends."""
        try:
            head = await self.reader.readexactly(4)
            raw = await self.reader.readexactly(int.from_bytes(head, "big", signed=True))
        except asyncio.IncompleteReadError:
            raise ConnectionAbortedError from None
        self.heard = asyncio.get_running_loop().time()
        if initial_connect or self.pending_specials[protocol.CLOSE_XID]:
            return None, None, protocol.ConnectResponse.deserialize(raw)
        xid, zxid, error_code = _REPLY_HEADER.unpack_from(raw)
        if error_code:
            self.opcode_xref.pop(xid, None)
            return xid, zxid, zk_exc.get_response_error(error_code)
        payload = raw[_REPLY_HEADER.size :]
        if xid == protocol.WATCH_XID:
            return xid, zxid, protocol.WatchEvent.deserialize(payload)
        opcode = self.opcode_xref.pop(xid)
        return xid, zxid, protocol.response_xref[opcode].deserialize(payload)

    async def read_loop(self) -> None:
        """aiozk's read loop, quiet about a dropped connection (it logged a traceback at
        ERROR each time) and tolerant of a reply to a request it already gave up on."""
        while not self.closing or self.pending_count() > 0:
            try:
                xid, zxid, response = await self.read_response()
            except (ConnectionAbortedError, asyncio.CancelledError):
                return
            except Exception as exc:  # reset, truncated frame: the connection is done
                logger.debug("zookeeper connection %s:%s failed: %r", self.host, self.port, exc)
                return
            if xid == protocol.WATCH_XID:
                self.watch_handler(response)
                continue
            if xid in protocol.SPECIAL_XIDS:
                waiting = self.pending_specials[xid]
                future = waiting.pop() if waiting else None
            else:
                future = self.pending.pop(xid, None)
            if future is None or future.done():
                continue
            if isinstance(response, Exception):
                future.set_exception(response)
            else:
                future.set_result((zxid, response))

    def start_read_loop(self) -> None:
        self.read_loop_task = self._session.spawn(
            self._read_then_report(), f"aiodlock-zk-read-{self.host}:{self.port}"
        )

    async def _read_then_report(self) -> None:
        try:
            await self.read_loop()
        except Exception as exc:  # a frame aiozk cannot parse, say
            logger.debug("zookeeper read loop ended: %r", exc)
        if not self.closing:
            # aiozk's loop returns silently on EOF; fail what is pending and say so.
            self.abort(zk_exc.ConnectError)
            self._session.connection_broken(self)

    def abort(self, exception: type[Exception] = zk_exc.ConnectError) -> None:
        """Fail every pending request (aiozk's version logs a warning each time)."""
        for future in self.drain_all_pending():
            if not future.done():
                future.set_exception(exception(self.host, self.port))

    def discard(self) -> None:
        """Close now, without waiting for anything; pending requests fail."""
        self.closing = True
        task = self.read_loop_task
        if task is not None and not task.done():
            task.cancel()
        self.abort(zk_exc.ConnectError)
        if self.writer is not None:
            self._close(self.writer)

    def _close(self, writer: asyncio.StreamWriter) -> None:
        """Close now. Over TLS, without the close_notify exchange: the session was ended
        (or given up) at ZooKeeper's level already, and a graceful TLS close would keep the
        socket until the server answers it, or 30 s (past the end of the client's loop)."""
        if self.tls is None:
            writer.close()
        else:
            writer.transport.abort()
