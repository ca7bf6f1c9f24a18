"""The etcd backend's connection: aetcd's gRPC stubs over a channel that moves between members.

One channel to the *current* member, a deadline on every call, and a move to the next member
when a call finds the current one down or silent (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``);
every request the backend sends is idempotent, so it is sent again there. Every gRPC error
leaves as :class:`~aiodlock.BackendError` (chained), never showing the password. Why not
aetcd's ``Client``: docs/etcd.md, "Members".

Example::

    conn = EtcdConnection(["127.0.0.1:2379"], request_timeout=5, spawn=tasks.try_spawn)
    await conn.open(connect_timeout=5)
    reply = await conn.range(b"/locks/", prefix=True)
    await conn.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

import grpc
from aetcd import rpc

from .. import BackendError

__all__ = ["EtcdConnection", "WatchChannel", "WatchStream", "prefix_end"]

logger = logging.getLogger("aiodlock.etcd")

# A member that is down, paused or cut off: try the next one.
_MOVE_ON: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_AUTH_EXPIRED: Final = ("invalid auth token", "auth token")
_MAX_MESSAGE: Final = 64 * 1024 * 1024
# The first bound of one connect try: a live member on a loaded host answers a fresh channel's
# first read well within it; a hung one is left after it for the next.
_FIRST_TRY: Final = 0.5


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


class EtcdConnection:
    """One gRPC channel to one member at a time, moving on when that member fails us."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        request_timeout: float,
        credentials: grpc.ChannelCredentials | None = None,
        username: str | None = None,
        password: str | None = None,
        describe: str = "etcd",
        on_move: Callable[[], None] | None = None,
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None] | None],
    ) -> None:
        self._endpoints, self._index = list(endpoints), 0  # the member in use: its index
        self._request_timeout, self._credentials = request_timeout, credentials
        self._username, self._password, self._describe = username, password, describe
        self._on_move = on_move
        self._spawn = spawn  # the backend's tasks (None once they are closed)
        self._channel: Any = None
        self._kv: Any = None
        self._lease: Any = None
        self._watch: Any = None
        self._metadata: tuple[tuple[str, str], ...] | None = None
        self._old: set[asyncio.Task[None]] = set()
        self._unclosed: list[Any] = []  # channels left by a move once no task could close them
        self.moves = 0
        self.closed = False

    @property
    def _several(self) -> bool:
        # With one member there is nowhere to move: gRPC reconnects the channel by itself.
        return len(self._endpoints) > 1

    @property
    def endpoint(self) -> str:
        """The member in use now."""
        return self._endpoints[self._index]

    # ------------------------------------------------------------------ lifetime

    async def open(self, connect_timeout: float) -> None:
        """Find a member that answers, trying each in turn, within ``connect_timeout``.

        Each try is bounded by a short share of it (:data:`_FIRST_TRY` at most), so a
        member that accepts connections but never answers (SIGSTOPped, a hung host) costs
        that share, not the whole ``connect_timeout``; the share doubles with each round
        over the members, so slow but live ones get their chance."""
        errors: list[str] = []
        share = min(connect_timeout / len(self._endpoints), _FIRST_TRY)
        try:
            async with asyncio.timeout(connect_timeout):
                while True:
                    for _ in range(len(self._endpoints)):
                        self._connect()
                        try:
                            await self._authenticate(share)
                            await self._kv.Range(
                                rpc.RangeRequest(key=b"\0", limit=1, keys_only=True),
                                timeout=share,
                                metadata=self._metadata,
                            )
                            return
                        except grpc.aio.AioRpcError as exc:
                            if exc.code() not in _MOVE_ON:
                                raise self._error(exc, "connecting") from exc
                            errors.append(f"{self.endpoint}: {exc.code().name}")
                            self._next()
                    share *= 2
                    await asyncio.sleep(0.1)
        except TimeoutError:
            await self.close()
            tried = "; ".join(dict.fromkeys(errors)) or "no answer"
            raise BackendError(
                f"could not connect to {self._describe} within {connect_timeout:g} s "
                f"(connect_timeout): {tried}"
            ) from None
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the channel (and any left behind by a move). Idempotent."""
        self.closed = True
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close(grace=None)
        for task in list(self._old):
            with contextlib.suppress(BaseException):
                await task
        while self._unclosed:
            await _close_channel(self._unclosed.pop())

    def _connect(self) -> None:
        target = self.endpoint
        options = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            # Find a dead peer on an idle channel too (a paused member keeps its socket); not
            # more often than etcd allows (--grpc-keepalive-min-time, 5 s by default), or it
            # closes the connection ("too many pings").
            ("grpc.keepalive_time_ms", 10000),
            ("grpc.keepalive_timeout_ms", 5000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.enable_retries", 0),
        ]
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(target, self._credentials, options=options)
        else:
            channel = grpc.aio.insecure_channel(target, options=options)
        self._channel = channel
        self._kv = rpc.KVStub(channel)
        self._lease = rpc.LeaseStub(channel)
        self._watch = rpc.WatchStub(channel)

    def _next(self) -> None:
        """Drop the current channel (closed in the background) and open one to the next
        member."""
        old = self._channel
        self._index = (self._index + 1) % len(self._endpoints)
        self.moves += 1
        if old is not None:
            # Calls still on their way there get a moment to finish before it closes.
            task = self._spawn(_close_channel(old, 1.0), "aiodlock-etcd-channel-closer")
            if task is None:
                self._unclosed.append(old)
            else:
                self._old.add(task)
                task.add_done_callback(self._old.discard)
        if not self.closed:
            self._connect()
            if self._on_move is not None:
                self._on_move()  # watches on the old channel will not fire: re-check all

    async def _authenticate(self, timeout: float) -> None:
        if self._username is None:
            return
        stub = rpc.AuthStub(self._channel)
        reply = await stub.Authenticate(
            rpc.AuthenticateRequest(name=self._username, password=self._password or ""),
            timeout=timeout,
        )
        self._metadata = (("token", reply.token),)

    def _error(self, exc: grpc.aio.AioRpcError, what: str) -> BackendError:
        details = exc.details() or ""
        if self._password:
            details = details.replace(self._password, "***")
        return BackendError(
            f"{self._describe}: {what} failed on {self.endpoint}: {exc.code().name} {details}"
        )

    # ------------------------------------------------------------------ calls

    async def call(self, stub: str, method: str, request: Any, timeout: float | None = None) -> Any:
        """Send one idempotent unary request, moving to the next member (and sending it
        again) while members fail us, until ``timeout`` (default: the request timeout)."""
        if self.closed or self._channel is None:
            raise BackendError(f"{self._describe} connection is closed")
        budget = self._request_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        # Each try gets a share of the budget, so a silent member leaves time for the others.
        share = max(budget / max(len(self._endpoints), 1), min(budget, 0.25))
        reauthenticated = False
        while True:
            channel = self._channel
            if channel is None:
                raise BackendError(f"{self._describe} connection is closed")
            left = deadline - loop.time()
            if left <= 0:
                raise BackendError(
                    f"{self._describe}: {method} got no answer within {budget:g} s "
                    f"(last tried {self.endpoint})"
                )
            try:
                return await getattr(getattr(self, stub), method)(
                    request, timeout=min(left, share), metadata=self._metadata
                )
            except asyncio.CancelledError:
                if not _rpc_cancelled():
                    raise  # our caller is being cancelled
                # gRPC cancelled the call itself: its channel was closed by a move. Send it
                # again on the current one (a CancelledError must never reach the caller,
                # whose task would look cancelled from outside).
                if self._channel is channel and not self.closed:
                    raise BackendError(f"{self._describe}: {method} was cancelled") from None
                continue
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.CANCELLED and self._channel is not channel:
                    continue  # its channel was left behind by a move: send it again
                if code in _MOVE_ON:
                    if self._channel is channel and not self.closed and self._several:
                        logger.info(
                            "etcd member %s: %s, moving to the next member",
                            self.endpoint,
                            code.name,
                        )
                        self._next()
                    continue
                if (
                    code == grpc.StatusCode.UNAUTHENTICATED
                    and not reauthenticated
                    and self._username is not None
                    and any(s in (exc.details() or "") for s in _AUTH_EXPIRED)
                ):
                    reauthenticated = True
                    try:
                        await self._authenticate(max(left, 0.1))
                    except grpc.aio.AioRpcError as again:
                        raise self._error(again, "authentication") from again
                    continue
                raise self._error(exc, method) from exc

    async def txn(self, request: Any) -> Any:
        return await self.call("_kv", "Txn", request)

    async def range(self, key: bytes, *, prefix: bool = False, **fields: Any) -> Any:
        end = prefix_end(key) if prefix else b""
        return await self.call("_kv", "Range", rpc.RangeRequest(key=key, range_end=end, **fields))

    async def delete(self, key: bytes, *, prefix: bool = False) -> Any:
        end = prefix_end(key) if prefix else b""
        return await self.call("_kv", "DeleteRange", rpc.DeleteRangeRequest(key=key, range_end=end))

    async def put(self, key: bytes, value: bytes, *, lease: int) -> Any:
        # Idempotent: sent again, it writes the same value on the same lease.
        return await self.call("_kv", "Put", rpc.PutRequest(key=key, value=value, lease=lease))

    async def grant(self, ttl: int) -> Any:
        # Not idempotent: a grant whose reply is lost leaves a lease nobody keeps alive,
        # which expires after its ttl (with no key on it).
        return await self.call("_lease", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl))

    async def revoke(self, lease_id: int, timeout: float | None = None) -> None:
        try:
            await self.call("_lease", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id), timeout)
        except BackendError as exc:
            if "not found" not in str(exc):
                raise

    async def time_to_live(self, lease_id: int) -> Any:
        return await self.call("_lease", "LeaseTimeToLive", rpc.LeaseTimeToLiveRequest(ID=lease_id))

    async def keep_alive(self, lease_id: int, timeout: float) -> int:
        """One keep-alive; the lease's TTL left as the cluster granted it (0: it is gone)."""
        reply = await self.call(
            "_lease_once", "__call__", rpc.LeaseKeepAliveRequest(ID=lease_id), timeout
        )
        return int(reply.TTL)

    @property
    def _lease_once(self) -> _KeepAliveOnce:
        return _KeepAliveOnce(self._lease)

    # ------------------------------------------------------------------ watches

    async def watch(self, key: bytes, *, start_revision: int, prefix: bool = False) -> WatchStream:
        """Open a stream watching deletions of ``key`` (or of every key under it) from
        ``start_revision`` on; returns once the server confirmed the watch."""
        if self.closed or self._channel is None:
            raise BackendError(f"{self._describe} connection is closed")
        # "hasleader": the member ends the watch when it loses its leader (a member cut off
        # from the quorum would otherwise keep it open and silent), as etcd's own client does.
        call = self._watch.Watch(metadata=(*(self._metadata or ()), ("hasleader", "true")))
        stream = WatchStream(call)
        try:
            async with asyncio.timeout(self._request_timeout):
                await call.write(
                    rpc.WatchRequest(
                        create_request=rpc.WatchCreateRequest(
                            key=key,
                            range_end=prefix_end(key) if prefix else b"",
                            start_revision=start_revision,
                            filters=[rpc.WatchCreateRequest.FilterType.NOPUT],
                        )
                    )
                )
                while True:
                    reply = await call.read()
                    if reply is grpc.aio.EOF:
                        raise BackendError(f"{self._describe}: the watch stream ended")
                    if reply.created or reply.canceled or reply.events:
                        break
            if reply.canceled or reply.compact_revision:
                stream.done = True  # compacted past our revision: re-check at once
            elif reply.events:
                stream.done = True
                stream.deleted = [event.kv.key for event in reply.events]
                stream.revision = max(event.kv.mod_revision for event in reply.events)
            elif not prefix and reply.header.revision >= start_revision:
                # Writes happened since ``start_revision``: etcd replays them to this watch
                # from its background sync, every 100 ms. Is the key gone already? One read
                # answers at once.
                found = await self.call(
                    "_kv", "Range", rpc.RangeRequest(key=key, count_only=True, serializable=True)
                )
                if found.count == 0 and found.header.revision >= start_revision:
                    stream.done = True
                    stream.deleted = [key]
                    stream.revision = found.header.revision
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            if exc.code() in _MOVE_ON and self._several and self._channel is not None:
                self._next()
            raise self._error(exc, "Watch") from exc
        except asyncio.CancelledError:
            call.cancel()
            if not _rpc_cancelled():
                raise
            raise BackendError(f"{self._describe}: a watch was cancelled") from None
        except TimeoutError:
            call.cancel()
            if self._several and self._channel is not None:
                self._next()
            raise BackendError(
                f"{self._describe}: a watch was not confirmed within "
                f"{self._request_timeout:g} s on {self.endpoint}"
            ) from None
        except BaseException:
            call.cancel()
            raise
        return stream

    def open_watch(self) -> WatchChannel:
        """A watch stream on the current member for many watches at once (see
        :class:`WatchChannel`); it ends when the member fails, loses its leader or is left."""
        if self.closed or self._channel is None:
            raise BackendError(f"{self._describe} connection is closed")
        return WatchChannel(
            self._watch.Watch(metadata=(*(self._metadata or ()), ("hasleader", "true")))
        )


