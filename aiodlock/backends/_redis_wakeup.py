"""How waiters of the Redis backend are woken without polling.

A waiting acquisition follows the protocol's *subscribe, then re-check* rule: it first arms a
wakeup, then tries the lock again, then waits. A release that lands between the failed attempt
and the arming is therefore seen by the re-check, and one that lands after the arming is
delivered to the armed wakeup. Arming only counts once the server has it: a SUBSCRIBE that is
merely *sent* is not live yet (redisson#1763 is exactly that race). Every wait is also capped
by the caller (the holder's remaining lease), so even a lost message costs a bounded delay,
never a hang.

Two mechanisms, chosen by the backend's ``wakeup`` option:

``pubsub`` (default) -- :class:`PubSubHub`
    ONE dedicated connection per backend carries every subscription of the process. An
    in-process registry maps each channel to its local waiters; SUBSCRIBE/UNSUBSCRIBE are
    ref-counted (sent when the first waiter arrives / the last one leaves) and batched by a
    writer task, and one reader task routes messages. Entering a waiter returns once the
    server has confirmed the channel's SUBSCRIBE (at once if it already had). Payload ``1``
    wakes the longest-waiting local waiter of the channel, ``*`` wakes them all, anything else
    is an owner id and wakes that (fair-queue) waiter only. Wakeups are *banked*: the router
    sets a flag that the next ``wait()`` consumes, so a message that arrives while the waiter
    is busy re-checking is not lost (redisson#5761). After the connection drops and comes
    back, every channel is re-subscribed and all its waiters are woken to re-check, because
    releases published while we were away are gone for good.

    1000 waiters on one or many locks cost exactly one connection; leaving (also by
    cancellation) is synchronous bookkeeping, so nothing stays subscribed.

    The connection is driven directly rather than through redis-py's ``PubSub``: its
    ``subscribe()`` only *sends* SUBSCRIBE (the confirmation is a message some reader has to
    pick up), it re-subscribes silently inside a read after a reconnect (so nobody learns
    that messages were lost), and its reads and writes share one lock-free connection object
    between tasks. Here one writer task owns every write, one reader task every read.

``blpop`` -- :class:`BlockingSignals`
    Each ``wait()`` blocks in ``BLPOP <signal list> <timeout>`` on a connection of its own:
    one connection per concurrently waiting acquisition, which is the price of this mode
    (use it where pub/sub is unavailable or filtered). Arming registers the owner in the
    list's waiter registry (a ZSET); releases LPUSH a token only while that registry exists,
    so a release with nobody waiting writes nothing, and a release that happens before the
    BLPOP is kept in the list (level-triggered by construction). The last waiter to leave
    deletes the registry and any unused token. There is no broadcast: readers wake in a
    chain (each reader let in after a wakeup passes one token on, see ``READ_ACQUIRE``), and
    each fair waiter blocks on its own list.

In both modes a waiter that consumed a single-waiter wakeup and then leaves with an exception
(cancelled or timed out before its re-check could use it) hands the wakeup on, so one
cancellation cannot strand the other waiters until their caps run out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError, RedisError, ResponseError

from .._exceptions import BackendError
from ._redis_scripts import WAIT_SLICE_MS, WAITERS_TTL_MS

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

__all__ = ["BlockingSignals", "BlpopWaiter", "PubSubHub", "PubSubWaiter", "SignalCommands"]

_log = logging.getLogger("aiodlock.redis")

_ONE: Final = b"1"
_ALL: Final = b"*"

# Channel states on the server, as far as our one connection knows.
_ABSENT: Final = 0
_SUBSCRIBING: Final = 1
_SUBSCRIBED: Final = 2
_UNSUBSCRIBING: Final = 3

_PING_INTERVAL: Final = 15.0
"""An idle pub/sub connection is PINGed this often; no reply within another interval means it
is dead (a silent partition would otherwise leave every waiter on its cap)."""
_MIN_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 2.0


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _sleep_on(fut: asyncio.Future[None], timeout: float | None) -> None:
    """Wait until ``fut`` is resolved by a wakeup, or ``timeout`` seconds, whichever is first."""
    handle = None if timeout is None else fut.get_loop().call_later(timeout, _resolve, fut)
    try:
        await fut
    finally:
        if handle is not None:
            handle.cancel()


async def _disconnect(conn: AbstractConnection) -> None:
    try:
        await conn.disconnect(nowait=True)
    except Exception:  # closing a broken socket may fail in many ways
        _log.debug("error while closing a redis connection", exc_info=True)


class _Channel:
    __slots__ = ("name", "pending", "recheck", "state", "waiters")

    def __init__(self, name: bytes) -> None:
        self.name = name
        # Insertion order = arrival order: "1" goes to the longest-waiting waiter.
        self.waiters: dict[PubSubWaiter, None] = {}
        self.state = _ABSENT
        # One future per waiter still inside __aenter__, resolved with None once the server
        # confirmed the SUBSCRIBE, or with the error that prevented it.
        self.pending: list[asyncio.Future[BaseException | None]] = []
        # Set when the connection dropped under live waiters: wake them all on resubscribe.
        self.recheck = False


class PubSubWaiter:
    """One waiting acquisition on a pub/sub channel; an async context manager (see module)."""

    __slots__ = ("_ch", "_flag", "_fut", "_hub", "_name", "_owes", "_owner")

    def __init__(self, hub: PubSubHub, channel: bytes, owner: bytes) -> None:
        self._hub = hub
        self._name = channel
        self._owner = owner
        self._ch: _Channel | None = None
        self._flag = False  # a banked wakeup, consumed by the next wait()
        self._owes = False  # got a "wake one" that no re-check has used yet
        self._fut: asyncio.Future[None] | None = None

    async def __aenter__(self) -> PubSubWaiter:
        await self._hub._join(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._hub._leave(self, failed=exc_type is not None)

    async def wait(self, timeout: float | None) -> None:
        """Return when woken (or a wakeup was banked), or after ``timeout`` seconds."""
        if self._flag:
            self._flag = False
            return
        # Waiting again means the caller re-checked since the last wakeup: it was used.
        self._owes = False
        if self._ch is None or self._hub.closed or (timeout is not None and timeout <= 0):
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._fut = fut
        try:
            await _sleep_on(fut, timeout)
        finally:
            self._fut = None
        self._flag = False

    def _wake(self, owes: bool) -> None:
        self._flag = True
        if owes:
            self._owes = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)


class PubSubHub:
    """All pub/sub subscriptions of one backend, over one connection (see module docstring).

    The supervisor (:meth:`run`) lives in the backend's TaskGroup. It connects lazily (when
    the first waiter arrives), runs a reader and a writer task over the connection, and on any
    failure tears both down, reconnects with capped exponential backoff and re-subscribes.
    """

    def __init__(
        self,
        make_connection: Callable[[], AbstractConnection],
        *,
        connect_timeout: float,
        confirm_timeout: float,
        where: str,
    ) -> None:
        self._make_connection = make_connection
        self._connect_timeout = connect_timeout
        self._confirm_timeout = confirm_timeout
        self._where = where
        self._channels: dict[bytes, _Channel] = {}
        self._dirty: set[bytes] = set()
        self._kick = asyncio.Event()  # the writer has work
        self._needed = asyncio.Event()  # a channel wants subscribing: connect
        self._conn: AbstractConnection | None = None
        self._ping_due = False
        self._task: asyncio.Task[None] | None = None
        self.closed = False
        self.connects = 0
        self.waiters = 0

    # ---------------------------------------------------------------- public surface

    def waiter(self, channel: bytes, owner: str) -> PubSubWaiter:
        return PubSubWaiter(self, channel, owner.encode("utf-8", "surrogatepass"))

    def start(self, spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        self._task = spawn(self.run())

    def close(self) -> None:
        """Stop the supervisor and release everyone waiting; synchronous and idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._task is not None:
            self._task.cancel()
        error = BackendError(f"the redis backend for {self._where} is closed")
        for ch in self._channels.values():
            self._settle(ch, error)
            for w in ch.waiters:
                w._wake(owes=False)

    def statistics(self) -> dict[str, int]:
        conn = self._conn
        return {
            "pubsub_connections": int(conn is not None and conn.is_connected),
            "subscribed_channels": sum(ch.state == _SUBSCRIBED for ch in self._channels.values()),
            "waiters": self.waiters,
            "pubsub_connects": self.connects,
        }

    # ---------------------------------------------------------------- waiter bookkeeping

    async def _join(self, w: PubSubWaiter) -> None:
        if self.closed:
            raise BackendError(f"the redis backend for {self._where} is closed")
        if w._ch is not None:
            raise RuntimeError("this waiter is already entered")
        ch = self._channels.get(w._name)
        if ch is None:
            ch = self._channels[w._name] = _Channel(w._name)
        ch.waiters[w] = None
        w._ch = ch
        self.waiters += 1
        if ch.state == _SUBSCRIBED:
            return
        fut: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        ch.pending.append(fut)
        self._mark(ch.name)
        try:
            async with asyncio.timeout(self._confirm_timeout):
                error = await fut
        except BaseException as exc:
            # Cancelled (or timed out) before the server confirmed: undo, synchronously.
            if fut in ch.pending:
                ch.pending.remove(fut)
            self._leave(w, failed=True)
            if isinstance(exc, TimeoutError):
                raise BackendError(
                    f"redis did not confirm a SUBSCRIBE within {self._confirm_timeout} s "
                    f"on {self._where}"
                ) from None
            raise
        if error is not None:
            self._leave(w, failed=True)
            if isinstance(error, BackendError):
                raise error
            raise BackendError(
                f"cannot subscribe on {self._where}: {type(error).__name__}: {error}"
            ) from error

    def _leave(self, w: PubSubWaiter, *, failed: bool) -> None:
        ch = w._ch
        if ch is None:
            return
        w._ch = None
        del ch.waiters[w]
        self.waiters -= 1
        if w._owes and (failed or w._flag):
            # We took a "wake one" and will not use it (cancelled or timed out before the
            # re-check, or it arrived as we left with the lock): pass it on.
            self._wake_one(ch)
        w._flag = w._owes = False
        if not ch.waiters:
            if ch.state == _ABSENT and not ch.pending:
                del self._channels[ch.name]
            elif ch.state == _SUBSCRIBED:
                self._mark(ch.name)
            # SUBSCRIBING/UNSUBSCRIBING: the server's reply decides (see _on_*).

    def _mark(self, name: bytes) -> None:
        self._dirty.add(name)
        self._kick.set()
        self._needed.set()

    def _settle(self, ch: _Channel, error: BaseException | None) -> None:
        pending, ch.pending = ch.pending, []
        for fut in pending:
            if not fut.done():
                fut.set_result(error)

    def _fail_pending(self, error: BaseException) -> None:
        for ch in list(self._channels.values()):
            self._settle(ch, error)

    # ---------------------------------------------------------------- routing

    def _wake_one(self, ch: _Channel) -> None:
        for w in ch.waiters:
            if not w._flag:
                w._wake(owes=True)
                return

    def _route(self, name: bytes, data: bytes) -> None:
        ch = self._channels.get(name)
        if ch is None or not ch.waiters:
            return
        if data == _ONE:
            self._wake_one(ch)
        elif data == _ALL:
            for w in ch.waiters:
                w._wake(owes=False)
        else:
            for w in ch.waiters:
                if w._owner == data:
                    w._wake(owes=False)
                    return

    def _on_subscribe(self, name: bytes) -> None:
        ch = self._channels.get(name)
        if ch is None:
            ch = self._channels[name] = _Channel(name)
        ch.state = _SUBSCRIBED
        self._settle(ch, None)
        if ch.recheck:
            # Back after a disconnect: anything published meanwhile is lost; re-check all.
            ch.recheck = False
            for w in ch.waiters:
                w._wake(owes=False)
        if not ch.waiters:
            self._mark(name)

    def _on_unsubscribe(self, name: bytes) -> None:
        ch = self._channels.get(name)
        if ch is None:
            return
        ch.state = _ABSENT
        if ch.waiters or ch.pending:
            self._mark(name)  # someone arrived while it was going away: subscribe again
        else:
            del self._channels[name]

    def _on_disconnect(self) -> None:
        for name, ch in list(self._channels.items()):
            if ch.state in (_SUBSCRIBED, _UNSUBSCRIBING) and ch.waiters:
                ch.recheck = True
            ch.state = _ABSENT
            if not ch.waiters and not ch.pending:
                del self._channels[name]
        self._dirty.clear()

    # ---------------------------------------------------------------- connection tasks

    async def run(self) -> None:
        """Supervise the pub/sub connection until cancelled; never raises otherwise."""
        loop = asyncio.get_running_loop()
        delay = 0.0
        while not self.closed:
            if not self._channels:
                self._needed.clear()
                await self._needed.wait()
                continue
            conn = self._make_connection()
            try:
                async with asyncio.timeout(self._connect_timeout):
                    await conn.connect()  # type: ignore[no-untyped-call]
            except Exception as exc:
                await _disconnect(conn)
                # Warn once per outage; the retries after it are routine.
                _log.log(
                    logging.DEBUG if delay else logging.WARNING,
                    "redis pub/sub connect to %s failed: %s: %s",
                    self._where,
                    type(exc).__name__,
                    exc,
                )
                self._fail_pending(exc)
                delay = min(_MAX_BACKOFF, max(_MIN_BACKOFF, delay * 2))
                # Reconnect backoff (jittered), not a lock poll: waiters are capped anyway.
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                continue
            started = loop.time()
            self.connects += 1
            self._conn = conn
            for ch in self._channels.values():
                ch.state = _ABSENT
                self._dirty.add(ch.name)
            self._kick.set()
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._read_loop(conn))
                    tg.create_task(self._write_loop(conn))
            except Exception as exc:
                cause = _find(exc, Exception)
                _log.warning(
                    "redis pub/sub connection to %s lost: %s: %s",
                    self._where,
                    type(cause).__name__,
                    cause,
                )
                refused = _find(exc, ResponseError)
                if refused is not None:
                    # The server refused a SUBSCRIBE (ACL?): retrying will not help them.
                    self._fail_pending(refused)
            finally:
                self._conn = None
                self._on_disconnect()
                await _disconnect(conn)
            delay = 0.0 if loop.time() - started > 5.0 else max(_MIN_BACKOFF, delay * 2)
            if delay:
                await asyncio.sleep(min(delay, _MAX_BACKOFF) * random.uniform(0.5, 1.0))

    async def _read_loop(self, conn: AbstractConnection) -> None:
        ping_sent = False
        while True:
            reply = await conn.read_response(timeout=_PING_INTERVAL, disconnect_on_error=False)
            if reply is None:  # nothing for a whole interval
                if ping_sent:
                    raise RedisConnectionError("the pub/sub connection stopped answering PING")
                ping_sent = self._ping_due = True
                self._kick.set()
                continue
            ping_sent = False
            if type(reply) is not list:
                continue  # +PONG while nothing is subscribed
            kind = reply[0]
            if kind == b"message":
                self._route(reply[1], reply[2])
            elif kind == b"subscribe":
                self._on_subscribe(reply[1])
            elif kind == b"unsubscribe":
                self._on_unsubscribe(reply[1])

    async def _write_loop(self, conn: AbstractConnection) -> None:
        kick = self._kick
        while True:
            await kick.wait()
            kick.clear()
            subscribe: list[bytes] = []
            unsubscribe: list[bytes] = []
            for name in self._dirty:
                ch = self._channels.get(name)
                if ch is None:
                    continue
                if ch.state == _ABSENT:
                    if ch.waiters or ch.pending:
                        ch.state = _SUBSCRIBING
                        subscribe.append(name)
                    else:
                        del self._channels[name]
                elif ch.state == _SUBSCRIBED and not ch.waiters and not ch.pending:
                    ch.state = _UNSUBSCRIBING
                    unsubscribe.append(name)
            self._dirty.clear()
            if subscribe:
                await conn.send_command("SUBSCRIBE", *subscribe, check_health=False)
            if unsubscribe:
                await conn.send_command("UNSUBSCRIBE", *unsubscribe, check_health=False)
            if self._ping_due:
                self._ping_due = False
                await conn.send_command("PING", check_health=False)


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of ``kind`` in ``exc``, looking inside exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
        return None
    return exc if isinstance(exc, kind) else None


