"""Pub/sub wakeups (the default): :class:`PubSubHub`, one connection for every waiter.

The hub keeps a registry of channels and their local waiters (:mod:`._pubsub_channel`),
subscribes and unsubscribes them by reference count (a channel lingers :data:`LINGER` after
its last waiter), and routes each message: ``1`` wakes the longest-waiting waiter, ``*`` all
of them, an owner id that (fair-queue) waiter only. Wakeups are banked; a ``1`` nobody here can
use goes to ``unclaimed``. The connection itself is driven by :mod:`._pubsub_link`; sharded
mode (Redis Cluster) is for :mod:`._sharded`. docs/redis.md has the design in full.

Example::

    hub = PubSubHub(source)
    hub.start(tasks)
    async with hub.waiter(keys.signal, owner) as waiter:
        await waiter.wait(timeout=remaining_lease)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from .. import BackendError
from ._pubsub_channel import (
    ABSENT,
    SUBSCRIBED,
    SUBSCRIBING,
    UNSUBSCRIBING,
    Channel,
    PubSubWaiter,
)
from ._pubsub_link import PLAIN, SHARDED, HubLink, SideConnections

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from .. import Tasks

__all__ = ["LINGER", "ChannelMoved", "PubSubHub", "PubSubWaiter", "SideConnections"]

_ONE: Final = b"1"
_ALL: Final = b"*"

LINGER: Final = 1.0
"""Seconds a channel stays subscribed after its last waiter left. A process that contends for
a lock again and again (a worker loop) would otherwise pay a SUBSCRIBE and an UNSUBSCRIBE, and
wait for the SUBSCRIBE's confirmation, on every wait."""


class ChannelMoved(BackendError):
    """A sharded channel's slot is not (or no longer) served by this hub's master."""


