"""aiozk's ZooKeeper session with its repair loop, connecting and event dispatch replaced.

The session is kept unless the server says it has expired (or no server takes it back for a
whole session timeout); the repair loop reconnects at once, with a backoff capped at one
second, and never dies but of a refusal of our credentials; the last zxid seen is kept across
reconnections; aiozk's heartbeat and ``SetWatches`` are off (the backend pings and re-arms its
own watches); every task runs through the ``spawn`` it is given (docs/zookeeper.md, "How it
is built").

Credentials (``auth``: ``(scheme, payload)`` pairs) are sent on every connection right after
the session handshake, the first and every reconnection, and the session is CONNECTED only
once the server has accepted them: no request of ours can reach the server before them
(every request waits for CONNECTED). An AUTH_FAILED answer (the server then closes the
connection) ends the repair loop for good, with :attr:`ZKSession.refused` saying why: trying
again would be refused again.

Example::

    session = ZKSession("h1:2181,h2:2181", 10.0, io_timeout=5.0, spawn=spawn,
                        on_state=on_state, on_event=on_event)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from aiozk import exc as zk_exc, protocol
from aiozk.session import Session
from aiozk.states import SessionStateMachine, States

from ._connection import ConnectFailed, ZKConnection
from ._errors import AuthFailedError, ConnectRefusedError

__all__ = [
    "CONNECTED",
    "EVENT_DELETED",
    "LOST",
    "MAX_XID",
    "SUSPENDED",
    "EventListener",
    "Spawn",
    "StateListener",
    "ZKSession",
]

logger = logging.getLogger("aiodlock.zookeeper")

CONNECTED: Final = States.CONNECTED
SUSPENDED: Final = States.SUSPENDED
LOST: Final = States.LOST
EVENT_DELETED: Final = protocol.WatchEvent.DELETED

MAX_XID: Final = 0x7FFFFFFF
_BACKOFF_FIRST: Final = 0.05
_BACKOFF_MAX: Final = 1.0
_MIN_ENDPOINT_TIMEOUT: Final = 0.5
"""The shortest bound on one endpoint's connect (see ZKSession.endpoint_timeout)."""
_CLOSE_TIMEOUT: Final = 2.0

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]
StateListener = Callable[[str, str], None]
EventListener = Callable[[int, str], None]


async def _first_connected(
    attempts: list[asyncio.Task[ZKConnection | None]], within: float | None
) -> ZKConnection | None:
    """The connection of the first of ``attempts`` to connect, waiting ``within`` seconds
    (``None``: until one connects or all have failed); ``None`` when none has -- every one
    failed, or the time is up with some still trying."""
    deadline = None if within is None else asyncio.get_running_loop().time() + within
    while True:
        for task in attempts:
            if task.done() and not task.cancelled() and task.result() is not None:
                return task.result()
        running = [task for task in attempts if not task.done()]
        left = None if deadline is None else deadline - asyncio.get_running_loop().time()
        if not running or (left is not None and left <= 0):
            return None
        await asyncio.wait(running, timeout=left, return_when=asyncio.FIRST_COMPLETED)


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


