"""A hardened ZooKeeper transport on aiozk's low-level session, typed for the backend.

aiozk is used as a *wire-protocol transport* only (its Lock/SharedLock recipes have known
safety bugs, listed in ``docs/zookeeper.md`` under "How it is built"). This module keeps
what aiozk does well — the jute protocol classes, the connection's framing and read loop,
session ids and passwords — and replaces the parts that break a lock recipe:

* **No resend behind the caller's back.** Requests bypass ``Session.send`` (whose retry
  policy resends a request after a reconnect, so a lost create reply leaves a duplicate
  node). A request is written once per connection. A create whose connection fails is
  reported as :class:`ConnectionLoss` ("outcome unknown": the recipe then looks for its node
  by uuid); reads and deletes, which are safe to repeat, are sent again once reconnected,
  within their timeout. :class:`NotConnected` means "never sent".
* **Connection loss is noticed at once.** aiozk's read loop ends silently on EOF and leaves
  the session CONNECTED with its requests pending until a heartbeat times out. Here the read
  loop's end fails the pending requests and moves the session to SUSPENDED, so the repair
  loop reconnects immediately (a killed ensemble leader costs one reconnect, not 2/3 of a
  session timeout).
* **Bounded connecting.** The ``srvr`` version probe and the second TCP connect have no
  timeout in aiozk (aiozk#87); a paused server hung the repair loop. Both are bounded here,
  and the retry backoff is capped at one second instead of sixty.
* **The session is kept unless the server says it is gone.** aiozk gives up its session id
  on a handshake timeout or when a lagging server closes the connection; here only the
  server's "expired" answer (or no server accepting us for a whole session timeout) ends it.
  aiozk also forgot the last seen zxid on every reconnect; it is kept.
* **A repair loop that cannot die.** Any unexpected error is logged and the loop retries;
  invalid state transitions (aiozk raises on LOST → SUSPENDED) are ignored.
* **Heartbeats and watches are the backend's.** aiozk's heartbeat is off: the backend pings
  on its own schedule (and learns the *send time* of every answered request — the basis of
  its session grace timer, and :meth:`ZKTransport.silence`, the time since the connection
  last heard anything — the basis of its liveness check). Node watch events go straight to
  one callback with their type (aiozk passed only the path, and never replayed DELETED
  watches after a reconnect); the backend re-arms its watches itself after every reconnect,
  so ``SetWatches`` is not used.
* **Every task belongs to the backend's TaskGroup** (the repair loop and read loops
  included); aiozk's own ``create_task`` calls are not used.
* **Real container nodes.** aiozk creates a "container" with ``create2`` and flag 4, which
  the server stores as a plain PERSISTENT node; only the ``createContainer`` opcode (19)
  makes a container, so that is what is sent.
* **Cheap under load.** The requests of one loop step go out in one write (aiozk made a
  system call per request), and a reply frame is read whole (aiozk wrapped each of its three
  parts in ``wait_for``, a task each): under a cancellation storm (thousands of requests a
  second) the system calls alone were about half of the client's CPU time.
* **No stat cache.** ``ZKClient`` caches the stat of every path it touches, forever; this
  transport keeps nothing per path.

Everything aiozk raises is translated here: :class:`NoNodeError`, :class:`NodeExistsError`
and :class:`NotEmptyError` are answers the recipe expects; everything else becomes
:class:`~aiodlock.BackendError` (or a subclass) with the aiozk exception chained.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from aiozk import exc as zk_exc, protocol
from aiozk.connection import Connection
from aiozk.session import Session
from aiozk.states import SessionStateMachine, States

from .._exceptions import BackendError

__all__ = [
    "CONNECTED",
    "LOST",
    "SUSPENDED",
    "ConnectionLoss",
    "NoNodeError",
    "NodeExistsError",
    "NodeStat",
    "NotConnected",
    "NotEmptyError",
    "ZKTransport",
]

logger = logging.getLogger("aiodlock.zookeeper")

CONNECTED: Final = States.CONNECTED
SUSPENDED: Final = States.SUSPENDED
LOST: Final = States.LOST

EVENT_CREATED: Final = protocol.WatchEvent.CREATED
EVENT_DELETED: Final = protocol.WatchEvent.DELETED
EVENT_DATA_CHANGED: Final = protocol.WatchEvent.DATA_CHANGED
EVENT_CHILDREN_CHANGED: Final = protocol.WatchEvent.CHILDREN_CHANGED

_OPEN_ACL: Final = [protocol.UNRESTRICTED_ACCESS]

_MAX_XID: Final = 0x7FFFFFFF
_BACKOFF_FIRST: Final = 0.05
_BACKOFF_MAX: Final = 1.0
_CLOSE_TIMEOUT: Final = 2.0
_REPLY_HEADER: Final = struct.Struct("!iqi")  # xid, zxid, error code


class _Follow:
    """A read sent right behind another request on the same connection (one round trip
    for both): see :meth:`ZKTransport.create_listed`."""

    __slots__ = ("_reply", "request")

    def __init__(self, request: Any) -> None:
        self.request = request
        self._reply: asyncio.Future[Any] | None = None

    def sent(self, reply: asyncio.Future[Any]) -> None:
        self._reply = reply
        # Its outcome may never be asked for (the first request failed): never a warning.
        reply.add_done_callback(_retrieve)

    async def children(self) -> list[str] | None:
        """The listing, once the first request was answered; None if it failed."""
        reply = self._reply
        if reply is None:
            return None
        await asyncio.wait((reply,))  # its own failure or cancellation is not ours
        if reply.cancelled() or reply.exception() is not None:
            return None
        _, response = reply.result()
        return [str(name) for name in response.children]


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]
StateListener = Callable[[str, str], None]
EventListener = Callable[[int, str], None]


# ---------------------------------------------------------------------- results and errors


class NoNodeError(Exception):
    """The server answered: no node at that path."""


class NodeExistsError(Exception):
    """The server answered: the node already exists."""


class NotEmptyError(Exception):
    """The server answered: the node has children."""


class NotConnected(BackendError):
    """The request was not sent: no connection within the time allowed. Nothing happened."""


class ConnectionLoss(BackendError):
    """The request was sent but no answer came (connection lost or timed out).

    Its outcome is unknown: a create may have created the node.
    """


@dataclass(frozen=True, slots=True)
class NodeStat:
    """The parts of a znode's stat the recipe uses."""

    czxid: int
    mzxid: int
    version: int
    ephemeral_owner: int
    num_children: int


