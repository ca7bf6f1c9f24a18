"""Mutexes of the Redis backend in pub/sub mode, between the tasks of one client:
:class:`Handoff` refuses an attempt locally while another task of this client holds the lock,
hands a released lock straight to this client's longest-waiting task (``MUTEX_HANDOFF``), and
registers the client among the lock's waiting clients. docs/redis.md explains the handoff and
the waiting clients.

Example::

    reply = await handoff.attempt(keys, owner, ms)  # Grant, or Busy (maybe without a request)
    taker = handoff.taker(keys)  # on release: a waiter of ours to hand the lock to
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import BackendError, Busy, Grant
from . import _scripts as lua
from ._keys import wake_next_keys
from ._settings import busy

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ._attempts import Attempts
    from ._keys import Keys
    from ._pubsub import PubSubHub
    from ._rechecks import Rechecks
    from ._settings import Settings
    from ._sharded import ShardedHub
    from ._source import ConnectionSource

__all__ = ["Handoff"]

_log = logging.getLogger("aiodlock.redis")


async def _unregister(client: aioredis.Redis, registry: bytes, member: bytes) -> None:
    await client.zrem(registry, member)


class Handoff:
    """Local handoffs and waiting-client registrations of one backend's mutexes (see the
    module docstring); ``hub`` is set once the backend is open in pub/sub mode."""

    __slots__ = (
        "_armed",
        "_attempts",
        "_burst_ms",
        "_clean_up",
        "_client",
        "_client_id",
        "_deregistering",
        "_enabled",
        "_errors",
        "_fence_ms",
        "_handed",
        "_holding",
        "_identity",
        "_mode",
        "_rechecks",
        "_refused_ms",
        "_source",
        "hub",
        "passed_on",
    )

    def __init__(
        self,
        source: ConnectionSource,
        attempts: Attempts,
        rechecks: Rechecks,
        settings: Settings,
        client_id: str,
        *,
        clean_up: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self._source = source
        self._attempts = attempts
        self._rechecks = rechecks
        self._errors = source.errors("release")
        self._clean_up = clean_up  # a background step the backend's settle() waits for
        self._mode = settings.mode
        self._burst_ms = settings.burst_ms
        self._fence_ms = settings.fence_ms
        self._identity = settings.identity
        # Names this client in the mutex scripts: its courtesy after a release (T:yield), its
        # place among the waiting clients and its own channel (pub/sub mode, T:clients).
        self._client_id = client_id
        self._client = client_id.encode()
        # With wait_replicas a grant must wait for its replicas: no handing over in a script.
        self._enabled = not settings.wait_replicas
        self.passed_on = 0
        self.hub: PubSubHub | ShardedHub | None = None
        # This client's armed waiters and the lease each asks for (ms; 0: not known yet), the
        # lease of each refusal until its waiter is armed (this loop step), and the grants
        # handed over that a re-check will pick up.
        self._armed: dict[str, int] = {}
        self._refused_ms: dict[str, int] = {}
        self._handed: dict[str, Grant] = {}
        # Mutexes a task of this client holds: lock key -> (owner, loop time its lease ends
        # by, as last granted or renewed). Another task's attempt meanwhile is refused here,
        # without a round trip (see _held_here).
        self._holding: dict[bytes, tuple[str, float]] = {}
        # Registries this client is being taken off (see _deregister), until that lands.
        self._deregistering: dict[bytes, asyncio.Future[Any]] = {}

    async def attempt(self, keys: Keys, owner: str, ms: int) -> Grant | Busy:
        """``owner``'s mutex attempt (pub/sub mode).

        A refusal registers this client among the lock's waiting clients when its channel for
        the lock is live as the attempt is sent (:meth:`_send`); then the re-check after
        arming is answered here (see :class:`~._rechecks.Rechecks`). While another task of
        this client holds the lock, the attempt is refused here, unsent (:meth:`_held_here`).
        """
        rechecks = self._rechecks
        handed = self._handed.pop(owner, None)
        if handed is not None:
            self._armed.pop(owner, None)
            rechecks.drop(owner)
            if handed.sent is not None:
                self._hold(keys, owner, handed.sent, ms)
            return handed
        answer = rechecks.answer(owner)
        if answer is not None:
            return answer
        channel = keys.client_signal(self._client)
        refused = self._held_here(keys, owner, channel)
        if refused is not None:
            self._refused(channel, owner, ms, registered=False)
            return refused
        leaving = self._deregistering.get(keys.clients)
        if leaving is not None:
            await asyncio.wait((leaving,))  # a registration must not be overtaken by it
        sent = asyncio.get_running_loop().time()
        try:
            reply = await self._source.call(self._send, keys, channel, owner, ms)
        except BaseException:
            self.unexpect(channel, owner)
            raise
        if reply[0] == 1:
            self.unexpect(channel, owner)
            self._armed.pop(owner, None)
            self._hold(keys, owner, sent, ms)
            return Grant(reply[1])
        refused = busy(reply[1])
        self._refused(channel, owner, ms, registered=rechecks.refused(owner, refused))
        return refused

    def _held_here(self, keys: Keys, owner: str, channel: bytes) -> Busy | None:
        """The refusal of ``owner``'s attempt if another task of this client holds the mutex
        (and its lease has not run out): nothing to ask the server. Its release hands the lock
        to the longest-waiting armed task of ours, or, if another client registered first,
        wakes that one and registers this client (MUTEX_HANDOFF), so a waiter refused here
        is never left unregistered. Only while this client's channel for the lock is live,
        so the waiter is armed on it at once."""
        hub = self.hub
        holding = self._holding.get(keys.mutex)
        if holding is None or holding[0] == owner or hub is None:
            return None
        left = holding[1] - asyncio.get_running_loop().time()
        if left <= 0:
            del self._holding[keys.mutex]  # abandoned, or not renewed: ask the server
            return None
        if not hub.subscription(channel):
            return None
        return busy(int(left * 1000))

    def _hold(self, keys: Keys, owner: str, sent: float, ms: int) -> None:
        if self._enabled:
            self._holding[keys.mutex] = (owner, sent + ms / 1000)

    def unhold(self, keys: Keys, owner: str) -> None:
        """``owner`` releases the mutex of ``keys``: no task of ours holds it any more."""
        holding = self._holding.get(keys.mutex)
        if holding is not None and holding[0] == owner:
            del self._holding[keys.mutex]

    def renewed(self, keys: Keys, owner: str, sent: float, ms: int) -> None:
        """``owner`` renewed the mutex of ``keys`` by a request sent at ``sent``."""
        holding = self._holding.get(keys.mutex)
        if holding is not None and holding[0] == owner:
            self._holding[keys.mutex] = (owner, sent + ms / 1000)

    def _refused(self, channel: bytes, owner: str, ms: int, *, registered: bool) -> None:
        # The core arms the waiter in this very loop step (see joined); an attempt that is
        # not followed by a wait (a single try) stops being expected with the step.
        if owner in self._armed:
            self._armed[owner] = ms  # a re-check: its waiter is armed already
        else:
            self._refused_ms[owner] = ms
        asyncio.get_running_loop().call_soon(self._refusal_ends, channel, owner, registered)

    def _refusal_ends(self, channel: bytes, owner: str, registered: bool) -> None:
        self._refused_ms.pop(owner, None)
        if registered:
            self.unexpect(channel, owner)

    async def _send(
        self, client: aioredis.Redis, keys: Keys, channel: bytes, owner: str, ms: int
    ) -> Any:
        # Once a connection is ours: if our channel for the lock is live now, a release
        # after this attempt that wakes us is heard, and kept until the waiter joins.
        hub = self.hub
        assert hub is not None
        live = hub.subscription(channel)
        if live:
            hub.expect(channel, owner)
            self._rechecks.sent(owner, live)
        return await self._attempts.run(
            client,
            lua.MUTEX_ACQUIRE,
            keys.mutex_acquire_c,
            owner,
            ms,
            self._client_id,
            "r" if live else "-",
            self._burst_ms,
            self._fence_ms,
            self._identity,
        )

    def unexpect(self, channel: bytes, owner: str) -> None:
        """``owner`` will not wait (granted, failed, or it was a single try): a wakeup kept
        for it goes on to the next client."""
        self._rechecks.drop(owner)
        hub = self.hub
        if hub is not None and hub.forget(channel, owner):
            self.pass_on(channel)

    def pass_on(self, channel: bytes) -> None:
        """A wakeup reached one of this client's mutex channels with nobody left to use it:
        the next registered client gets it (``WAKE_NEXT``), in the background."""
        keys = wake_next_keys(channel, self._client)
        if keys is not None:
            self.passed_on += 1
            # If it fails, the other waiters re-check when their holder's lease runs out.
            self._clean_up(
                self._quietly("passing a wakeup on", lua.WAKE_NEXT, keys, self._client_id)
            )

    async def _quietly(
        self, what: str, script: lua.Script, keys: tuple[bytes, ...], *args: Any
    ) -> None:
        """A background step that lets others go on (``call_first``), best effort: a failure
        is logged at DEBUG, for the lease or the waiters' caps bound what it leaves."""
        try:
            with self._errors:
                sent: tuple[Any, ...] = (*args, self._mode)
                await self._source.call_first(lua.run, script, keys, *sent)
        except BackendError as exc:
            _log.debug("%s failed: %s", what, exc)

    async def hand_over(self, keys: Keys, channel: bytes, owner: str, taker: str, ms: int) -> bool:
        """Release ``owner``'s lock by handing it to ``taker``, a waiter of this client, in
        one script (``MUTEX_HANDOFF``), unless another client has waited longer (then it is
        released to that one). The taker's lease is timed from this request; its re-check
        picks the grant up (:meth:`attempt`).

        The script runs in a task of the source and is never withdrawn, so its reply is read
        however the releasing task fares (a cancelled release must not lose the taker's
        grant: nobody would release it until its lease ran out); an outcome that is unknown
        (the connection failed under it) gives the taker's possible grant back.
        """
        sent = asyncio.get_running_loop().time()
        reply = self._source.submit(
            self._attempts.run,
            lua.MUTEX_HANDOFF,
            keys.mutex_handoff,
            taker,
            owner,
            ms,
            self._client_id,
            self._mode,
            lua.COURTESY_MS,
            self._fence_ms,
            self._identity,  # the taker is a waiter of this client
            first=True,
        )
        reply.add_done_callback(partial(self._handed_over, keys, channel, taker, sent))
        answer = await asyncio.shield(reply)
        return bool(answer[0] != 0)

    def _handed_over(
        self, keys: Keys, channel: bytes, taker: str, sent: float, reply: asyncio.Future[Any]
    ) -> None:
        hub = self.hub
        if hub is None:
            return
        if reply.cancelled() or reply.exception() is not None:
            # Cut off (closing, or its deadline) or failed: it may have run.
            self._give_back(keys, taker)
            hub.wake(channel, taker)  # it re-checks
            return
        answer = reply.result()
        if answer[0] == 0:
            # Not the owner any more (its lease ran out, or the lock was broken): no release
            # wakes the taker, which may have been refused here, unregistered.
            hub.wake(channel, taker)
            return
        if answer[0] != 2:
            return
        if taker in self._armed:
            self._handed[taker] = Grant(int(answer[1]), sent)
            hub.wake(channel, taker)
        else:
            self._give_back(keys, taker)  # it stopped waiting meanwhile

    def taker(self, keys: Keys) -> tuple[bytes, str, int] | None:
        """This client's longest-waiting armed waiter for ``keys``' mutex, its channel and
        lease, if a release may hand the lock over to it."""
        hub = self.hub
        if hub is None or not self._enabled or not self._armed:
            return None
        channel = keys.client_signal(self._client)
        taker = hub.next_waiter(channel)
        ms = 0 if taker is None else self._armed.get(taker, 0)
        if taker is None or not ms:
            return None
        return channel, taker, ms

    def _give_back(self, keys: Keys, owner: str) -> None:
        """Release ``owner``'s mutex in the background: it was handed a grant it cannot use."""
        self._clean_up(self._release_quietly(keys, owner))

    async def _release_quietly(self, keys: Keys, owner: str) -> None:
        await self._attempts.landed(owner)
        # If it fails, its lease runs out on its own: nobody renews it.
        what = "giving a handed-over lock back"
        await self._quietly(what, lua.MUTEX_RELEASE, keys.mutex_release_c, owner)

    def joined(self, channel: bytes, owner: str) -> None:
        """``owner``'s waiter is armed: its re-check may be answered from its refusal (see
        :class:`~._rechecks.Rechecks`), and a release of this client may hand it the lock,
        once its lease is known (0: from its next refusal, if its first one was answered
        before a SUBSCRIBE)."""
        hub = self.hub
        if hub is not None:
            self._rechecks.joined(owner, hub.subscription(channel))
        self._armed[owner] = self._refused_ms.get(owner, 0)

    def left(self, keys: Keys, owner: str) -> None:
        """``owner``'s waiter left with an exception (timed out, cancelled, closed): a grant
        handed to it that its re-check did not pick up goes back (one still in flight: see
        :meth:`_handed_over`)."""
        self._armed.pop(owner, None)
        if self._handed.pop(owner, None) is not None:
            self._give_back(keys, owner)
        hub = self.hub
        if hub is not None and hub.waiting(keys.client_signal(self._client)) <= 1:
            self._deregister(keys)

    def _deregister(self, keys: Keys) -> None:
        """This client stops waiting for ``keys``' mutex: take it off the registry, so that
        nothing of it stays there (a release would otherwise pick it and pay a pass-on). Its
        next attempt on the lock waits for this, so it cannot remove a newer registration."""
        leaving = self._source.submit(_unregister, keys.clients, self._client, first=True)
        self._deregistering[keys.clients] = leaving
        leaving.add_done_callback(partial(self._deregistered, keys.clients))
        self._clean_up(self._settled(leaving))

    def _deregistered(self, registry: bytes, leaving: asyncio.Future[Any]) -> None:
        if self._deregistering.get(registry) is leaving:
            del self._deregistering[registry]
        if not leaving.cancelled() and leaving.exception() is not None:
            _log.debug("leaving a waiting list failed: %s", leaving.exception())

    @staticmethod
    async def _settled(outcome: asyncio.Future[Any]) -> None:
        await asyncio.wait((outcome,))  # settle() waits for it; its error is logged above
