"""Telling a holder at once that its lease is gone: :class:`Losses`, the loss signals of one
backend's held leases and the pub/sub channels that set them.

A Redis lease is a key with a TTL: by itself only the next renewal (ttl/3 away) can see that
it went. Two pushes say it sooner, both heard on the backend's pub/sub hub, never with a
subscription per held lock:

* ``BREAK`` (``break_lock()``, ``aiodlock break``) publishes the owners it dropped on the
  namespace's *broken* channel (:func:`~._keys.broken_channel`). Each client listens to it
  once per namespace it holds in, from its first grant there on; the owners are random and
  unique, so a message names exactly the leases it ended. The channel is left
  :data:`~._pubsub.LINGER` after the namespace's last lease ends (at once by ``settle()``), as
  a waiters' channel is.
* With ``keyspace_events=True``, the server's ``del`` key events (``__keyevent@DB__:del``)
  name every deleted key; a key one of our leases lives in is then read once more (the event
  may be an older holder's release, heard after our grant), and if our owner is not in it any
  more the lease is lost.

A message missed (the hub was reconnecting, or not listening yet at the first grant) costs
nothing but speed: the next renewal is refused as before. docs/redis.md ("Losses") explains.

Example::

    losses = Losses(spawn=backend_spawn)
    losses.bind([hub])
    signal = losses.signal(spec, owner)  # a LossSignal; BREAK of that lease sets it
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import BackendError, LossSignal
from ._keys import broken_channel, held_key, keys_for
from ._pubsub import LINGER

if TYPE_CHECKING:
    from .. import LockSpec, Tasks
    from ._pubsub import PubSubHub

__all__ = ["Losses", "Verify"]

_log = logging.getLogger("aiodlock.redis")

Verify = Callable[[bytes, "LockSpec", str], Awaitable[bool]]
"""``verify(key, spec, owner)``: whether ``owner`` may still hold its lease in ``key`` (one
read; on Redlock a read on every master), for a deletion event that may be stale or a
subscription confirmed after a break it could not hear."""


class _Held:
    """One held lease: its signal and, with keyspace events, the key it lives in."""

    __slots__ = ("key", "signal", "spec")

    def __init__(self, spec: LockSpec, key: bytes | None) -> None:
        self.spec = spec
        self.key = key
        self.signal = LossSignal()


class Losses:
    """The loss signals of one backend (see the module docstring)."""

    __slots__ = (
        "_by_key",
        "_held",
        "_hubs",
        "_keyspace",
        "_lingering",
        "_namespaces",
        "_own_hub",
        "_rereading",
        "_spawn",
        "_verify",
    )

    def __init__(
        self,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None] | None],
        verify: Verify | None = None,
    ) -> None:
        self._spawn = spawn
        self._hubs: Sequence[PubSubHub] = ()
        self._held: dict[str, _Held] = {}  # owner -> its lease
        # Whose broken channel we listen to -> how many leases we hold there.
        self._namespaces: dict[str, int] = {}
        self._lingering: dict[str, asyncio.TimerHandle] = {}  # namespaces without leases
        self._keyspace: bytes | None = None  # the del-event channel, if listened to
        self._by_key: dict[bytes, set[str]] = {}  # keyspace mode: key -> owners held in it
        self._verify = verify
        self._own_hub: PubSubHub | None = None  # a plain subscription of our own, if any
        self._rereading: set[str] = set()  # owners read again after a confirmation, now

    def bind(self, hubs: Sequence[PubSubHub]) -> None:
        """Listen on ``hubs`` (one per server: the Redlock masters; else one)."""
        self._hubs = tuple(hubs)

    def listen_on_own(self, hub: PubSubHub, tasks: Tasks) -> None:
        """Listen on ``hub``, a plain subscription that only losses use (BLPOP mode, or a
        cluster's sharded waiters): started here, and closed and settled with us."""
        self._own_hub = hub
        hub.start(tasks)
        self.bind([hub])

    async def settle_hub(self) -> None:
        """Wait until our own hub's subscriptions match what we listen to."""
        if self._own_hub is not None:
            await self._own_hub.settle()

    def watch_deletions(self, channel: bytes) -> None:
        """Also hear the server's ``del`` key events on ``channel`` (``keyspace_events``)."""
        self._keyspace = channel
        for hub in self._hubs:
            hub.listen(channel, self._on_deleted, self._read_all)

    def listening(self, namespace: str) -> bool:
        """Whether a break in ``namespace`` reaches us now (every hub confirmed; tests)."""
        channel = broken_channel(namespace)
        hubs = self._hubs
        keyspace = self._keyspace
        return bool(hubs) and all(
            hub.listening(channel) and (keyspace is None or hub.listening(keyspace)) for hub in hubs
        )

    def signal(self, spec: LockSpec, owner: str) -> LossSignal | None:
        """The signal of ``owner``'s lease, made at its first call (after the grant)."""
        held = self._held.get(owner)
        if held is not None:
            return held.signal
        if not self._hubs:
            return None  # not open, or closed
        namespace = spec.namespace
        count = self._namespaces.get(namespace)
        if count is None:
            # Lazily, once per namespace: a client that never holds pays no subscription.
            count = 0
            channel = broken_channel(namespace)
            confirmed = partial(self._read_all, namespace)
            for hub in self._hubs:
                hub.listen(channel, self._on_broken, confirmed)
        elif count == 0:
            self._lingering.pop(namespace).cancel()
        self._namespaces[namespace] = count + 1
        key = None
        if self._keyspace is not None:
            key = held_key(spec.kind, keys_for(namespace, spec.name))
            self._by_key.setdefault(key, set()).add(owner)
        held = self._held[owner] = _Held(spec, key)
        return held.signal

    def drop(self, owner: str) -> None:
        """Forget ``owner``'s lease: released, or its loss told otherwise (a renewal)."""
        held = self._held.pop(owner, None)
        if held is not None:
            self._forget(owner, held)

    def settle(self) -> None:
        """Stop listening, now, in the namespaces where nothing is held (the hubs' settle
        then waits for the server's confirmation)."""
        for namespace, timer in list(self._lingering.items()):
            timer.cancel()
            self._idle(namespace)

    def close(self) -> None:
        """Forget every lease (the backend is closing; its hubs are closed by it)."""
        for timer in self._lingering.values():
            timer.cancel()
        self._lingering.clear()
        self._namespaces.clear()
        self._held.clear()
        self._by_key.clear()
        self._hubs = ()
        if self._own_hub is not None:
            self._own_hub.close()

    def _forget(self, owner: str, held: _Held) -> None:
        if held.key is not None:
            self._unindex(held.key, owner)
        namespace = held.spec.namespace
        count = self._namespaces.get(namespace, 0) - 1
        if count < 0:
            return  # closed meanwhile
        self._namespaces[namespace] = count
        if count == 0:
            loop = asyncio.get_running_loop()
            self._lingering[namespace] = loop.call_later(LINGER, self._idle, namespace)

    def _idle(self, namespace: str) -> None:
        self._lingering.pop(namespace, None)
        if self._namespaces.get(namespace) == 0:
            del self._namespaces[namespace]
            channel = broken_channel(namespace)
            for hub in self._hubs:
                hub.unlisten(channel)

    def statistics(self) -> dict[str, int]:
        stats = {"loss_signals": len(self._held)}
        if self._own_hub is not None:
            stats["listened_channels"] = self._own_hub.statistics()["listened_channels"]
        return stats

    # ---------------------------------------------------------------- messages

    def _lose(self, owner: str, why: str) -> None:
        held = self._held.pop(owner, None)
        if held is None:
            return
        self._forget(owner, held)
        _log.warning("redis: %s of owner %s %s", held.spec.describe(), owner, why)
        held.signal.set()

    def _on_broken(self, data: bytes) -> None:
        for owner in data.split():
            self._lose(owner.decode("ascii", "replace"), "was broken by an operator")

    def _read_all(self, namespace: str | None = None) -> None:
        """A subscription was just confirmed (``namespace``'s broken channel; None: the key
        events): a break or deletion before then was not heard, so read each lease it covers
        once (a first grant's break racing its subscription, or one during a reconnect)."""
        if self._verify is None:
            return
        for owner, held in list(self._held.items()):
            # One re-read at a time per lease: Redlock confirms a subscription per master,
            # and a read that starts after any confirmation sees a break made before it.
            if (namespace is None or held.spec.namespace == namespace) and (
                owner not in self._rereading
            ):
                spec = held.spec
                key = held.key or held_key(spec.kind, keys_for(spec.namespace, spec.name))
                self._rereading.add(owner)
                task = self._spawn(self._check(key, owner))
                if task is None:
                    self._rereading.discard(owner)
                else:
                    task.add_done_callback(partial(_reread, self._rereading, owner))

    def _on_deleted(self, key: bytes) -> None:
        owners = self._by_key.get(key)
        if owners:
            for owner in list(owners):
                self._spawn(self._check(key, owner))

    async def _check(self, key: bytes, owner: str) -> None:
        # The event may be an older holder's release heard after our grant: read the key.
        held = self._held.get(owner)
        verify = self._verify
        if held is None or verify is None:
            return
        try:
            still = await verify(key, held.spec, owner)
        except BackendError:
            return  # the renewals will tell
        if not still and self._held.get(owner) is held:
            self._lose(owner, "was broken or deleted from the server")

    def _unindex(self, key: bytes, owner: str) -> None:
        owners = self._by_key.get(key)
        if owners is not None:
            owners.discard(owner)
            if not owners:
                del self._by_key[key]


def _reread(rereading: set[str], owner: str, _task: asyncio.Task[None]) -> None:
    rereading.discard(owner)
