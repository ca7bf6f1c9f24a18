"""One ZooKeeper session for the backend: typed requests, sent once per connection.

A request is written once per connection: a create whose connection fails is
:class:`ConnectionLoss` (outcome unknown: the recipe looks for its node by uuid), never
resent behind the caller's back; reads and deletes are sent again once reconnected, within
their timeout. ``contact`` (the send time of the newest answered request) and ``silence()``
are the bases of the backend's grace timer and liveness check (docs/zookeeper.md). Every
node is created with the ACL given (``acl``); credentials (``credentials``) are sent on every
connection before anything else (:mod:`._session`), and a request an ACL refuses is a
:class:`NoAuthError` naming the identity refused, never its password.

Example::

    transport = ZKTransport(hosts, session_timeout=10, io_timeout=5, spawn=spawn,
                            on_state=on_state, on_event=on_event)
    await transport.start(5.0)
    names = await transport.children("/apps/shop", timeout=10)
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from typing import Any, Final

from aiozk import exc as zk_exc, protocol
from aiozk.protocol.acl import ACL, ID
from aiozk.states import States

from .. import BackendError, retrieve
from ._auth import AclEntry, Credentials, default_acl
from ._errors import (
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NodeStat,
    NoNodeError,
    NotConnected,
    NotEmptyError,
    node_stat,
)
from ._session import MAX_XID, EventListener, Spawn, StateListener, ZKSession

__all__ = ["ZKTransport"]


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
        reply.add_done_callback(retrieve)

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
    protocol.GetACLRequest: "acl",
}
"""How :attr:`ZKTransport.answered` names requests (others by their class name)."""


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
        credentials: Credentials | None = None,
        acl: tuple[AclEntry, ...] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        servers = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts)
        self._on_state = on_state
        self._credentials = credentials
        self._acl = [
            ACL(perms=entry.perms, id=ID(scheme=entry.scheme, id=entry.id))
            for entry in (default_acl(credentials) if acl is None else acl)
        ]
        self._session = ZKSession(
            servers,
            session_timeout,
            io_timeout=io_timeout,
            spawn=spawn,
            on_state=self._state_changed,
            on_event=on_event,
            auth=() if credentials is None else [("digest", credentials.auth)],
            tls=tls,
        )
        self._connected = asyncio.Event()
        # Set while connected, and for good once the server refused our credentials: what
        # a request waits on, so none waits out its timeout for a session that cannot come.
        self._settled = asyncio.Event()
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
    def connect_failure(self) -> str | None:
        """Why the newest connection attempt failed (a ConnectFailed says it in words)."""
        failure = self._session.connect_failure
        return None if failure is None else str(failure) or type(failure).__name__

    @property
    def server(self) -> str | None:
        conn = self._session.conn
        return None if conn is None else f"{conn.host}:{conn.port}"

    def _state_changed(self, old: str, new: str) -> None:
        if new == States.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if new == States.CONNECTED or self._session.refused is not None:
            self._settled.set()
        else:
            self._settled.clear()
        self._on_state(old, new)

    async def wait_connected(self) -> None:
        """Wait for the connection; AuthFailedError if the server refused our credentials."""
        await self._settled.wait()
        if self._session.refused is not None:
            raise self._session.refused

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
                if self._session.refused is not None:
                    raise self._session.refused
                if not self._connected.is_set():
                    if not wait:
                        raise NotConnected("not connected to zookeeper (connection suspended)")
                    await self.wait_connected()
                conn = session.conn
                sid = session.session_id
                session.xid = 1 if session.xid >= MAX_XID else session.xid + 1
                sent = loop.time()
                reply = conn.send(request, xid=session.xid)
                if follow is not None:  # right behind it, on the same connection
                    session.xid = 1 if session.xid >= MAX_XID else session.xid + 1
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
        except zk_exc.NoAuth as exc:
            self._note_contact(sent, sid)
            raise self._no_auth(request) from exc
        except zk_exc.ConnectError as exc:
            raise ConnectionLoss(f"zookeeper connection lost: {exc}") from exc
        except zk_exc.ZKError as exc:
            raise BackendError(f"zookeeper error: {type(exc).__name__}: {exc}") from exc
        self._count(request, follow)
        if zxid is not None and zxid > (session.last_zxid or 0):
            session.last_zxid = zxid
        self._note_contact(sent, sid)
        return response

    def _no_auth(self, request: Any) -> NoAuthError:
        kind = _KINDS.get(type(request), type(request).__name__)
        who = "an unauthenticated client"
        hint = "give the credentials of an identity it lets in"
        if self._credentials is not None:
            who = self._credentials.describe()
            hint = "a wrong password, or nodes of another identity"
        return NoAuthError(
            f"zookeeper refused {kind} on {request.path} (NoAuth): its ACL does not let "
            f"{who} do that ({hint})"
        )

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
        request = request_class(path=path, data=data, acl=self._acl)
        request.set_flags(ephemeral, sequential, container)
        # A container create is idempotent (NodeExists is an answer); a sequential one never.
        response = await self._call(request, wait=True, timeout=timeout, idempotent=container)
        return str(response.path), node_stat(response.stat)

    async def create_listed(
        self, path: str, data: bytes, *, directory: str | None, timeout: float
    ) -> tuple[str, NodeStat, list[str] | None]:
        """Create an ephemeral sequential node and list ``directory`` in the same round trip.

        The listing is sent right behind the create, on the same connection, and the server
        answers a session's requests in order, so it already shows the new node. It is
        ``None`` if it failed or did not come with the create's reply (the caller lists
        again), or if ``directory`` is None (nothing is listed). Sent once, like every create.
        """
        request = protocol.Create2Request(path=path, data=data, acl=self._acl)
        request.set_flags(True, True, False)
        follow = None
        if directory is not None:
            follow = _Follow(protocol.GetChildren2Request(path=directory, watch=False))
        response = await self._call(
            request, wait=True, timeout=timeout, idempotent=False, follow=follow
        )
        listing = None if follow is None else await follow.children()
        return str(response.path), node_stat(response.stat), listing

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
        return bytes(response.data or b""), node_stat(response.stat)

    async def get_acl(self, path: str, *, timeout: float) -> list[AclEntry]:
        """The ACL of ``path``, as the server shows it to us (digest hashes read ``x``
        without ADMIN on the node)."""
        response = await self._call(protocol.GetACLRequest(path=path), wait=True, timeout=timeout)
        return [AclEntry(str(a.id.scheme), str(a.id.id), int(a.perms)) for a in response.acl]

    async def set(self, path: str, data: bytes, *, version: int = -1, timeout: float) -> NodeStat:
        request = protocol.SetDataRequest(path=path, data=data, version=version)
        response = await self._call(request, wait=True, timeout=timeout)
        return node_stat(response.stat)

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