def _stat(raw: Any) -> NodeStat:
    return NodeStat(
        czxid=int(raw.created_zxid),
        mzxid=int(raw.last_modified_zxid),
        version=int(raw.version),
        ephemeral_owner=int(raw.ephemeral_owner),
        num_children=int(raw.num_children),
    )


# ---------------------------------------------------------------------- aiozk, hardened


class _CreateContainerRequest(protocol.Create2Request):  # type: ignore[misc]
    """``createContainer`` (opcode 19). aiozk sends a container as Create2 with flag 4, which
    the server stores as a plain PERSISTENT node (only this opcode makes a container)."""

    opcode = 19


class _CreateContainerResponse(protocol.Create2Response):  # type: ignore[misc]
    """Registered for opcode 19 in aiozk's reply table by its metaclass."""

    opcode = 19


_KINDS: Final[dict[type, str]] = {
    protocol.Create2Request: "create",
    _CreateContainerRequest: "create",
    protocol.GetChildren2Request: "children",
    protocol.GetChildrenRequest: "children",
    protocol.GetDataRequest: "get",
    protocol.SetDataRequest: "set",
    protocol.DeleteRequest: "delete",
    protocol.ExistsRequest: "exists",
    protocol.PingRequest: "ping",
    protocol.SyncRequest: "sync",
}
"""How :attr:`ZKTransport.answered` names requests (others by their class name)."""


class _HandshakeFailed(Exception):
    """The server closed the connection during the session handshake (it may lag behind)."""