# ------------------------------------------------------------------------------ BLPOP mode

_DRAIN_LIMIT: Final = 0.25
"""A waiter that leaves while its BLPOP has at most this long to run lets it finish (and keeps
the connection); a longer one is aborted, which costs the connection."""


class SignalCommands(Protocol):
    """The few commands BLPOP waiters need from the backend (its pool, scripts, errors)."""

    async def _arm_waiter(self, registry: bytes, owner: str) -> None:
        """Register ``owner`` in ``registry`` (``WAIT_ARM``); raise ``BackendError``."""
        ...

    async def _leave_waiter(self, registry: bytes, lists: tuple[bytes, ...], owner: str) -> None:
        """Deregister ``owner`` (``WAIT_LEAVE``); best effort, never raises."""
        ...

    async def _push_back(self, key: bytes, registry: bytes, cap: int) -> None:
        """Hand a wake token back to ``key`` (``SIGNAL_PUSH``); best effort, never raises."""
        ...


class BlockingSignals:
    """Connections and reader tasks for BLPOP waits: one connection per waiting acquisition.

    A waiter first registers its owner id in the list's waiter registry (a ZSET) and only
    then re-checks the lock -- the BLPOP counterpart of a confirmed SUBSCRIBE: a release
    pushes a token only while the registry exists, so a release with nobody waiting writes
    nothing, and the last waiter to leave deletes the registry and any unused tokens.

    The connections are kept apart from the command pool so blocked waiters can never starve
    the releases that would wake them; a few idle ones are kept for reuse. Redis checks BLPOP
    timeouts only ``hz`` times a second (every 100 ms by default), so each BLPOP runs in a
    task of the backend's TaskGroup and ``wait()`` keeps its own, exact timer: when the timer
    fires first, the BLPOP stays in flight for the next ``wait()``, and a token it pops later
    is banked, or handed back if the waiter has left. Long waits are cut into slices of
    ``WAIT_SLICE_MS`` so every live waiter re-registers (refreshing the registry's TTL).
    """

    def __init__(
        self,
        make_connection: Callable[[], AbstractConnection],
        commands: SignalCommands,
        *,
        connect_timeout: float,
        grace: float,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None] | None],
        where: str,
        keep_idle: int = 4,
    ) -> None:
        self._make_connection = make_connection
        self._commands = commands
        self._connect_timeout = connect_timeout
        self._grace = grace
        self._spawn = spawn
        self._where = where
        self._keep_idle = keep_idle
        self._idle: list[AbstractConnection] = []
        self._reads: set[asyncio.Task[None]] = set()
        self.in_use = 0
        self.waiters = 0
        self.closed = False
        self.woken_readers: set[str] = set()
        """Owners of readers that took a token: their next attempt passes one on."""

    def waiter(
        self,
        key: bytes,
        owner: str,
        *,
        registry: bytes | None,
        lists: tuple[bytes, ...] = (),
        cap: int = 1,
        reader: bool = False,
    ) -> BlpopWaiter:
        """A waiter blocking on list ``key``.

        ``registry`` is the waiter ZSET guarding ``lists`` (``None`` for a fair waiter's own
        list, which the fair queue guards); ``cap`` bounds the list when a token is handed
        back; ``reader`` marks a waiting reader, whose next grant passes a token on.
        """
        return BlpopWaiter(self, key, owner, registry, lists, cap, reader)

    def close(self) -> list[AbstractConnection]:
        """Abort every BLPOP in flight; return the idle connections for closing."""
        self.closed = True
        for task in self._reads:
            task.cancel()
        idle, self._idle = self._idle, []
        return idle

    def statistics(self) -> dict[str, int]:
        return {
            "pubsub_connections": 0,
            "subscribed_channels": 0,
            "waiters": self.waiters,
            "blocking_connections": self.in_use + len(self._idle),
        }

    async def _acquire(self) -> AbstractConnection:
        while self._idle:
            conn = self._idle.pop()
            if conn.is_connected:
                self.in_use += 1
                return conn
        conn = self._make_connection()
        self.in_use += 1
        try:
            async with asyncio.timeout(self._connect_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException as exc:
            self._release(conn, healthy=False)
            if isinstance(exc, RedisError | OSError):
                raise BackendError(
                    f"cannot open a BLPOP connection to {self._where}: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        return conn

    def _release(self, conn: AbstractConnection, *, healthy: bool) -> None:
        self.in_use -= 1
        if healthy and not self.closed and len(self._idle) < self._keep_idle:
            self._idle.append(conn)
        else:
            self._spawn(_disconnect(conn))

    def _give_back(self, key: bytes, registry: bytes | None, cap: int) -> None:
        if registry is not None:  # a fair waiter's list: the core's release re-notifies
            self._spawn(self._commands._push_back(key, registry, cap))


class BlpopWaiter:
    """One waiting acquisition blocking on a signal list; an async context manager."""

    __slots__ = (
        "_cap",
        "_deadline",
        "_entered",
        "_flag",
        "_fut",
        "_key",
        "_lists",
        "_owes",
        "_owner",
        "_read",
        "_read_until",
        "_reader",
        "_registry",
        "_sigs",
    )

    def __init__(
        self,
        sigs: BlockingSignals,
        key: bytes,
        owner: str,
        registry: bytes | None,
        lists: tuple[bytes, ...],
        cap: int,
        reader: bool,
    ) -> None:
        self._sigs = sigs
        self._key = key
        self._owner = owner
        self._registry = registry
        self._lists = lists
        self._cap = cap
        self._reader = reader
        self._entered = False
        self._flag = False  # a banked token, consumed by the next wait()
        self._owes = False  # took a token that no re-check has used yet
        self._fut: asyncio.Future[None] | None = None
        self._deadline = 0.0  # loop time the current wait() ends (inf: no limit)
        self._read: asyncio.Task[None] | None = None
        self._read_until = 0.0  # loop time the BLPOP in flight times out on the server

    async def __aenter__(self) -> BlpopWaiter:
        sigs = self._sigs
        if sigs.closed:
            raise BackendError(f"the redis backend for {sigs._where} is closed")
        if self._registry is not None:
            try:
                await sigs._commands._arm_waiter(self._registry, self._owner)
            except BaseException:
                # Cancelled or failed with the ZADD maybe applied: undo it in the background.
                self._spawn_leave()
                raise
        self._entered = True
        sigs.waiters += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._entered:
            return
        self._entered = False
        sigs = self._sigs
        sigs.waiters -= 1
        if self._reader:
            sigs.woken_readers.discard(self._owner)
        # A token we took and will not use (banked, or cancelled before the re-check): the
        # give-back runs before our deregistration, which may delete the list.
        give_back = self._flag or (self._owes and exc_type is not None)
        self._flag = self._owes = False
        read = self._read
        if read is not None:
            loop = asyncio.get_running_loop()
            if self._read_until - loop.time() > _DRAIN_LIMIT:
                # Aborting loses the connection; the reply may have been a token: hand it back.
                read.cancel()
                give_back = True
            # else: let it run out; a token it pops now is handed back (see _on_token).
        if give_back:
            sigs._give_back(self._key, self._registry, self._cap)
        leave = self._spawn_leave()
        if leave is not None and exc_type is not None:
            # Leaving without the lock: wait for the deregistration (shielded, so a second
            # cancellation cannot skip it) so that nothing of ours is left once we are out.
            # Leaving with the lock never waits here: the grant already deregistered us (see
            # _LEAVE_ON_GRANT), and an await after a grant could turn into a lost lease.
            await asyncio.shield(leave)

    def _spawn_leave(self) -> asyncio.Task[None] | None:
        if self._registry is None:
            return None
        return self._sigs._spawn(
            self._sigs._commands._leave_waiter(self._registry, self._lists, self._owner)
        )

    async def wait(self, timeout: float | None) -> None:
        """Return when a token was taken (or one is banked), or after ``timeout`` seconds."""
        if self._flag:
            self._flag = False
            return
        self._owes = False
        sigs = self._sigs
        if not self._entered or sigs.closed or (timeout is not None and timeout <= 0):
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._deadline = math.inf if timeout is None else now + timeout
        if self._read is None:
            conn = await sigs._acquire()
            self._read = sigs._spawn(self._blpop(conn))
            if self._read is None:
                sigs._release(conn, healthy=True)
                return
            sigs._reads.add(self._read)
        fut: asyncio.Future[None] = loop.create_future()
        self._fut = fut
        try:
            await _sleep_on(fut, timeout)
        finally:
            self._fut = None
        self._flag = False

    def _block_arg(self, now: float) -> str:
        remaining = min(self._deadline - now, WAIT_SLICE_MS / 1000.0)
        # Decimal seconds (Redis >= 6), rounded up to whole ms; never 0, which means forever.
        seconds = max(math.ceil(remaining * 1000.0), 1) / 1000.0
        self._read_until = now + seconds
        return f"{seconds:.3f}"

    async def _blpop(self, conn: AbstractConnection) -> None:
        """Owned task: BLPOP until a token arrives or nobody is waiting any more."""
        sigs = self._sigs
        loop = asyncio.get_running_loop()
        healthy = False
        try:
            while True:
                block = self._block_arg(loop.time())
                blpop = ("BLPOP", self._key, block)
                if self._registry is None:
                    await conn.send_command(*blpop, check_health=False)
                    replies = 1
                else:
                    # Re-register on every BLPOP, pipelined: keeps the registry alive.
                    reg = self._registry
                    commands = (
                        ("ZADD", reg, 0, self._owner),
                        ("PEXPIRE", reg, WAITERS_TTL_MS),
                        blpop,
                    )
                    await conn.send_packed_command(conn.pack_commands(commands), False)
                    replies = 3
                async with asyncio.timeout(self._read_until + sigs._grace - loop.time()):
                    for _ in range(replies):
                        reply = await conn.read_response()  # no socket_timeout: unbounded
                if reply is not None:
                    self._on_token()
                    break
                # Timed out on the server. Block again only if a wait() is still running.
                if not (self._entered and self._fut is not None and self._deadline > loop.time()):
                    break
            healthy = True
        except (RedisError, OSError):
            # Connection lost or our read limit passed: wake the waiter to re-check (which
            # reports a real outage), and hand back the token the lost reply may have held.
            sigs._give_back(self._key, self._registry, self._cap)
            self._wake()
        finally:
            # Also on cancellation (the waiter left, or the backend is closing).
            self._read = None
            sigs._reads.discard(asyncio.current_task())
            sigs._release(conn, healthy=healthy)
            if sigs.closed:
                self._wake()  # let the caller re-check and meet the closed backend

    def _on_token(self) -> None:
        if not self._entered:
            # The waiter left meanwhile: the token is someone else's.
            self._sigs._give_back(self._key, self._registry, self._cap)
            return
        self._owes = True
        if self._reader:
            self._sigs.woken_readers.add(self._owner)
        self._wake()

    def _wake(self) -> None:
        self._flag = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)
