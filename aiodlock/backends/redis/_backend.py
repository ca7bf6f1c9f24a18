""":class:`RedisBackend`: the backend protocol, composed of a connection source, the key
layout, the Lua scripts and a wakeup mechanism.

Every lock step is one Lua script (:mod:`._scripts`), atomic on the server and one round
trip: acquire, release-if-owner, renew-if-owner (which never resurrects an expired lease), on
the keys of one lock name (:mod:`._keys`). The server is reached through a
:class:`~._source.ConnectionSource` (:mod:`._node` for one server). Waiting is done by server
wakeups, not by polling (:mod:`._pubsub`, :mod:`._blpop`). This module only chooses, per call,
which script runs on which keys, and reads the replies.

**Waiting.** A refused attempt returns ``Busy(retry_after)`` with the blocking lease's
remaining time (+1 ms), so a crashed holder is replaced right after its key expires even
though nobody publishes anything. Otherwise the release script notifies: by pub/sub
(default; one connection per backend for all waiters) or by BLPOP signal lists
(``wakeup="blpop"``; one connection per waiting acquisition, and a token is pushed only while
the list's waiter registry says someone waits).

**Fair mode** (``locks.lock(name, fair=True)``) keeps a queue. A lock is granted only to the
head of the queue; each refused attempt is also the waiter's *heartbeat*, refreshing its
liveness deadline to now + ttl, and ``retry_after`` is at most ttl/3 so a live waiter never
misses its deadline. A waiter that stops trying (crashed, partitioned) is purged when its
deadline passes, so a dead process can stall the queue for one lease at most. A release wakes
only the new head (its owner id is the pub/sub payload): no thundering herd.

**Failures.** Every redis-py exception is translated to :class:`~aiodlock.BackendError` with
the driver's exception chained (:mod:`._errors`). redis-py's own retries are off: retrying a
non-idempotent acquire whose reply was lost would make us our own blocker; instead the core
compensates with release-if-owner, which the protocol makes safe. The password never appears
in ``describe()``, ``repr()`` or messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from redis.exceptions import RedisError

from ..._exceptions import BackendError, UnsupportedError
from .._protocol import Busy, Capability, Grant, Kind, LockSpec
from . import _scripts as lua
from ._blpop import BlockingSignals, BlpopWaiter
from ._keys import keys_for
from ._node import NodeSource
from ._pubsub import PubSubHub, PubSubWaiter
from ._source import disconnect_quietly

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from ..._url import ParsedURL
    from ._source import ConnectionSource

__all__ = ["RedisBackend"]

_WAKEUP_MODES: Final = ("pubsub", "blpop")


def _lease_ms(ttl: float) -> int:
    # Round up: the server must never expire a lease before the client thinks it could.
    return max(1, math.ceil(ttl * 1000.0))


def _busy(ms: int) -> Busy:
    # -1: the blocking key has no TTL (not written by us); only a release can free it.
    if ms == -1:
        return Busy(None)
    # +1 ms so the retry lands after the expiry, never at it; never 0 or negative.
    return Busy(max(ms + 1, 1) / 1000.0)


class RedisBackend:
    """Locks on one Redis server (see the module docstring for scripts and waiting).

    Options (URL query or keyword): ``wakeup`` (``"pubsub"`` default, or ``"blpop"``),
    ``connect_timeout`` (seconds, default 5; bounds connecting, AUTH and the first PING),
    ``socket_timeout`` (seconds, default 5; bounds each command), ``max_connections``
    (command connections, default 2: commands queue for a free one, so 1000 waiters cost 2
    command connections plus the one pub/sub connection; raise it for a high-latency link),
    and ``db`` (for ``unix://``; ``redis://host/N`` carries it in the path).

    Example::

        async with aiodlock.connect("redis://localhost:6379/0?wakeup=pubsub") as locks:
            async with locks.lock("order:42", ttl=10) as lease:
                print(lease.fencing_token)
    """

    queues_on_busy: ClassVar[bool] = False  # only fair locks queue, and spec.fair says so
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.EXCLUSIVE,
            Capability.SHARED,
            Capability.COUNTING,
            Capability.FAIR,
            Capability.FENCING,
            Capability.TTL_LEASE,
            Capability.SERVER_WAKEUP,
        }
    )
    # The wakeup mode is ours; everything about reaching the server is the source's.
    options: ClassVar[Mapping[str, type]] = {"wakeup": str, **NodeSource.options}

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        wakeup = options.get("wakeup")
        if wakeup is None:
            wakeup = "pubsub"
        if not isinstance(wakeup, str):
            raise TypeError(f"option wakeup must be a str, not {type(wakeup).__name__}")
        if wakeup not in _WAKEUP_MODES:
            raise ValueError(
                f"option wakeup must be one of {', '.join(map(repr, _WAKEUP_MODES))}, "
                f"not {wakeup!r}"
            )
        source: ConnectionSource = NodeSource(url, options)
        self._source = source
        self._where = source.describe()
        self._wakeup = wakeup
        self._mode = "l" if wakeup == "blpop" else "p"
        self._errors = {
            action: source.errors(action) for action in ("acquire", "release", "renew")
        }
        self._tg: asyncio.TaskGroup | None = None
        self._hub: PubSubHub | None = None
        self._signals: BlockingSignals | None = None
        self._opened = False
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._opened else "new"
        return f"<RedisBackend {self._where} wakeup={self._wakeup} {state}>"

    # ---------------------------------------------------------------- lifetime

    async def open(self) -> None:
        """Connect and PING (bounded by ``connect_timeout``), load the scripts, start waking."""
        if self._opened or self._closed:
            raise RuntimeError("a RedisBackend is opened once")
        await self._source.open(lua.load_all)
        self._opened = True
        self._tg = tg = asyncio.TaskGroup()
        await tg.__aenter__()
        if self._wakeup == "pubsub":
            self._hub = PubSubHub(self._source)
            self._hub.start(tg.create_task)
        else:
            commands = _SignalScripts(self._source)
            self._signals = BlockingSignals(self._source, commands, spawn=self._spawn)

    async def aclose(self) -> None:
        """Close the pub/sub connection, its tasks, BLPOP connections and the pool.

        Idempotent. Waiters are woken and their next attempt fails with ``BackendError``;
        commands already in flight finish (within ``socket_timeout``) before the pool closes,
        so no connection is reopened behind our back.
        """
        if self._closed:
            return
        self._closed = True
        if self._hub is not None:
            self._hub.close()
        idle: list[AbstractConnection] = []
        if self._signals is not None:
            idle = self._signals.close()
        # From here on every command fails fast (the source is closing); none of our tasks
        # below uses the pool, so it may close before they end.
        await self._source.aclose()
        tg, self._tg = self._tg, None
        if tg is not None:
            for conn in idle:
                tg.create_task(disconnect_quietly(conn))
            # Every task in it ends on cancellation and never raises, so this is safe from
            # any task (a failing child would cancel the task that entered the group).
            await tg.__aexit__(None, None, None)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        # Background work belongs to our TaskGroup, never to a bare task; once closing,
        # nothing new starts.
        tg = self._tg
        if tg is None or self._closed:
            coro.close()
            return None
        return tg.create_task(coro)

    # ---------------------------------------------------------------- protocol

    def check(self, spec: LockSpec) -> None:
        """Fairness is offered for the mutex only."""
        if spec.fair and spec.kind is not Kind.MUTEX:
            raise UnsupportedError(
                f"redis offers fair=True for locks.lock() only, not for {spec.kind.value} locks"
            )

    def describe(self) -> str:
        """The URL without its password."""
        return self._where

    def statistics(self) -> Mapping[str, Any]:
        """``pubsub_connections``, ``subscribed_channels``, ``waiters`` and friends."""
        stats: dict[str, Any] = {"wakeup": self._wakeup}
        if self._hub is not None:
            stats.update(self._hub.statistics())
        elif self._signals is not None:
            stats.update(self._signals.statistics())
        else:
            stats.update(pubsub_connections=0, subscribed_channels=0, waiters=0)
        return stats

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """One attempt; ``Busy.retry_after`` is the blocking lease's remaining time + 1 ms."""
        keys = keys_for(spec.namespace, spec.name)
        ms = _lease_ms(ttl)
        kind = spec.kind
        call = self._source.call
        signals = self._signals  # BLPOP mode: pass the keys a granted waiter leaves
        with self._errors["acquire"]:
            if kind is Kind.MUTEX:
                if spec.fair:
                    reply = await call(
                        lua.run, lua.FAIR_ACQUIRE, keys.fair_acquire, owner, ms, self._mode
                    )
                else:
                    mutex_keys = keys.mutex_acquire if signals is None else keys.mutex_acquire_l
                    reply = await call(lua.run, lua.MUTEX_ACQUIRE, mutex_keys, owner, ms)
            elif kind is Kind.READ:
                chain = "0"
                read_keys: tuple[bytes, ...] = keys.read_acquire
                if signals is not None:
                    read_keys = keys.read_acquire_l
                    if owner in signals.woken_readers:
                        # Woken by a token: if we get in, pass one on to the next reader.
                        signals.woken_readers.discard(owner)
                        chain = "1"
                reply = await call(lua.run, lua.READ_ACQUIRE, read_keys, owner, ms, chain)
            elif kind is Kind.WRITE:
                write_keys = keys.write_acquire if signals is None else keys.write_acquire_l
                reply = await call(lua.run, lua.WRITE_ACQUIRE, write_keys, owner, ms)
            else:
                sem_keys = keys.sem_acquire if signals is None else keys.sem_acquire_l
                reply = await call(lua.run, lua.SEM_ACQUIRE, sem_keys, owner, ms, spec.limit)
        if reply[0] == 1:
            return Grant(reply[1])
        return _busy(reply[1])

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Release-if-owner (also: leave the fair queue); notifies waiters."""
        keys = keys_for(spec.namespace, spec.name)
        kind = spec.kind
        call = self._source.call
        mode = self._mode
        with self._errors["release"]:
            if kind is Kind.MUTEX:
                if spec.fair:
                    done = await call(lua.run, lua.FAIR_RELEASE, keys.fair_release, owner, mode)
                else:
                    done = await call(lua.run, lua.MUTEX_RELEASE, keys.mutex_release, owner, mode)
            elif kind is Kind.READ:
                done = await call(lua.run, lua.READ_RELEASE, keys.read_release, owner, mode)
            elif kind is Kind.WRITE:
                done = await call(lua.run, lua.WRITE_RELEASE, keys.write_release, owner, mode)
            else:
                done = await call(
                    lua.run, lua.SEM_RELEASE, keys.sem_release, owner, mode, spec.limit
                )
        return bool(done == 1)

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Compare-and-extend to ``ttl`` from now; ``False`` (nothing recreated) if not held."""
        keys = keys_for(spec.namespace, spec.name)
        ms = _lease_ms(ttl)
        kind = spec.kind
        call = self._source.call
        with self._errors["renew"]:
            if kind is Kind.MUTEX:
                done = await call(lua.run, lua.MUTEX_RENEW, (keys.mutex,), owner, ms)
            elif kind is Kind.WRITE:
                done = await call(lua.run, lua.MUTEX_RENEW, (keys.writer,), owner, ms)
            elif kind is Kind.READ:
                done = await call(lua.run, lua.ZSET_RENEW, (keys.readers,), owner, ms)
            else:
                done = await call(lua.run, lua.ZSET_RENEW, (keys.sem,), owner, ms)
        return bool(done == 1)

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """``None``: a Redis lease ends by expiry or deletion, which only ``renew`` can see."""
        return None

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """None: a Redis lease is a TTL lease, bounded by its renewals."""
        return None

    def waiter(self, spec: LockSpec, owner: str) -> PubSubWaiter | BlpopWaiter:
        """Arm a wakeup for one waiting acquisition (see :mod:`._pubsub`, :mod:`._blpop`)."""
        _ = self._source.client  # BackendError unless open
        keys = keys_for(spec.namespace, spec.name)
        kind = spec.kind
        hub = self._hub
        if hub is not None:
            if kind is Kind.MUTEX:
                return hub.waiter(keys.signal, owner)
            if kind is Kind.SEMAPHORE:
                return hub.waiter(keys.sem_signal, owner)
            return hub.waiter(keys.rw_signal, owner)
        signals = self._signals
        assert signals is not None
        if kind is Kind.MUTEX:
            if spec.fair:
                return signals.waiter(keys.owner_signal(owner), owner, registry=None)
            return signals.waiter(
                keys.signal, owner, registry=keys.mutex_waiters, lists=(keys.signal,)
            )
        if kind is Kind.SEMAPHORE:
            return signals.waiter(
                keys.sem_signal,
                owner,
                registry=keys.sem_waiters,
                lists=(keys.sem_signal,),
                cap=spec.limit,
            )
        rw_lists = (keys.rw_signal, keys.rsignal)
        if kind is Kind.READ:
            return signals.waiter(
                keys.rsignal, owner, registry=keys.rw_waiters, lists=rw_lists, reader=True
            )
        return signals.waiter(keys.rw_signal, owner, registry=keys.rw_waiters, lists=rw_lists)


class _SignalScripts:
    """The commands BLPOP waiters need (:class:`~._blpop.SignalCommands`), run like every
    lock step: on a command connection of the source, bounded, errors translated."""

    __slots__ = ("_errors", "_source")

    def __init__(self, source: ConnectionSource) -> None:
        self._source = source
        self._errors = source.errors("wakeup")

    async def arm_waiter(self, registry: bytes, owner: str) -> None:
        """Register ``owner`` in ``registry`` (``WAIT_ARM``); raise ``BackendError``."""
        with self._errors:
            await self._source.call(lua.run, lua.WAIT_ARM, (registry,), owner, lua.WAITERS_TTL_MS)

    async def leave_waiter(self, registry: bytes, lists: tuple[bytes, ...], owner: str) -> None:
        """Deregister ``owner`` (``WAIT_LEAVE``); best effort, never raises."""
        # Best effort: the registry's TTL bounds what a failed deregistration leaves.
        with contextlib.suppress(BackendError, RedisError, OSError):
            await self._source.call(lua.run, lua.WAIT_LEAVE, (registry, *lists), owner)

    async def push_back(self, key: bytes, registry: bytes, cap: int) -> None:
        """Hand a wake token back to ``key`` (``SIGNAL_PUSH``); best effort, never raises."""
        # Best effort: the waiters' caps bound what a lost token costs.
        with contextlib.suppress(BackendError, RedisError, OSError):
            await self._source.call(lua.run, lua.SIGNAL_PUSH, (key, registry), cap)