class _StateMachine(SessionStateMachine):  # type: ignore[misc]
    """aiozk's state machine, reporting every transition and ignoring impossible ones."""

    def __init__(self, session: Any, listener: StateListener) -> None:
        super().__init__(session)
        self._listener = listener

    def transition_to(self, state: str) -> None:
        old = self.current_state
        if old == state:
            return
        if (old, state) not in self.valid_transitions:
            logger.debug("ignoring session transition %s -> %s", old, state)
            return
        super().transition_to(state)
        self._listener(old, state)


class _Connection(Connection):  # type: ignore[misc]
    """One TCP connection: bounded connect, read loop in our TaskGroup, EOF reported, the
    requests of one loop step written together, and the time it last heard from the server."""

    def __init__(self, host: str, port: int, session: _Session) -> None:
        super().__init__(
            host, port, watch_handler=session.event_dispatch, read_timeout=session.io_timeout
        )
        self._session = session
        self._outgoing: list[bytes] = []
        self.heard = 0.0  # loop time of the newest frame read (or of the session handshake)

    async def connect(self) -> None:
        timeout = self._session.io_timeout
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            self.reader, self.writer = reader, writer
            async with asyncio.timeout(timeout):
                await self._make_handshake()  # "srvr": learns the server version
        finally:
            writer.close()
        async with asyncio.timeout(timeout):
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

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
            self.writer.close()


class _Session(Session):  # type: ignore[misc]
    """aiozk's session with the repair loop, connecting and dispatching replaced."""

    # Attributes set by aiozk's Session.__init__ (untyped there).
    hosts: list[tuple[str, int | str]]
    conn: Any
    state: Any
    xid: int
    last_zxid: int | None
    session_id: int | None
    password: bytes
    timeout: float
    closing: bool
    started: bool
    repair_loop_task: asyncio.Task[None] | None

    def __init__(
        self,
        servers: str,
        timeout: float,
        *,
        io_timeout: float,
        spawn: Spawn,
        on_state: StateListener,
        on_event: EventListener,
    ) -> None:
        super().__init__(servers, timeout, None, False, io_timeout)
        self.state = _StateMachine(self, on_state)
        self.requested_timeout = timeout
        self.io_timeout = io_timeout
        self.spawn = spawn
        self._on_event = on_event
        self._failing_since: float | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.started = True
        self.repair_loop_task = self.spawn(self.repair_loop(), "aiodlock-zk-repair")
        await self.state.wait_for(States.CONNECTED)

    def set_heartbeat(self) -> None:
        """Off: the backend pings on its own schedule (see ZKTransport.ping)."""

    async def shutdown(self) -> None:
        """End the session (its ephemeral nodes vanish at once) and close; bounded."""
        if not self.started:
            return
        self.closing = True
        task = self.repair_loop_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn = self.conn
        if conn is not None and self.state == States.CONNECTED and not conn.closing:
            self.xid = 1 if self.xid >= _MAX_XID else self.xid + 1
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await conn.send(protocol.CloseRequest(), xid=self.xid)
        self.state.transition_to(States.LOST)
        if conn is not None:
            conn.discard()
        self.started = False

    # -- connecting ----------------------------------------------------------------------

    async def make_connection(self, host: str, port: int | str) -> _Connection | None:
        conn = _Connection(host, int(port), self)
        try:
            await conn.connect()
        except Exception as exc:  # refused, timed out, not serving (no version in "srvr")
            logger.debug("cannot connect to zookeeper at %s:%s: %r", host, port, exc)
            return None
        return conn

    async def find_server(self, allow_read_only: bool = False) -> None:
        delay = _BACKOFF_FIRST
        while True:
            for host, port in random.sample(self.hosts, len(self.hosts)):
                conn = await self.make_connection(host, port)
                if conn is None:
                    continue
                if conn.start_read_only:
                    conn.writer.close()
                    continue
                old, self.conn = self.conn, conn
                if old is not None:
                    old.discard()
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def establish_session(self) -> None:
        answer = await self.conn.send_connect(
            protocol.ConnectRequest(
                protocol_version=0,
                last_seen_zxid=self.last_zxid or 0,
                timeout=int(self.requested_timeout * 1000),
                session_id=self.session_id or 0,
                password=self.password,
                read_only=False,
            )
        )
        if answer is None:
            raise _HandshakeFailed
        _, response = answer
        if response.session_id == 0:  # the server says: that session has expired
            self.state.transition_to(States.LOST)
            raise zk_exc.SessionLost()
        self.session_id = response.session_id
        self.password = response.password
        self.timeout = response.timeout / 1000.0
        # aiozk set last_zxid to None here (the handshake carries no zxid): kept instead, so
        # a reconnect never lands on a server that is behind what we have already seen.

    async def repair_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closing:
            await self.state.wait_for(States.SUSPENDED, States.LOST)
            if self._shutting_down():
                return
            try:
                await self.find_server()
                async with asyncio.timeout(min(self.io_timeout, self.timeout)):
                    await self.establish_session()
            except asyncio.CancelledError:
                raise
            except zk_exc.SessionLost:
                self._abandon_session()
                continue
            except Exception as exc:  # refused, lagging server, timeout: same session, retry
                logger.debug("zookeeper session handshake failed: %r", exc)
                if self.conn is not None:
                    self.conn.discard()
                now = loop.time()
                if self._failing_since is None:
                    self._failing_since = now
                elif self.session_id and now - self._failing_since > self.timeout:
                    # No server took us back for a whole session timeout: it has expired.
                    self.state.transition_to(States.LOST)
                    self._abandon_session()
                await asyncio.sleep(_BACKOFF_FIRST)
                continue
            self._failing_since = None
            self.conn.start_read_loop()
            self.state.transition_to(States.CONNECTED)

    def _shutting_down(self) -> bool:
        return self.closing

    def _abandon_session(self) -> None:
        if self.conn is not None:
            self.conn.discard()
        self.session_id = None
        self.password = b"\x00"
        self.last_zxid = None  # a new session may start on any server
        self._failing_since = None

    def connection_broken(self, conn: _Connection) -> None:
        if conn is self.conn and not self.closing and self.state == States.CONNECTED:
            self.state.transition_to(States.SUSPENDED)

    # -- events --------------------------------------------------------------------------

    def event_dispatch(self, event: Any) -> None:
        if event.type:
            self._on_event(int(event.type), str(event.path))
        else:
            super().event_dispatch(event)

    async def set_existing_watches(self) -> None:
        """Not used: the backend re-arms its own watches after every reconnect."""


