"""Pub/sub wakeups (the default): :class:`PubSubHub` and its :class:`PubSubWaiter`.

ONE dedicated connection per backend carries every subscription of the process. An in-process
registry maps each channel to its local waiters; SUBSCRIBE/UNSUBSCRIBE are ref-counted (sent
when the first waiter arrives; the UNSUBSCRIBE once the last one has been gone for
:data:`LINGER`, so a process that waits for one lock again and again does not subscribe on
every wait) and batched by a writer task, and one reader task routes messages. Entering a
waiter returns once the server has confirmed the channel's SUBSCRIBE (at once if it already
had). Payload ``1`` wakes the longest-waiting local waiter of the channel, ``*`` wakes them
all, anything else is an owner id and wakes that (fair-queue) waiter only. Wakeups are
*banked*: the router sets a flag that the next ``wait()`` consumes, so a message that arrives
while the waiter is busy re-checking is not lost (redisson#5761); one that arrives before its
waiter does is kept if an owner is expected (:meth:`PubSubHub.expect`). A ``1`` that nobody
here can use (its waiter gave up) goes to the hub's ``unclaimed`` callback, which hands it on
to another client (a client's own mutex channels, see :mod:`._scripts`). After the connection
drops and comes back, every channel is re-subscribed and all its waiters are woken to re-check,
because releases published while we were away are gone for good.

1000 waiters on one or many locks cost exactly one connection; leaving (also by
cancellation) is synchronous bookkeeping, so nothing stays subscribed longer than
:data:`LINGER` (and :meth:`PubSubHub.settle`, which the client's ``settle()`` awaits, ends
even that at once).

The connection comes from the backend's :class:`~._source.ConnectionSource` and is driven
directly rather than through redis-py's ``PubSub``: its ``subscribe()`` only *sends*
SUBSCRIBE (the confirmation is a message some reader has to pick up), it re-subscribes
silently inside a read after a reconnect (so nobody learns that messages were lost), and its
reads and writes share one lock-free connection object between tasks. Here one writer task
owns every write, one reader task every read.

**Sharded** (``sharded=True``, Redis Cluster): the hub speaks ``SSUBSCRIBE`` to the one
master that serves its channels' slots (:mod:`._sharded` keeps one hub per master). A channel
whose slot is no longer served there -- the server unsubscribes it (slot migrated, master
demoted), refuses it with ``MOVED``, or the connection is lost (the master may be dead) -- is
*evicted*: its waiters are woken to re-check, and :attr:`PubSubWaiter.active` turns false so
that they subscribe again wherever the slot is served now.

The rules both wakeup mechanisms follow are in :mod:`._wait`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol

from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    MovedError,
    ResponseError,
)

from ..._exceptions import BackendError
from ._source import disconnect_quietly
from ._wait import sleep_on

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

__all__ = ["ChannelMoved", "PubSubHub", "PubSubWaiter", "SideConnections"]

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
LINGER: Final = 1.0
"""Seconds a channel stays subscribed after its last waiter left. A process that contends for
a lock again and again (a worker loop) would otherwise pay a SUBSCRIBE and an UNSUBSCRIBE, and
wait for the SUBSCRIBE's confirmation, on every wait."""
_MIN_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 2.0


class SideConnections(Protocol):
    """Where a hub gets its connection: a :class:`~._source.ConnectionSource`, or one master
    of a cluster."""

    @property
    def connect_timeout(self) -> float: ...

    @property
    def socket_timeout(self) -> float: ...

    def new_connection(self, purpose: str) -> AbstractConnection: ...

    def describe(self) -> str: ...


class ChannelMoved(BackendError):
    """A sharded channel's slot is not (or no longer) served by this hub's master."""


# Message kinds and commands: plain pub/sub, and sharded pub/sub (Redis >= 7).
_PLAIN: Final = (b"message", b"subscribe", b"unsubscribe", "SUBSCRIBE", "UNSUBSCRIBE")
_SHARDED: Final = (b"smessage", b"ssubscribe", b"sunsubscribe", "SSUBSCRIBE", "SUNSUBSCRIBE")