class ZKSession(Session):  # type: ignore[misc]
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
        auth: Sequence[tuple[str, bytes]] = (),
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(servers, timeout, None, False, io_timeout)
        self._auth = tuple(auth)
        # Set once trying again is pointless: our credentials refused, or (first connect) every
        # endpoint refusing us for a reason retrying cannot cure.
        self.refused: AuthFailedError | ConnectRefusedError | None = None
        self.tls = tls
        self.connect_failure: Exception | None = None  # why the newest endpoint refused us
        self.state = _StateMachine(self, on_state)
        self.requested_timeout = timeout
        self.io_timeout = io_timeout
        self.spawn = spawn
        self._on_event = on_event
        self._failing_since: float | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.started = True
        repairing = self.repair_loop_task = self.spawn(self.repair_loop(), "aiodlock-zk-repair")
        connected = self.state.wait_for(States.CONNECTED)
        try:
            # The repair loop ends early only when trying again is pointless (``refused``).
            await asyncio.wait((connected, repairing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            connected.cancel()
        if self.refused is not None:
            raise self.refused
        if repairing.done():  # cannot happen but by a bug: say so rather than hang
            raise RuntimeError("the zookeeper repair loop ended before connecting")

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
            self.xid = 1 if self.xid >= MAX_XID else self.xid + 1
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await conn.send(protocol.CloseRequest(), xid=self.xid)
        self.state.transition_to(States.LOST)
        if conn is not None:
            conn.discard()
        self.started = False

    # -- connecting ----------------------------------------------------------------------

    @property
    def endpoint_timeout(self) -> float:
        """How long one endpoint has the floor before the next one is tried too:
        ``io_timeout`` shared among the endpoints (at least half a second), so that a hung
        member (SIGSTOPped, black-holed: TCP accepted, nothing answered) leaves time for the
        others within one ``connect_timeout``."""
        return min(self.io_timeout, max(self.io_timeout / len(self.hosts), _MIN_ENDPOINT_TIMEOUT))

    async def make_connection(self, host: str, port: int | str) -> ZKConnection | None:
        """One endpoint, within ``io_timeout`` per step; None if it cannot serve us (refused,
        timed out, not serving, read-only), the reason kept in ``connect_failure``."""
        conn = ZKConnection(host, int(port), self, tls=self.tls)
        try:
            await conn.connect(self.io_timeout)
        except Exception as exc:  # refused, timed out, not serving (no version in "srvr")
            logger.debug("cannot connect to zookeeper at %s:%s: %r", host, port, exc)
            self.connect_failure = exc
            return None
        if conn.start_read_only:
            conn.discard()
            self.connect_failure = ConnectFailed(f"{host}:{port} serves read-only")
            return None
        return conn

    async def find_server(self, allow_read_only: bool = False) -> None:
        delay = _BACKOFF_FIRST
        # The endpoint we just left (silent, or gone) is tried last.
        left = None if self.conn is None else (self.conn.host, int(self.conn.port))
        while True:
            order = random.sample(self.hosts, len(self.hosts))
            order.sort(key=lambda endpoint: (endpoint[0], int(endpoint[1])) == left)
            conn, certain = await self._first_answering(order)
            if conn is not None:
                old, self.conn = self.conn, conn
                if old is not None:
                    old.discard()
                return
            if certain == len(order) and not self.session_id:
                failure = self.connect_failure
                raise ConnectRefusedError(str(failure)) from failure
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _first_answering(
        self, order: list[tuple[str, int | str]]
    ) -> tuple[ZKConnection | None, int]:
        """The first endpoint of ``order`` to connect, tried in turn, staggered as Happy
        Eyeballs (RFC 8305) staggers addresses: each endpoint has the floor for
        :attr:`endpoint_timeout`, then the next one is tried *beside* it -- a slow member
        (a loaded machine) is not given up, it may still answer first, while a hung one
        costs only its share. A failure starts the next one at once. Returns the winner
        (the others are cancelled, or closed if they connected too) and how many endpoints
        refused for a reason retrying cannot cure."""
        share = self.endpoint_timeout
        failures: list[Exception | None] = []

        async def attempt(host: str, port: int | str) -> ZKConnection | None:
            conn = await self.make_connection(host, port)
            if conn is None:  # connect_failure is this attempt's: no await in between
                failures.append(self.connect_failure)
            return conn

        attempts: list[asyncio.Task[ZKConnection | None]] = []
        winner: ZKConnection | None = None
        chosen = False
        try:
            async with asyncio.TaskGroup() as group:
                for i, (host, port) in enumerate(order):
                    attempts.append(group.create_task(attempt(host, port)))
                    last = i == len(order) - 1
                    winner = await _first_connected(attempts, None if last else share)
                    if winner is not None:
                        break
                for task in attempts:
                    task.cancel()  # the losers still connecting (a done task ignores this)
            chosen = True
        finally:
            # The others that connected too -- and, if we are cancelled, every one: nobody
            # else would close them (they would be left to the garbage collector).
            for task in attempts:
                done = task.done() and not task.cancelled() and task.exception() is None
                conn = task.result() if done else None
                if conn is not None and (conn is not winner or not chosen):
                    conn.discard()
        certain = sum(isinstance(f, ConnectFailed) and f.certain for f in failures)
        return winner, certain

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
                    self.conn.start_read_loop()
                    await self._authenticate()
            except asyncio.CancelledError:
                raise
            except zk_exc.AuthFailed:
                self._refuse()
                return
            except ConnectRefusedError as exc:  # the first connect: said at once by start()
                self.refused = exc
                return
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
            self.state.transition_to(States.CONNECTED)

    async def _authenticate(self) -> None:
        """Send our credentials on the new connection; AuthFailed if the server refuses.

        The session's requests wait for CONNECTED, which comes after this: the server sees
        the credentials before anything else of the session (it answers in order anyway)."""
        for scheme, payload in self._auth:
            await self.conn.send(protocol.AuthRequest(type=0, scheme=scheme, auth=payload))

    def _refuse(self) -> None:
        """The server refused our credentials: the session is over, and so is trying."""
        schemes = ", ".join(sorted({scheme for scheme, _ in self._auth}))
        self.refused = AuthFailedError(
            f"zookeeper refused the {schemes} credentials (AUTH_FAILED) and closed the session"
        )
        logger.error("%s", self.refused)
        if self.conn is not None:
            self.conn.discard()
        self.state.transition_to(States.LOST)

    def _shutting_down(self) -> bool:
        return self.closing

    def _abandon_session(self) -> None:
        if self.conn is not None:
            self.conn.discard()
        self.session_id = None
        self.password = b"\x00"
        self.last_zxid = None  # a new session may start on any server
        self._failing_since = None

    def connection_broken(self, conn: ZKConnection) -> None:
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