# ---------------------------------------------------------------------- the typed transport


class ZKTransport:
    """One ZooKeeper session over aiozk, with typed operations and contact tracking.

    ``contact`` is the event-loop time at which the newest *answered* request was sent: the
    server heard from the session at or after that instant, so it cannot expire the session
    before ``contact + negotiated_timeout``. The backend's grace timer is built on it.
    """

    def __init__(
        self,
        hosts: list[tuple[str, int]],
        *,
        session_timeout: float,
        io_timeout: float,
        spawn: Spawn,
        on_state: StateListener,
        on_event: EventListener,
    ) -> None:
        servers = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts)
        self._on_state = on_state
        self._session = _Session(
            servers,
            session_timeout,
            io_timeout=io_timeout,
            spawn=spawn,
            on_state=self._state_changed,
            on_event=on_event,
        )
        self._connected = asyncio.Event()
        self.contact_changed = asyncio.Event()
        self.contact = 0.0
        self.answered: collections.Counter[str] = collections.Counter()
        """Requests the server answered (an error reply included), by kind: see _KINDS."""

    # -- state ---------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return str(self._session.state.current_state)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def session_id(self) -> int | None:
        sid = self._session.session_id
        return None if sid is None else int(sid)

    @property
    def negotiated_timeout(self) -> float:
        """The session timeout the server granted (the requested one before connecting)."""
        return float(self._session.timeout)

    @property
    def server_version(self) -> tuple[int, ...] | None:
        """The version the current server reported (``srvr``), if connected."""
        conn = self._session.conn
        info = None if conn is None else conn.version_info
        return None if info is None else tuple(int(part) for part in info)

    @property
    def server(self) -> str | None:
        conn = self._session.conn
        return None if conn is None else f"{conn.host}:{conn.port}"

    def _state_changed(self, old: str, new: str) -> None:
        if new == States.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        self._on_state(old, new)

    async def wait_connected(self) -> None:
        await self._connected.wait()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, timeout: float) -> None:
        """Connect and establish a session within ``timeout`` (TimeoutError otherwise)."""
        try:
            async with asyncio.timeout(timeout):
                await self._session.start()
        except BaseException:
            await self._session.shutdown()
            raise
        self.contact = asyncio.get_running_loop().time()

    async def close(self) -> None:
        """Close the session (the server deletes its ephemeral nodes) and the connection."""
        await self._session.shutdown()

    def silence(self) -> float:
        """Seconds since the current connection last heard anything from the server (a
        reply to any request, or a watch event); 0 when there is no connection."""
        conn = self._session.conn
        if conn is None or not conn.heard:
            return 0.0
        return asyncio.get_running_loop().time() - float(conn.heard)

    def drop_connection(self) -> None:
        """Give up the current connection (silent too long); the repair loop reconnects."""
        conn = self._session.conn
        if conn is not None and not conn.closing:
            conn.discard()
            self._session.connection_broken(conn)

    # -- requests ------------------------------------------------------------------------

    async def _call(
        self,
        request: Any,
        *,
        wait: bool,
        timeout: float,
        idempotent: bool = True,
        follow: _Follow | None = None,
    ) -> Any:
        """Send ``request`` once per connection and return the reply.

        A request that is safe to repeat (a read, a delete tolerating NoNode, setData
        without version) is sent again after a reconnection, within ``timeout`` in total; a
        create never is (:class:`ConnectionLoss`: the caller looks for the node instead).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            conn = self._session.conn
            try:
                return await self._call_once(request, wait=wait, deadline=deadline, follow=follow)
            except ConnectionLoss:
                if not (idempotent and wait) or loop.time() >= deadline:
                    raise
                if self._session.conn is conn and self._connected.is_set():
                    self.drop_connection()  # failed but still "connected": reconnect

    async def _call_once(
        self, request: Any, *, wait: bool, deadline: float, follow: _Follow | None = None
    ) -> Any:
        session = self._session
        loop = asyncio.get_running_loop()
        sent: float | None = None
        sid: int | None = None
        timeout = deadline - loop.time()
        try:
            async with asyncio.timeout_at(deadline):
                if not self._connected.is_set():
                    if not wait:
                        raise NotConnected("not connected to zookeeper (connection suspended)")
                    await self._connected.wait()
                conn = session.conn
                sid = session.session_id
                session.xid = 1 if session.xid >= _MAX_XID else session.xid + 1
                sent = loop.time()
                reply = conn.send(request, xid=session.xid)
                if follow is not None:  # right behind it, on the same connection
                    session.xid = 1 if session.xid >= _MAX_XID else session.xid + 1
                    follow.sent(conn.send(follow.request, xid=session.xid))
                try:
                    zxid, response = await reply
                except zk_exc.ZKError:
                    self._count(request, follow)  # answered, with an error
                    raise
        except TimeoutError as exc:
            if sent is not None:
                raise ConnectionLoss(f"no zookeeper reply within {timeout:.3g} s") from exc
            raise NotConnected(
                f"not connected to zookeeper within {timeout:.3g} s (connection suspended)"
            ) from exc
        except zk_exc.NoNode as exc:
            self._note_contact(sent, sid)
            raise NoNodeError(request.path) from exc
        except zk_exc.NodeExists as exc:
            self._note_contact(sent, sid)
            raise NodeExistsError(request.path) from exc
        except zk_exc.NotEmpty as exc:
            self._note_contact(sent, sid)
            raise NotEmptyError(request.path) from exc
        except zk_exc.ConnectError as exc:
            raise ConnectionLoss(f"zookeeper connection lost: {exc}") from exc
        except zk_exc.ZKError as exc:
            raise BackendError(f"zookeeper error: {type(exc).__name__}: {exc}") from exc
        self._count(request, follow)
        if zxid is not None and zxid > (session.last_zxid or 0):
            session.last_zxid = zxid
        self._note_contact(sent, sid)
        return response

    def _count(self, request: Any, follow: _Follow | None) -> None:
        self.answered[_KINDS.get(type(request), type(request).__name__)] += 1
        if follow is not None:  # answered right behind it
            self.answered[_KINDS.get(type(follow.request), type(follow.request).__name__)] += 1

    def _note_contact(self, sent: float | None, sid: int | None) -> None:
        if sent is not None and sid == self._session.session_id and sent > self.contact:
            self.contact = sent
            self.contact_changed.set()

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        container: bool = False,
        timeout: float,
    ) -> tuple[str, NodeStat]:
        """Create a node (the reply carries its stat). Waits for a connection."""
        request_class = _CreateContainerRequest if container else protocol.Create2Request
        request = request_class(path=path, data=data, acl=_OPEN_ACL)
        request.set_flags(ephemeral, sequential, container)
        # A container create is idempotent (NodeExists is an answer); a sequential one never.
        response = await self._call(request, wait=True, timeout=timeout, idempotent=container)
        return str(response.path), _stat(response.stat)

    async def create_listed(
        self, path: str, data: bytes, *, directory: str | None, timeout: float
    ) -> tuple[str, NodeStat, list[str] | None]:
        """Create an ephemeral sequential node and list ``directory`` in the same round trip.

        The listing is sent right behind the create, on the same connection, and the server
        answers a session's requests in order, so it already shows the new node. It is
        ``None`` if it failed or did not come with the create's reply (the caller lists
        again), or if ``directory`` is None (nothing is listed). Sent once, like every create.
        """
        request = protocol.Create2Request(path=path, data=data, acl=_OPEN_ACL)
        request.set_flags(True, True, False)
        follow = None
        if directory is not None:
            follow = _Follow(protocol.GetChildren2Request(path=directory, watch=False))
        response = await self._call(
            request, wait=True, timeout=timeout, idempotent=False, follow=follow
        )
        listing = None if follow is None else await follow.children()
        return str(response.path), _stat(response.stat), listing

    async def children(
        self, path: str, *, watch: bool = False, wait: bool = True, timeout: float
    ) -> list[str]:
        """The names of ``path``'s children; ``watch`` arms a children watch."""
        request = protocol.GetChildren2Request(path=path, watch=watch)
        response = await self._call(request, wait=wait, timeout=timeout)
        return [str(name) for name in response.children]

    async def get(
        self, path: str, *, watch: bool = False, wait: bool = True, timeout: float
    ) -> tuple[bytes, NodeStat]:
        """Data and stat; ``watch`` arms a data watch (none is left if the node is absent)."""
        request = protocol.GetDataRequest(path=path, watch=watch)
        response = await self._call(request, wait=wait, timeout=timeout)
        return bytes(response.data or b""), _stat(response.stat)

    async def set(self, path: str, data: bytes, *, version: int = -1, timeout: float) -> NodeStat:
        request = protocol.SetDataRequest(path=path, data=data, version=version)
        response = await self._call(request, wait=True, timeout=timeout)
        return _stat(response.stat)

    async def delete(
        self, path: str, *, version: int = -1, wait: bool = True, timeout: float
    ) -> None:
        request = protocol.DeleteRequest(path=path, version=version)
        await self._call(request, wait=wait, timeout=timeout)

    async def sync(self, path: str, *, timeout: float) -> None:
        """ZooKeeper's ``sync``: the connected server catches up with the leader, so a read
        sent after it sees every write committed before it, whichever session made it (a
        follower may otherwise answer from a state a little behind)."""
        await self._call(protocol.SyncRequest(path=path), wait=True, timeout=timeout)

    async def ping(self, *, timeout: float) -> None:
        """One round trip on the current connection; never waits for a reconnection."""
        await self._call(protocol.PingRequest(), wait=False, timeout=timeout)