class PubSubHub(HubLink):
    """All pub/sub subscriptions of one backend, over one connection (see module docstring).

    The supervisor (:meth:`~._pubsub_link.HubLink.run`) runs in a task of the backend's
    :class:`~aiodlock.backends.Tasks`. It connects lazily (when the first waiter arrives),
    runs a reader and a writer task over the connection, and on any failure tears both down,
    reconnects with capped exponential backoff and re-subscribes.
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
        self._kinds = SHARDED if sharded else PLAIN
        # Subscription numbers (see subscription()); hubs that share ``ids`` never reuse one.
        self._ids = itertools.count(1) if ids is None else ids
        self._connect_timeout = source.connect_timeout
        # A first waiter may have to wait for a connect, then for the SUBSCRIBE's reply.
        self._confirm_timeout = source.connect_timeout + source.request_timeout
        self._where = source.describe()
        self._channels: dict[bytes, Channel] = {}
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
        return ch.since if ch is not None and ch.state == SUBSCRIBED else 0

    def waiting(self, channel: bytes) -> int:
        """How many waiters are on ``channel`` now."""
        ch = self._channels.get(channel)
        return 0 if ch is None else len(ch.waiters)

    def subscribed(self, channel: bytes) -> bool:
        """Whether the server may count our connection among ``channel``'s subscribers now
        (subscribed, or a SUBSCRIBE/UNSUBSCRIBE still on its way)."""
        ch = self._channels.get(channel)
        return ch is not None and ch.state != ABSENT

    def expect(self, channel: bytes, owner: str) -> None:
        """Keep a wakeup addressed to ``owner`` on ``channel`` until its waiter joins (or
        :meth:`forget`): its attempt is about to be sent, and a release that follows the
        attempt may be heard before the attempt's reply. Only while ``channel`` is live."""
        ch = self._channels.get(channel)
        if ch is not None and ch.state == SUBSCRIBED:
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
                    return w.owner.decode("utf-8", "surrogatepass")
        return None

    def wake(self, channel: bytes, owner: str) -> None:
        """Wake ``owner``'s waiter on ``channel``, if it is there."""
        self._route(channel, owner.encode("utf-8", "surrogatepass"))

    def wake_one(self, channel: bytes) -> None:
        """Route a "wake one" to ``channel``'s waiters here, as if the server had published
        it (a release of this client that woke nobody else: its own waiters must hear it)."""
        self._route(channel, _ONE)

    def listen(
        self,
        channel: bytes,
        callback: Callable[[bytes], None],
        confirmed: Callable[[], None] | None = None,
    ) -> None:
        """Keep ``channel`` subscribed and hand every message on it to ``callback`` (no
        waiters, no lingering: until :meth:`unlisten` or :meth:`close`). One listener per
        channel; a channel listened to is not waited on. ``confirmed()`` runs each time the
        server confirms the subscription (messages published before were not heard)."""
        ch = self._channels.get(channel)
        if ch is None:
            ch = self._channels[channel] = Channel(channel)
        ch.listener = callback
        ch.on_listening = confirmed
        ch.stop_lingering()
        if ch.state != SUBSCRIBED:
            self._mark(channel)

    def unlisten(self, channel: bytes) -> None:
        """Stop listening to ``channel`` (it is unsubscribed)."""
        ch = self._channels.get(channel)
        if ch is not None and ch.listener is not None:
            ch.listener = ch.on_listening = None
            self._mark(channel)

    def listening(self, channel: bytes) -> bool:
        """Whether the server has confirmed our subscription to a listened ``channel``: from
        then on every message published to it reaches the listener (until a disconnect)."""
        ch = self._channels.get(channel)
        return ch is not None and ch.listener is not None and ch.state == SUBSCRIBED

    def start(self, tasks: Tasks) -> None:
        """Run the supervisor (:meth:`run`) in a task of ``tasks`` (the backend's share)."""
        self._task = tasks.spawn(self.run(), f"aiodlock-redis-pubsub {self._where}")

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
                w.wake(owes=False)

    def statistics(self) -> dict[str, int]:
        conn = self._conn
        return {
            "pubsub_connections": int(conn is not None and conn.is_connected),
            "subscribed_channels": sum(
                ch.state == SUBSCRIBED and ch.listener is None for ch in self._channels.values()
            ),
            "listened_channels": sum(
                ch.state == SUBSCRIBED and ch.listener is not None for ch in self._channels.values()
            ),
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
        return any(not ch.wanted and ch.state != ABSENT for ch in self._channels.values())

    # ---------------------------------------------------------------- waiter bookkeeping

    async def _join(self, w: PubSubWaiter) -> None:
        if self.closed:
            raise BackendError(f"the redis backend for {self._where} is closed")
        if w._ch is not None:
            raise RuntimeError("this waiter is already entered")
        ch = self._channels.get(w.name)
        if ch is None:
            ch = self._channels[w.name] = Channel(w.name)
        ch.waiters[w] = None
        w._ch = ch
        self.waiters += 1
        ch.stop_lingering()
        if ch.expected.pop(w.owner, False):
            w._flag = True  # its wakeup came before it did
        if ch.state == SUBSCRIBED:
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
        if not ch.wanted:
            if ch.state == ABSENT and not ch.pending:
                del self._channels[ch.name]
            elif ch.state == SUBSCRIBED:
                self._linger(ch)
            # SUBSCRIBING/UNSUBSCRIBING: the server's reply decides (see _on_*).

    def _linger(self, ch: Channel) -> None:
        """Unsubscribe ``ch`` (no waiters now) unless a waiter joins within LINGER."""
        if self._settling:
            self._mark(ch.name)
        elif ch.linger is None and not self.closed:
            ch.linger = asyncio.get_running_loop().call_later(LINGER, self._lingered, ch)

    def _lingered(self, ch: Channel) -> None:
        ch.linger = None
        if self._channels.get(ch.name) is ch and not ch.wanted:
            self._mark(ch.name)

    def _mark(self, name: bytes) -> None:
        self._dirty.add(name)
        self._kick.set()
        self._needed.set()

    def _settle(self, ch: Channel, error: BaseException | None) -> None:
        pending, ch.pending = ch.pending, []
        for fut in pending:
            if not fut.done():
                fut.set_result(error)

    def _fail_pending(self, error: BaseException) -> None:
        for ch in list(self._channels.values()):
            self._settle(ch, error)

    # ---------------------------------------------------------------- routing

    def _pass_one(self, ch: Channel) -> None:
        """Give a "wake one" to the longest-waiting waiter not woken yet; else keep it for an
        owner about to wait; else it is unclaimed here."""
        for w in ch.waiters:
            if not w._flag:
                w.wake(owes=True)
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
        if ch is not None and ch.listener is not None:
            ch.listener(data)
            return
        if ch is None:
            if data == _ONE and self._unclaimed is not None and not self.closed:
                self._unclaimed(name)  # unsubscribed as it came
            return
        if data == _ONE:
            self._pass_one(ch)
        elif data == _ALL:
            for w in ch.waiters:
                w.wake(owes=False)
        else:
            owner, _, token = data.partition(b" ")
            for w in ch.waiters:
                if w.owner == owner:
                    self._hand(owner, token)
                    w.wake(owes=False)
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
            ch = self._channels[name] = Channel(name)
        ch.state = SUBSCRIBED
        ch.since = next(self._ids)
        self._settle(ch, None)
        if ch.listener is not None and ch.on_listening is not None:
            ch.on_listening()
        if ch.recheck:
            # Back after a disconnect: anything published meanwhile is lost; re-check all.
            ch.recheck = False
            for w in ch.waiters:
                w.wake(owes=False)
        if not ch.wanted:
            self._linger(ch)

    def _on_unsubscribe(self, name: bytes) -> None:
        self._changed.set()
        ch = self._channels.get(name)
        if ch is None:
            return
        if self._sharded and ch.state == SUBSCRIBED:
            # Not asked for: the server dropped the channel, its slot is served elsewhere now.
            self._evict(ch)
            return
        ch.state = ABSENT
        if ch.wanted:
            self._mark(name)  # someone arrived while it was going away: subscribe again
        else:
            del self._channels[name]

    def _evict(self, ch: Channel) -> None:
        """Sharded: ``ch`` is served by another master now (or this one is gone). Its waiters
        are woken to re-check and subscribe again where the slot is (see the module)."""
        del self._channels[ch.name]
        self._dirty.discard(ch.name)
        self._settle(ch, ChannelMoved(f"channel {ch.name!r} is not served by {self._where}"))
        for w in list(ch.waiters):
            w._ch = None
            self.waiters -= 1
            w.wake(owes=False)
        # A confirmation still on its way finds no waiters and unsubscribes (_on_subscribe).
        ch.waiters.clear()

    def _evict_all(self, *, subscribing_only: bool = False) -> None:
        for ch in list(self._channels.values()):
            if not subscribing_only or ch.state == SUBSCRIBING:
                self._evict(ch)

    def _on_disconnect(self) -> None:
        self._changed.set()
        if self._sharded:
            # The master may be gone for good (failover): every channel finds its slot anew.
            self._evict_all()
            return
        for name, ch in list(self._channels.items()):
            if ch.state in (SUBSCRIBED, UNSUBSCRIBING) and ch.waiters:
                ch.recheck = True
            ch.state = ABSENT
            if not ch.wanted:
                del self._channels[name]
        self._dirty.clear()

    # ---------------------------------------------------------------- connection tasks