class WatchChannel:
    """One Watch stream shared by many watches: requests written in order (one write at a
    time), replies read in order. An ended stream reads ``None`` and refuses writes (False):
    whoever owns it opens another."""

    __slots__ = ("_call",)

    def __init__(self, call: Any) -> None:
        self._call = call

    async def write(self, request: Any) -> bool:
        try:
            await self._call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return False
        except asyncio.CancelledError:
            if not _rpc_cancelled():
                raise
            return False  # its channel was closed
        return True

    async def read(self) -> Any | None:
        try:
            reply = await self._call.read()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return None
        except asyncio.CancelledError:
            if not _rpc_cancelled():
                raise
            return None  # its channel was closed
        return None if reply is grpc.aio.EOF else reply

    def cancel(self) -> None:
        self._call.cancel()


class _KeepAliveOnce:
    """A one-message LeaseKeepAlive exchange, shaped like a unary call for ``call()``."""

    __slots__ = ("_stub",)

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    async def __call__(self, request: Any, *, timeout: float, metadata: Any) -> Any:
        call = self._stub.LeaseKeepAlive(timeout=timeout, metadata=metadata)
        try:
            await call.write(request)
            reply = await call.read()
            if reply is grpc.aio.EOF:
                raise BackendError("etcd closed the keep-alive stream")
            return reply
        finally:
            call.cancel()


