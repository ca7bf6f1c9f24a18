"""Fair mutexes of the Redis backend: :class:`FairQueue` sends a waiter's attempts, leaves the
queue for a waiter that gives up, and takes the grants a release hands to the queue's head;
:class:`Entries` lets this client's waiters enter a queue one at a time. docs/redis.md explains
the queue (heartbeats, purges, handing the lock to the head).

Example::

    async with fair.entries.turn(keys.mutex):
        result = await fair.attempt(keys, owner, ms, first=False)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .. import Busy, Grant
from . import _scripts as lua
from ._settings import busy
from ._slots import wait_outcome

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ._attempts import Attempts
    from ._keys import Keys
    from ._pubsub import PubSubHub
    from ._rechecks import Rechecks
    from ._settings import Settings
    from ._sharded import ShardedHub
    from ._source import ConnectionSource

__all__ = ["Entries", "FairQueue"]


class FairQueue:
    """The fair-queue steps of one backend (see the module docstring); ``hub`` is set once
    the backend is open in pub/sub mode."""

    __slots__ = (
        "_attempts",
        "_client",
        "_fence_ms",
        "_handoff",
        "_identity",
        "_mode",
        "_rechecks",
        "_sent",
        "_source",
        "entries",
        "handed",
        "hub",
    )

    def __init__(
        self,
        source: ConnectionSource,
        attempts: Attempts,
        rechecks: Rechecks,
        settings: Settings,
        client: bytes,
        *,
        handoffs: bool,
    ) -> None:
        self._source = source
        self._attempts = attempts
        self._rechecks = rechecks
        self._client = client
        self._mode = settings.mode
        self._fence_ms = settings.fence_ms
        self._identity = settings.identity
        # In pub/sub mode a release hands the lock to the queue's head (see FAIR_RELEASE),
        # which needs to know when its latest attempt was sent, for the lease.
        self._handoff = "h" if handoffs and settings.wakeup == "pubsub" else "-"
        self._sent: dict[str, float] = {}
        self.handed: dict[str, Grant] = {}  # grants a release handed over, for the re-check
        self.entries = Entries()
        self.hub: PubSubHub | ShardedHub | None = None

    async def attempt(self, keys: Keys, owner: str, ms: int, *, first: bool) -> Grant | Busy:
        """``owner``'s attempt (``FAIR_ACQUIRE``); ``first``: it may hold a place already."""
        # Always in a task of the source (``submit``): if we are cancelled while it is in
        # flight, its reply is still read (the connection is not dropped), and the release
        # that follows waits for it (Attempts.landed). A release that overtook it on another
        # connection would find nothing, and the attempt would then queue an owner that
        # nobody releases: a dead head for a whole deadline.
        source = self._source
        if self.hub is None:
            reply = await wait_outcome(
                source.submit(self._attempts.run, *self.acquire_call(keys, owner, ms), first=first)
            )
            return Grant(reply[1]) if reply[0] == 1 else busy(reply[1])
        try:
            reply = await wait_outcome(source.submit(self._send, keys, owner, ms, first=first))
        except BaseException:
            self.done(keys, owner)
            raise
        if reply[0] == 1:
            self.done(keys, owner)  # granted (or handed the lock, and this confirmed it)
            return Grant(reply[1])
        refused = busy(reply[1])
        self._rechecks.refused(owner, refused)
        return refused

    def done(self, keys: Keys, owner: str) -> None:
        """``owner`` no longer waits in the fair queue of ``keys``: forget what was kept for
        it (a release that follows gives back a lock handed to it meanwhile)."""
        self._rechecks.drop(owner)
        self.handed.pop(owner, None)
        self._sent.pop(owner, None)
        if self.hub is not None:
            self.hub.forget(keys.client_signal(self._client), owner)

    def acquire_call(self, keys: Keys, owner: str, ms: int) -> tuple[Any, ...]:
        """What ``Attempts.run`` takes to run ``owner``'s fair attempt (``FAIR_ACQUIRE``)."""
        return (
            lua.FAIR_ACQUIRE,
            keys.fair_acquire,
            owner,
            ms,
            self._mode,
            self._client,
            self._fence_ms,
            self._identity,
        )

    def release_call(self, keys: Keys, owner: str) -> tuple[Any, ...]:
        """What the source runs to release ``owner``'s fair lock or take it off the queue
        (``FAIR_RELEASE``; in pub/sub mode it hands the lock to the queue's head)."""
        return (
            lua.run,
            lua.FAIR_RELEASE,
            keys.fair_release,
            owner,
            self._mode,
            self._handoff,
            self._fence_ms,
        )

    def on_handed(self, owner: bytes, token: int) -> None:
        """A release handed ``owner``, a fair waiter of ours, the lock (see FAIR_RELEASE): its
        re-check takes the grant. The lease counts from its latest attempt's request, which
        the server ran before that release: no later than the server counts it."""
        name = owner.decode("utf-8", "surrogatepass")
        sent = self._sent.get(name)
        if sent is not None:
            self.handed[name] = Grant(token, sent)

    async def _send(self, client: aioredis.Redis, keys: Keys, owner: str, ms: int) -> Any:
        # Pub/sub mode, once a connection is ours: if this client's channel for the lock is
        # live now, a release that follows this attempt reaches us, and is kept until the
        # waiter joins.
        hub = self.hub
        assert hub is not None
        channel = keys.client_signal(self._client)
        live = hub.subscription(channel)
        if live:
            hub.expect(channel, owner)
            self._rechecks.sent(owner, live)
        self._sent[owner] = asyncio.get_running_loop().time()
        return await self._attempts.run(client, *self.acquire_call(keys, owner, ms))

    def joined(self, channel: bytes, owner: str) -> None:
        """``owner``'s waiter is armed. If the channel has stayed live since the attempt was
        sent, every release after that attempt has reached the waiter (or was kept for it),
        so the core's re-check can be answered without asking the server again."""
        hub = self.hub
        if hub is not None:
            self._rechecks.joined(owner, hub.subscription(channel))

    def leave_now(self, keys: Keys, owner: str) -> None:
        """``owner``'s waiter ended with an exception: leave the queue in this loop step,
        ahead of every queued attempt (unless its attempt is still in flight: then the core's
        release waits for it and sends the release)."""
        attempts = self._attempts
        if attempts.in_flight(owner) or not attempts.leave(owner):
            return
        self.done(keys, owner)
        leaving = self._source.submit(*self.release_call(keys, owner), first=True)
        attempts.leaving(owner, leaving)


class Entries:
    """Waiters of this backend enter a fair queue one at a time, in their order of arrival.

    A waiter's first attempt is what puts it in the queue; the next waiter of the same lock
    sends its own once that one is answered. Their order is kept, and under a storm of
    cancellations the waiters that give up while waiting for their turn never reach the
    server: the queue there holds fewer dead entries, and the live ones reach its head
    sooner. (The other attempts of a waiter already in the queue do not wait for this.)
    """

    __slots__ = ("_turns",)

    def __init__(self) -> None:
        # lock key -> (its turn, how many attempts hold it or wait for it)
        self._turns: dict[bytes, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, lock: bytes) -> AsyncIterator[None]:
        """Hold the turn to enter the queue of ``lock`` (its key)."""
        turn, users = self._turns.get(lock) or (asyncio.Lock(), 0)
        self._turns[lock] = (turn, users + 1)
        try:
            async with turn:
                yield
        finally:
            turn, users = self._turns[lock]
            if users == 1:
                del self._turns[lock]
            else:
                self._turns[lock] = (turn, users - 1)