class _Channel:
    __slots__ = (
        "expected",
        "linger",
        "name",
        "pending",
        "recheck",
        "since",
        "state",
        "waiters",
    )

    def __init__(self, name: bytes) -> None:
        self.name = name
        # Which subscription of the hub this is (see PubSubHub.subscription); changes with
        # every confirmed SUBSCRIBE.
        self.since = 0
        # Owners about to wait here whose wakeup may arrive before they do (see expect()):
        # owner -> whether one arrived.
        self.expected: dict[bytes, bool] = {}
        # Insertion order = arrival order: "1" goes to the longest-waiting waiter.
        self.waiters: dict[PubSubWaiter, None] = {}
        self.state = _ABSENT
        # One future per waiter still inside __aenter__, resolved with None once the server
        # confirmed the SUBSCRIBE, or with the error that prevented it.
        self.pending: list[asyncio.Future[BaseException | None]] = []
        # Set when the connection dropped under live waiters: wake them all on resubscribe.
        self.recheck = False
        # While subscribed with no waiters: the timer that unsubscribes (see LINGER).
        self.linger: asyncio.TimerHandle | None = None

    def stop_lingering(self) -> bool:
        """Cancel the unsubscribe timer; True if there was one."""
        if self.linger is None:
            return False
        self.linger.cancel()
        self.linger = None
        return True


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

    @property
    def active(self) -> bool:
        """Entered and still on its channel (false once left, or evicted: see the module)."""
        return self._ch is not None

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
            await sleep_on(fut, timeout)
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
        source: SideConnections,
        *,
        sharded: bool = False,
        ids: Iterator[int] | None = None,
        unclaimed: Callable[[bytes], None] | None = None,
        handed: Callable[[bytes, int], None] | None = None,
    ) -> None:
        self._source = source
        # Called with a channel's name when a "1" reached it that no waiter here can use.
        self._unclaimed = unclaimed
        # Called with an owner and its fencing token when a wakeup "OWNER TOKEN" (a release
        # handed that owner the lock) reaches its waiter here, just before it is woken.
        self._handed = handed
        self._sharded = sharded
        self._kinds = _SHARDED if sharded else _PLAIN
        # Subscription numbers (see subscription()); hubs that share ``ids`` never reuse one.
        self._ids = itertools.count(1) if ids is None else ids
        self._connect_timeout = source.connect_timeout
        # A first waiter may have to wait for a connect, then for the SUBSCRIBE's reply.
        self._confirm_timeout = source.connect_timeout + source.socket_timeout
        self._where = source.describe()
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
        self._settling = 0  # settle() calls running: no lingering meanwhile
        self._changed = asyncio.Event()  # a SUBSCRIBE/UNSUBSCRIBE was answered, or we lost it

    # ---------------------------------------------------------------- public surface

    def waiter(self, channel: bytes, owner: str) -> PubSubWaiter:
        """A waiter on ``channel`` for the acquisition of ``owner`` (not entered yet)."""
        return PubSubWaiter(self, channel, owner.encode("utf-8", "surrogatepass"))

    def subscription(self, channel: bytes) -> int:
        """Which confirmed subscription to ``channel`` is live now; 0 if none is.

        While this stays the same, every message published to ``channel`` since reaches this
        hub: the same number at two moments means nothing was published in between that the
        hub did not see (the connection was not lost, the channel not unsubscribed).
        """
        ch = self._channels.get(channel)
        return ch.since if ch is not None and ch.state == _SUBSCRIBED else 0

    def waiting(self, channel: bytes) -> int:
        """How many waiters are on ``channel`` now."""
        ch = self._channels.get(channel)
        return 0 if ch is None else len(ch.waiters)

    def subscribed(self, channel: bytes) -> bool:
        """Whether the server may count our connection among ``channel``'s subscribers now
        (subscribed, or a SUBSCRIBE/UNSUBSCRIBE still on its way)."""
        ch = self._channels.get(channel)
        return ch is not None and ch.state != _ABSENT

    def expect(self, channel: bytes, owner: str) -> None:
        """Keep a wakeup addressed to ``owner`` on ``channel`` until its waiter joins (or
        :meth:`forget`): its attempt is about to be sent, and a release that follows the
        attempt may be heard before the attempt's reply. Only while ``channel`` is live."""
        ch = self._channels.get(channel)
        if ch is not None and ch.state == _SUBSCRIBED:
            ch.expected[owner.encode("utf-8", "surrogatepass")] = False

    def forget(self, channel: bytes, owner: str) -> bool:
        """Stop keeping wakeups for ``owner`` (it will not wait after all); True if one was
        kept for it (the caller decides whether it goes on to someone else)."""
        ch = self._channels.get(channel)
        if ch is None:
            return False
        return ch.expected.pop(owner.encode("utf-8", "surrogatepass"), False)

    def next_waiter(self, channel: bytes) -> str | None:
        """The owner of ``channel``'s longest-waiting waiter that no wakeup has reached yet
        (``None``: there is none)."""
        ch = self._channels.get(channel)
        if ch is not None:
            for w in ch.waiters:
                if not w._flag:
                    return w._owner.decode("utf-8", "surrogatepass")
        return None

    def wake(self, channel: bytes, owner: str) -> None:
        """Wake ``owner``'s waiter on ``channel``, if it is there."""
        self._route(channel, owner.encode("utf-8", "surrogatepass"))

    def start(self, spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        """Run the supervisor (:meth:`run`) as a task made by ``spawn`` (the owner's group)."""
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
            ch.stop_lingering()
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

    async def settle(self) -> None:
        """Unsubscribe every channel that only lingers (no waiters), now, and wait until the
        server confirmed it (bounded by the confirmation timeout): what ``settle()`` promises,
        the service in its final state."""
        self._settling += 1
        try:
            for ch in list(self._channels.values()):
                if ch.stop_lingering():
                    self._mark(ch.name)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._confirm_timeout):
                    while self._conn is not None and not self.closed and self._lingering():
                        self._changed.clear()
                        await self._changed.wait()
        finally:
            self._settling -= 1

    def _lingering(self) -> bool:
        return any(
            not ch.waiters and not ch.pending and ch.state != _ABSENT
            for ch in self._channels.values()
        )

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
        ch.stop_lingering()
        if ch.expected.pop(w._owner, False):
            w._flag = True  # its wakeup came before it did
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
            self._pass_one(ch)
        w._flag = w._owes = False
        if not ch.waiters:
            if ch.state == _ABSENT and not ch.pending:
                del self._channels[ch.name]
            elif ch.state == _SUBSCRIBED:
                self._linger(ch)
            # SUBSCRIBING/UNSUBSCRIBING: the server's reply decides (see _on_*).

    def _linger(self, ch: _Channel) -> None:
        """Unsubscribe ``ch`` (no waiters now) unless a waiter joins within LINGER."""
        if self._settling:
            self._mark(ch.name)
        elif ch.linger is None and not self.closed:
            ch.linger = asyncio.get_running_loop().call_later(LINGER, self._lingered, ch)

    def _lingered(self, ch: _Channel) -> None:
        ch.linger = None
        if self._channels.get(ch.name) is ch and not ch.waiters:
            self._mark(ch.name)

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

    def _pass_one(self, ch: _Channel) -> None:
        """Give a "wake one" to the longest-waiting waiter not woken yet; else keep it for an
        owner about to wait; else it is unclaimed here."""
        for w in ch.waiters:
            if not w._flag:
                w._wake(owes=True)
                return
        if ch.waiters:
            return  # all woken already: their re-checks come after this release
        for owner, kept in ch.expected.items():
            if not kept:
                ch.expected[owner] = True
                return
        if self._unclaimed is not None and not self.closed:
            self._unclaimed(ch.name)

    def _route(self, name: bytes, data: bytes) -> None:
        ch = self._channels.get(name)
        if ch is None:
            if data == _ONE and self._unclaimed is not None and not self.closed:
                self._unclaimed(name)  # unsubscribed as it came
            return
        if data == _ONE:
            self._pass_one(ch)
        elif data == _ALL:
            for w in ch.waiters:
                w._wake(owes=False)
        else:
            owner, _, token = data.partition(b" ")
            for w in ch.waiters:
                if w._owner == owner:
                    self._hand(owner, token)
                    w._wake(owes=False)
                    return
            if owner in ch.expected:
                self._hand(owner, token)
                ch.expected[owner] = True

    def _hand(self, owner: bytes, token: bytes) -> None:
        if token and self._handed is not None:
            self._handed(owner, int(token))

    def _on_subscribe(self, name: bytes) -> None:
        self._changed.set()
        ch = self._channels.get(name)
        if ch is None:
            ch = self._channels[name] = _Channel(name)
        ch.state = _SUBSCRIBED
        ch.since = next(self._ids)
        self._settle(ch, None)
        if ch.recheck:
            # Back after a disconnect: anything published meanwhile is lost; re-check all.
            ch.recheck = False
            for w in ch.waiters:
                w._wake(owes=False)
        if not ch.waiters:
            self._linger(ch)

    def _on_unsubscribe(self, name: bytes) -> None:
        self._changed.set()
        ch = self._channels.get(name)
        if ch is None:
            return
        if self._sharded and ch.state == _SUBSCRIBED:
            # Not asked for: the server dropped the channel, its slot is served elsewhere now.
            self._evict(ch)
            return
        ch.state = _ABSENT
        if ch.waiters or ch.pending:
            self._mark(name)  # someone arrived while it was going away: subscribe again
        else:
            del self._channels[name]

    def _evict(self, ch: _Channel) -> None:
        """Sharded: ``ch`` is served by another master now (or this one is gone). Its waiters
        are woken to re-check and subscribe again where the slot is (see the module)."""
        del self._channels[ch.name]
        self._dirty.discard(ch.name)
        self._settle(ch, ChannelMoved(f"channel {ch.name!r} is not served by {self._where}"))
        for w in list(ch.waiters):
            w._ch = None
            self.waiters -= 1
            w._wake(owes=False)
        # A confirmation still on its way finds no waiters and unsubscribes (_on_subscribe).
        ch.waiters.clear()

    def _evict_all(self, *, subscribing_only: bool = False) -> None:
        for ch in list(self._channels.values()):
            if not subscribing_only or ch.state == _SUBSCRIBING:
                self._evict(ch)

    def _on_disconnect(self) -> None:
        self._changed.set()
        if self._sharded:
            # The master may be gone for good (failover): every channel finds its slot anew.
            self._evict_all()
            return
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
            conn = self._source.new_connection("pubsub")
            try:
                async with asyncio.timeout(self._connect_timeout):
                    await conn.connect()  # type: ignore[no-untyped-call]
            except Exception as exc:
                await disconnect_quietly(conn)
                # Warn once per outage; the retries after it are routine.
                _log.log(
                    logging.DEBUG if delay else logging.WARNING,
                    "redis pub/sub connect to %s failed: %s: %s",
                    self._where,
                    type(exc).__name__,
                    exc,
                )
                if self._sharded:
                    self._evict_all()  # the master may be gone: find each slot anew
                else:
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
                await disconnect_quietly(conn)
            delay = 0.0 if loop.time() - started > 5.0 else max(_MIN_BACKOFF, delay * 2)
            if delay:
                await asyncio.sleep(min(delay, _MAX_BACKOFF) * random.uniform(0.5, 1.0))

    async def _read_loop(self, conn: AbstractConnection) -> None:
        ping_sent = False
        message, subscribed, unsubscribed = self._kinds[:3]
        while True:
            try:
                reply = await conn.read_response(
                    timeout=_PING_INTERVAL, disconnect_on_error=False
                )
            except MovedError:
                if not self._sharded:
                    raise
                # An SSUBSCRIBE refused: its slot is served elsewhere (one SSUBSCRIBE per
                # channel, but which one is not said): every channel still waiting for its
                # confirmation looks for its master again; those that were right come back.
                self._evict_all(subscribing_only=True)
                continue
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
            if kind == message:
                self._route(reply[1], reply[2])
            elif kind == subscribed:
                self._on_subscribe(reply[1])
            elif kind == unsubscribed:
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
            sub, unsub = self._kinds[3:]
            if self._sharded:
                # One channel per command: the channels of one SSUBSCRIBE must share a slot.
                commands = [(sub, name) for name in subscribe]
                commands += [(unsub, name) for name in unsubscribe]
                if commands:
                    await conn.send_packed_command(conn.pack_commands(commands), False)
            else:
                if subscribe:
                    await conn.send_command(sub, *subscribe, check_health=False)
                if unsubscribe:
                    await conn.send_command(unsub, *unsubscribe, check_health=False)
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