class WatchStream:
    """An open watch: :meth:`wait` waits for deletions (or the stream's end)."""

    __slots__ = ("_call", "deleted", "done", "revision")

    def __init__(self, call: Any) -> None:
        self._call = call
        self.done = False
        self.deleted: list[bytes] | None = None
        self.revision = 0  # of the newest deletion reported

    async def wait(self) -> list[bytes] | None:
        """Return at the first deletion events (the keys deleted), or ``None`` when the
        stream ended, was cancelled or its revision compacted: all of them mean "check
        again", but only deletions say what changed."""
        if self.done:
            return self.deleted
        try:
            while True:
                reply = await self._call.read()
                if reply is grpc.aio.EOF or reply.canceled or reply.compact_revision:
                    break
                if reply.events:
                    self.deleted = [event.kv.key for event in reply.events]
                    self.revision = max(event.kv.mod_revision for event in reply.events)
                    break
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass
        except asyncio.CancelledError:
            if not _rpc_cancelled():
                raise
            # gRPC ended the stream (its channel closed): that is an end, not our cancellation
        self.done = True
        return self.deleted

    def cancel(self) -> None:
        self._call.cancel()


def _rpc_cancelled() -> bool:
    """A CancelledError just caught came from gRPC cancelling the call (its channel closed),
    not from a cancellation of the task itself."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


async def _close_channel(channel: Any, grace: float | None = None) -> None:
    with contextlib.suppress(Exception):
        await channel.close(grace=grace)
