"""A pub/sub hub's channels and waiters: :class:`Channel` (one channel's state on the server
and its local waiters) and :class:`PubSubWaiter` (one waiting acquisition; see docs/redis.md
for how wakeups are banked and passed on).

Example::

    async with hub.waiter(keys.signal, owner) as waiter:
        await waiter.wait(timeout=remaining_lease)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Protocol

from ._wait import sleep_on

__all__ = ["ABSENT", "SUBSCRIBED", "SUBSCRIBING", "UNSUBSCRIBING", "Channel", "PubSubWaiter"]

# Channel states on the server, as far as the hub's one connection knows.
ABSENT: Final = 0
SUBSCRIBING: Final = 1
SUBSCRIBED: Final = 2
UNSUBSCRIBING: Final = 3


class Membership(Protocol):
    """What a waiter asks of its hub (:class:`~._pubsub.PubSubHub`)."""

    closed: bool

    def subscription(self, channel: bytes) -> int: ...

    async def _join(self, w: PubSubWaiter) -> None: ...

    def _leave(self, w: PubSubWaiter, *, failed: bool) -> None: ...


@dataclass(slots=True, eq=False)
class Channel:
    """One channel of the hub: its subscription state and the waiters on it."""

    name: bytes
    since: int = 0
    """Which subscription of the hub this is (see PubSubHub.subscription); changes with every
    confirmed SUBSCRIBE."""
    expected: dict[bytes, bool] = field(default_factory=dict)
    """Owners about to wait here whose wakeup may arrive before they do (see expect()):
    owner -> whether one arrived."""
    waiters: dict[PubSubWaiter, None] = field(default_factory=dict)
    """Insertion order = arrival order: "1" goes to the longest-waiting waiter."""
    state: int = ABSENT
    pending: list[asyncio.Future[BaseException | None]] = field(default_factory=list)
    """One future per waiter still inside __aenter__, resolved with None once the server
    confirmed the SUBSCRIBE, or with the error that prevented it."""
    recheck: bool = False
    """Set when the connection dropped under live waiters: wake them all on resubscribe."""
    linger: asyncio.TimerHandle | None = None
    """While subscribed with no waiters: the timer that unsubscribes (see LINGER)."""
    listener: Callable[[bytes], None] | None = None
    """A channel listened to (see PubSubHub.listen) rather than waited on: every message goes
    to this callback, and the channel stays subscribed, with or without waiters."""
    on_listening: Callable[[], None] | None = None
    """Called each time the server confirms a listened channel's subscription (the first time
    and after every reconnect): what was published before then was not heard."""

    @property
    def wanted(self) -> bool:
        """Whether the channel should be subscribed: waiters, joins pending, or a listener."""
        return bool(self.waiters or self.pending) or self.listener is not None

    def stop_lingering(self) -> bool:
        """Cancel the unsubscribe timer; True if there was one."""
        if self.linger is None:
            return False
        self.linger.cancel()
        self.linger = None
        return True


class PubSubWaiter:
    """One waiting acquisition on a pub/sub channel; an async context manager (see module)."""

    __slots__ = ("_ch", "_flag", "_fut", "_hub", "_owes", "name", "on_wake", "owner")

    def __init__(self, hub: Membership, channel: bytes, owner: bytes) -> None:
        self._hub = hub
        self.name = channel
        self.owner = owner
        self._ch: Channel | None = None
        self._flag = False  # a banked wakeup, consumed by the next wait()
        self._owes = False  # got a "wake one" that no re-check has used yet
        self._fut: asyncio.Future[None] | None = None
        self.on_wake: Callable[[], object] | None = None
        """Called on every wakeup, waiting or not (a :class:`~._quorum_waiter.QuorumWaiter`
        counts each master's)."""

    @property
    def active(self) -> bool:
        """Entered and still on its channel (false once left, or evicted: see the module)."""
        return self._ch is not None

    @property
    def ready(self) -> bool:
        """Its channel is subscribed now: entering returns without waiting."""
        return self._hub.subscription(self.name) != 0

    @property
    def woken(self) -> bool:
        """A wakeup is banked: the next :meth:`wait` returns at once (the caller's re-check
        is still to come)."""
        return self._flag

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

    def wake(self, owes: bool) -> None:
        """Wake the waiter (banked if it is not waiting now); ``owes``: this was a "wake one"
        meant for it alone, which no re-check has used yet."""
        self._flag = True
        if owes:
            self._owes = True
        if self.on_wake is not None:
            self.on_wake()
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)
