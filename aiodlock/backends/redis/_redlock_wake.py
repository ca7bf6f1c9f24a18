"""Who a Redlock mutex release wakes: one waiting client, chosen by the name's arbiter master.

A client refused on the arbiter while its own channel there (``T:signal:CLIENT``) is live
registers among the lock's waiting clients on that master (``MUTEX_ACQUIRE`` in pub/sub mode,
as on one node); a holder's release there wakes the longest-registered client alone
(``MUTEX_RELEASE``), and its releases on the other masters tell nobody. Before, every release
woke a waiter in every waiting process, each asked the arbiter, and all but one were refused:
a herd whose cost grew with the number of processes. :class:`ArbiterWakeups` keeps the rest of
the bargain:

- a release the arbiter did not confirm (the holder was not granted there, it failed, or it
  was silent for the per-master timeout) is published on the other masters, where every
  waiting process hears it (after the lead's grace, see :mod:`._quorum_waiter`);
- a release that woke another client leaves this one a courtesy on the arbiter (it stays out
  for :data:`~._scripts.COURTESY_MS`); within it, this client's first attempt asks the arbiter
  first (which refuses it, and registers the client), so the masters that know nothing of
  the courtesy cannot outvote it, and its re-checks are refused here, unsent;
- a waiter of the releasing client itself is woken here, by the release's reply;
- a wakeup that reaches a client with nobody left to use it goes on (``WAKE_NEXT``), and a
  client whose last waiter gave up leaves the registry.

Example::

    wake = ArbiterWakeups(masters, client_id, spawn)
    wake.bind(hubs)
    wake.follow(keys, arbiter, release_task, replies, patience)  # after a holder's release
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import BackendError
from . import _scripts as lua
from ._keys import wake_next_keys
from ._quorum_waiter import LEAD_GRACE, QuorumWaiter
from ._redlock_rounds import arbiter

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ._keys import Keys
    from ._pubsub import PubSubHub
    from ._quorum import Round
    from ._redlock_rounds import Masters

__all__ = ["ArbiterWakeups"]

_log = logging.getLogger("aiodlock.redis")

_COURTESY = lua.COURTESY_MS / 1000
_WOKE_ANOTHER = 2  # MUTEX_RELEASE's replies when asked whom it woke
_WOKE_US = 3


async def _publish(client: aioredis.Redis, channel: bytes) -> Any:
    return await client.publish(channel, b"1")


async def _zrem(client: aioredis.Redis, registry: bytes, member: bytes) -> Any:
    return await client.zrem(registry, member)


class ArbiterWakeups:
    """The wakeups of one Redlock backend's mutexes (see the module docstring)."""

    __slots__ = (
        "_client",
        "_client_id",
        "_courtesy",
        "_hubs",
        "_leaving",
        "_masters",
        "_releasing",
        "_silent",
        "_spawn",
        "_stray",
        "_waits",
    )

    def __init__(
        self,
        masters: Masters,
        client_id: str,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None] | None],
        waits: Callable[[str], bool],
    ) -> None:
        self._masters = masters
        self._waits = waits  # whether an owner is inside a waiter
        self._client_id = client_id
        self._client = client_id.encode()
        self._spawn = spawn
        self._hubs: list[PubSubHub] = []
        # lock key -> loop time this client's courtesy there ends; in order of that time (every
        # courtesy lasts as long), so the expired ones are the first and go as others come.
        self._courtesy: dict[bytes, float] = {}
        # registry -> this client's removal from it, in flight (an attempt waits for it: a
        # removal landing after that attempt's registration would undo it)
        self._leaving: dict[bytes, asyncio.Future[Any]] = {}
        # lock key -> a release of ours whose reply the arbiter has not given yet (it may
        # leave a courtesy)
        self._releasing: dict[bytes, asyncio.Task[None]] = {}
        # Masters that left a release of ours unanswered for its patience, until one answers
        # again: no courtesy is to be expected from them.
        self._silent: set[int] = set()
        # Owners granted by the other masters while registered on the arbiter: their waiter
        # takes the client off the registry as it leaves.
        self._stray: set[str] = set()

    def bind(self, hubs: list[PubSubHub]) -> None:
        """The masters' hubs, in the masters' order."""
        self._hubs = hubs

    def channel(self, keys: Keys) -> bytes:
        """This client's channel for the mutex of ``keys`` (on its arbiter)."""
        return keys.client_signal(self._client)

    def registers(self, keys: Keys, arbiter: int) -> str:
        """The attempt's registration flag on the arbiter: ``r`` while this client's channel
        there is live (a release that picks it is heard), else ``-``."""
        return "r" if self._hubs[arbiter].subscription(self.channel(keys)) else "-"

    def courtesy(self, keys: Keys) -> float:
        """Seconds this client's courtesy on ``keys``' mutex still runs (0: none)."""
        until = self._courtesy.get(keys.mutex)
        return 0.0 if until is None else max(0.0, until - asyncio.get_running_loop().time())

    def deferring(self, keys: Keys, arbiter: int) -> bool:
        """Whether this client may owe another the mutex of ``keys``: its courtesy runs, or
        the ``arbiter`` (not known to be silent) has not answered its release yet, which may
        leave one. Its attempts ask the arbiter first meanwhile."""
        if self.courtesy(keys) > 0:
            return True
        return keys.mutex in self._releasing and arbiter not in self._silent

    async def registered(self, keys: Keys, patience: float) -> None:
        """Return once no removal of this client from ``keys``' registry is in flight, or
        after ``patience`` seconds (the arbiter is silent: a registration it undoes costs a
        wakeup, which the re-check at the holder's expiry makes up for)."""
        leaving = self._leaving.get(keys.clients)
        if leaving is not None:
            await asyncio.wait((leaving,), timeout=patience)

    def unclaimed(self, master: int, channel: bytes) -> None:
        """A wakeup reached one of this client's channels on ``master`` with no waiter left
        to use it: the next registered client gets it, in the background."""
        keys = wake_next_keys(channel, self._client)
        if keys is not None:
            what = "passing a wakeup on"
            self._spawn(
                self._quietly(master, what, lua.run, lua.WAKE_NEXT, keys, self._client_id, "p")
            )

    def follow(
        self,
        keys: Keys,
        arbiter: int,
        release: asyncio.Task[None] | None,
        replies: list[int],
        patience: float,
    ) -> None:
        """After a holder's release: once the arbiter's ``release`` task has its reply in
        ``replies``, note a courtesy, and wake a waiter of ours unless the arbiter's wakeup
        was for this client; if the arbiter did not release (or is silent for ``patience``
        seconds), publish on the other masters."""
        loop = asyncio.get_running_loop()
        published = False

        def publish() -> None:
            nonlocal published
            if not published:
                published = True
                for i in range(len(self._hubs)):
                    if i != arbiter:
                        what = "publishing a release"
                        self._spawn(self._quietly(i, what, _publish, keys.signal))

        def silent() -> None:
            self._silent.add(arbiter)
            publish()

        if release is None:
            publish()
            return
        timer = loop.call_later(patience, silent)
        self._releasing[keys.mutex] = release

        def answered(_: asyncio.Task[None]) -> None:
            timer.cancel()
            if self._releasing.get(keys.mutex) is release:
                del self._releasing[keys.mutex]
            reply = replies[arbiter]
            if reply >= 0:
                self._silent.discard(arbiter)
            if reply <= 0:
                publish()
                return
            if reply == _WOKE_US:
                return  # the arbiter's wakeup reaches a waiter of ours
            if reply == _WOKE_ANOTHER:
                self._yield(keys.mutex, loop.time() + _COURTESY)
            # A waiter of ours may not be registered (a grant of ours took this client off the
            # registry): it asks now, and is refused and registered if another was woken.
            hub = self._hubs[arbiter]
            channel = self.channel(keys)
            if hub.waiting(channel):
                hub.wake_one(channel)

        release.add_done_callback(answered)

    def _yield(self, key: bytes, until: float) -> None:
        courtesy = self._courtesy
        courtesy.pop(key, None)
        courtesy[key] = until
        now = until - _COURTESY
        while True:
            first, end = next(iter(courtesy.items()))
            if end > now:
                break
            del courtesy[first]

    def granted(
        self, keys: Keys, arbiter: int, owner: str, rnd: Round, args: tuple[Any, ...]
    ) -> None:
        """``owner`` was granted by the round ``rnd`` (sent to the arbiter with ``args``). If
        the arbiter refused and registered this client (the other masters granted), it leaves
        the registry: now if ``owner`` was not waiting, else as its waiter leaves."""
        if self._registration(rnd, arbiter, args):
            if self._waits(owner):
                self._stray.add(owner)
            else:
                self._leave_registry(keys, arbiter, owner, mine=0)

    def refused(
        self,
        keys: Keys,
        arbiter: int,
        owner: str,
        rnd: Round,
        args: tuple[Any, ...],
        retry: float | None,
    ) -> float | None:
        """``owner`` was refused by the round ``rnd`` (sent to the arbiter with ``args``):
        when to ask again, given the round's ``retry``. Not registered although the arbiter
        answered (it granted, then the round failed: votes split with another client's first
        attempt; or it refused with ``-``), no release there will wake it: soon
        (:data:`~._quorum_waiter.LEAD_GRACE`). Registered but not waiting (a single try: no
        waiter follows this loop step), the client leaves the registry, so a release does
        not pick it and pay a pass-on."""
        registered = self._registration(rnd, arbiter, args)
        if registered is False:
            return LEAD_GRACE if retry is None else min(retry, LEAD_GRACE)
        if registered and not self._waits(owner):
            asyncio.get_running_loop().call_soon(self._single_try, keys, arbiter, owner)
        return retry

    @staticmethod
    def _registration(rnd: Round, arbiter: int, args: tuple[Any, ...]) -> bool | None:
        """Whether the arbiter registered the client among its waiting ones: it refused an
        attempt sent with ``r`` (see :meth:`registers`); ``None`` if it did not answer."""
        reply = rnd.replies.get(arbiter)
        if reply is None:
            return None
        return bool(reply[0] == 0 and args[3] == "r")

    def abandoned(self, keys: Keys, arbiter: int, owner: str, args: tuple[Any, ...]) -> None:
        """``owner``'s attempt (sent to the arbiter with ``args``) was cancelled, or failed,
        before its answer was read: it may register this client there as it lands. Unless
        the owner's waiter leaves, and sees to it, leave the registry after it."""
        if args[3] == "r" and not self._waits(owner):
            self._leave_registry(keys, arbiter, owner, mine=0)

    def _single_try(self, keys: Keys, arbiter: int, owner: str) -> None:
        if not self._waits(owner):
            self._leave_registry(keys, arbiter, owner, mine=0)

    def waiter(
        self, keys: Keys, owner: str, need: int, left: Callable[..., object]
    ) -> QuorumWaiter:
        """``owner``'s waiter of ``keys``' mutex: on this client's own channel on the
        arbiter, where a release wakes one registered client, and on the lock's channel on
        the other masters, where only a release the arbiter did not confirm is published;
        armed once ``need`` masters confirmed (and the arbiter). ``left(failed=...)`` runs as
        it leaves."""
        lead = arbiter(keys, len(self._hubs))
        mine = self.channel(keys)

        def leaving(*, failed: bool) -> None:
            left(failed=failed)
            self.left(keys, lead, owner, failed=failed)

        waiters = [
            hub.waiter(mine if i == lead else keys.signal, owner)
            for i, hub in enumerate(self._hubs)
        ]
        return QuorumWaiter(waiters, need, self._spawn, left=leaving, lead=lead)

    def left(self, keys: Keys, arbiter: int, owner: str, *, failed: bool) -> None:
        """``owner``'s waiter of ``keys``' mutex is leaving: if it gave up, or was granted
        by the other masters while registered on the arbiter, this client leaves the registry
        (unless another waiter of it remains: a grant through the arbiter took it off)."""
        stray = owner in self._stray
        self._stray.discard(owner)
        if failed or stray:
            self._leave_registry(keys, arbiter, owner, mine=1)

    def _leave_registry(self, keys: Keys, arbiter: int, owner: str, *, mine: int) -> None:
        """Take this client off ``keys``' registry unless a waiter of it other than
        ``owner``'s (``mine``: 1 if that one is still counted there) remains -- once
        ``owner``'s attempt still in flight there (cancelled, it runs on) has landed, which may
        register the client again."""
        hub = self._hubs[arbiter]
        if hub.waiting(self.channel(keys)) > mine:
            return
        registry = keys.clients
        leaving: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._leaving[registry] = leaving
        leaving.add_done_callback(partial(self._left, registry))
        flight = self._masters.flights.get(owner, {}).get(arbiter)
        if self._spawn(self._unregister(arbiter, registry, flight, leaving)) is None:
            leaving.set_result(None)

    async def _unregister(
        self,
        arbiter: int,
        registry: bytes,
        flight: asyncio.Future[Any] | None,
        leaving: asyncio.Future[None],
    ) -> None:
        try:
            if flight is not None:
                await asyncio.wait((flight,))
            await self._quietly(arbiter, "leaving a waiting list", _zrem, registry, self._client)
        finally:
            if not leaving.done():
                leaving.set_result(None)

    def _left(self, registry: bytes, leaving: asyncio.Future[None]) -> None:
        if self._leaving.get(registry) is leaving:
            del self._leaving[registry]

    async def _quietly(
        self,
        master: int,
        what: str,
        fn: Callable[..., Coroutine[Any, Any, Any]],
        *args: Any,
    ) -> None:
        """A background step, best effort: a failure is logged at DEBUG (the waiters re-check
        by their holder's lease at the latest)."""
        source = self._masters.sources[master]
        try:
            with source.errors("release"):
                await source.call_first(fn, *args)
        except BackendError as exc:
            _log.debug("%s on %s failed: %s", what, source.describe(), exc)
