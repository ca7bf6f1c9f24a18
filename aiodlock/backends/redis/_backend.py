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
only the new head (its owner id is the pub/sub payload), on its client's channel: no thundering
herd, and no other process woken to discard the message. In pub/sub mode
the release hands the lock to the head in the same script (``FAIR_RELEASE``; its wakeup
carries the fencing token), so the head's grant needs no attempt of its own; a head that
missed that wakeup finds the key its own at its next attempt (``FAIR_ACQUIRE`` confirms it).

A live process must not stall it at all, so a waiter that gives up (cancelled, timed out)
leaves at once: its waiter sends the leaving release in the same loop step, ahead of every
queued attempt (:class:`_Attempts`, ``call_first``), and the new head is woken by it. Under a
storm of cancellations most attempts never leave the process (their callers give up while
queued for a connection, or for their turn to enter the queue: :class:`_Entries`); their
compensating releases are answered here, without a round trip, instead of crowding out the
ones that matter. A fair attempt always runs in a task of the source, so a cancelled caller
never drops the connection under it, and the release that follows waits for its reply
rather than overtaking it. A fair waiter's re-check after arming its wakeup is answered from
the refusal when the pub/sub channel stayed live meanwhile (:class:`_Rechecks`).

**Failures.** Every redis-py exception is translated to :class:`~aiodlock.BackendError` with
the driver's exception chained (:mod:`._errors`). redis-py's own retries are off: retrying a
non-idempotent acquire whose reply was lost would make us our own blocker; instead the core
compensates with release-if-owner, which the protocol makes safe. The password never appears
in ``describe()``, ``repr()`` or messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import math
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Final

from redis.exceptions import RedisError

from ..._exceptions import BackendError, LimitMismatchError, UnsupportedError
from ..._validate import check_seconds
from .._protocol import Busy, Capability, Grant, HolderInfo, Kind, LockInfo, LockSpec
from . import _scripts as lua
from ._blpop import BlockingSignals, BlpopWaiter
from ._cluster import ClusterSource
from ._keys import Keys, keys_for, namespace_match, split_key, wake_next_keys
from ._node import NodeSource
from ._pubsub import PubSubHub, PubSubWaiter
from ._sentinel import SentinelSource
from ._sharded import ShardedHub, ShardedWaiter
from ._slots import wait_outcome
from ._source import disconnect_quietly

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import AbstractConnection

    from ..._url import ParsedURL
    from ._source import ConnectionSource

__all__ = ["RedisBackend"]

_WAKEUP_MODES: Final = ("pubsub", "blpop")
# A lock name's fencing counter outlives its last grant by this long (see _scripts.next_token).
_DEFAULT_FENCE_TTL: Final = 7 * 24 * 3600.0
# wait_replicas: the longest a grant waits for its replicas (less if socket_timeout is short).
_WAIT_MS: Final = 1000
# How long a client that takes a mutex while others wait may keep taking it back (see burst).
_DEFAULT_BURST: Final = 0.01


def _check_replicas(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"option wait_replicas must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"option wait_replicas must be >= 0, not {value}")
    return value


def _option_ms(options: Mapping[str, Any], name: str, default: float) -> int:
    """A seconds option (``fence_ttl``, ``burst``) in whole milliseconds; 0 stays 0 (keep
    fencing counters forever; serve waiting clients strictly in turn)."""
    seconds = check_seconds(
        options.get(name, default), argument=f"option {name}", allow_none=False, allow_zero=True
    )
    assert seconds is not None
    return 0 if seconds == 0 else _lease_ms(seconds)


def _lease_ms(ttl: float) -> int:
    # Round up: the server must never expire a lease before the client thinks it could.
    return max(1, math.ceil(ttl * 1000.0))


_log = logging.getLogger("aiodlock.redis")


async def _unregister(client: aioredis.Redis, registry: bytes, member: bytes) -> None:
    await client.zrem(registry, member)


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
    ``db`` (for ``unix://``; ``redis://host/N`` carries it in the path), ``fence_ttl``
    (seconds a lock name's fencing counter outlives its last grant, default 7 days; 0 keeps
    it forever: a counter that is gone restarts from the server clock, see :mod:`._keys`),
    and ``burst`` (pub/sub mode, seconds, default 0.01: a client that takes a mutex while
    other clients wait may take it back for this long before it must let the client it woke
    in; 0 serves the waiting clients strictly one grant each, in turn). ``rediss://`` takes
    redis-py's TLS options ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_cert_reqs`` and ``ssl_check_hostname``; ``redis_client`` (keyword only) is an
    application's ``redis.asyncio.Redis``, whose pool is used and never closed.

    Example::

        async with aiodlock.connect("redis://localhost:6379/0?wakeup=pubsub") as locks:
            async with locks.lock("order:42", ttl=10) as lease:
                print(lease.fencing_token)

        async with aiodlock.connect("rediss://cache:6380/0?ssl_ca_certs=/etc/ssl/ca.pem"):
            ...
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
            Capability.INSPECT,
            Capability.BREAK,
        }
    )
    # The wakeup mode is ours; everything about reaching the server is the source's.
    options: ClassVar[Mapping[str, type]] = {
        "wakeup": str,
        "fence_ttl": float,
        "burst": float,
        "wait_replicas": int,
        **SentinelSource.options,
    }

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
        self._fence_ms = _option_ms(options, "fence_ttl", _DEFAULT_FENCE_TTL)
        self._burst_ms = _option_ms(options, "burst", _DEFAULT_BURST)
        self._wait_replicas = _check_replicas(options.get("wait_replicas", 0))
        self._cluster = url.scheme == "redis+cluster"
        if self._cluster and self._wait_replicas:
            raise ValueError(f"option wait_replicas is not supported on {url.scheme}://")
        source: ConnectionSource = (
            SentinelSource(url, options)
            if url.scheme == "redis+sentinel"
            else ClusterSource(url, options)
            if self._cluster
            else NodeSource(url, options)
        )
        self._source = source
        self._where = source.describe()
        self._wakeup = wakeup
        # How releases notify (see _scripts): a cluster publishes to the channel's shard only.
        self._mode = "l" if wakeup == "blpop" else "s" if self._cluster else "p"
        self._errors = {
            action: source.errors(action)
            for action in ("acquire", "release", "renew", "note", "inspect", "break")
        }
        self._tg: asyncio.TaskGroup | None = None
        self._cleanups: set[asyncio.Task[None]] = set()
        self._hub: PubSubHub | ShardedHub | None = None
        self._signals: BlockingSignals | None = None
        replicated = None
        if self._wait_replicas:
            # Within a command's deadline, and well within a lease.
            socket_ms = int(source.socket_timeout * 1000)
            replicated = (self._wait_replicas, max(1, min(socket_ms // 2, _WAIT_MS)))
        self._attempts = _Attempts(replicated)
        self._rechecks = _Rechecks()
        self._entries = _Entries()
        self._opened = False
        self._closed = False
        # Names this client in the mutex scripts: its courtesy after a release (T:yield), its
        # place among the waiting clients and its own channel (pub/sub mode, T:clients).
        self._client_id = secrets.token_hex(8)
        self._client = self._client_id.encode()
        self._passed_on = 0
        # Local handoffs (pub/sub mode, mutex; see _hand_over): this client's armed waiters
        # and the lease each asks for (ms; 0: not known yet), the lease of each refusal until
        # its waiter is armed (this loop step), and the grants handed over that a re-check
        # will pick up.
        self._handoffs = not self._wait_replicas
        # Fair locks in pub/sub mode: a release hands the lock to the queue's head (see
        # FAIR_RELEASE), which needs to know when its latest attempt was sent, for the lease.
        self._fair_handoff = "h" if self._handoffs and wakeup == "pubsub" else "-"
        self._fair_sent: dict[str, float] = {}
        self._armed: dict[str, int] = {}
        self._refused_ms: dict[str, int] = {}
        self._handed: dict[str, Grant] = {}
        # Mutexes a task of this client holds (pub/sub mode, with local handoffs): lock key ->
        # (owner, loop time its lease ends by, as last granted or renewed). Another task's
        # attempt meanwhile is refused here, without a round trip (see _mutex_attempt).
        self._holding: dict[bytes, tuple[str, float]] = {}
        # Registries this client is being taken off (see _deregister), until that lands.
        self._deregistering: dict[bytes, asyncio.Future[Any]] = {}

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
            source = self._source
            self._hub = (
                ShardedHub(source, unclaimed=self._pass_on, handed=self._fair_handed)
                if isinstance(source, ClusterSource)
                else PubSubHub(source, unclaimed=self._pass_on, handed=self._fair_handed)
            )
            self._hub.start(tg.create_task)
        else:
            commands = _SignalScripts(self._source)
            self._signals = BlockingSignals(
                self._source, commands, spawn=self._spawn, clean_up=self._clean_up
            )

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

    def _clean_up(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        """Run a clean-up in the background; :meth:`settle` waits for it."""
        task = self._spawn(coro)
        if task is not None:
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)
        return task

    async def settle(self) -> None:
        """Wait for the background clean-ups (wakeups given back, wait queues left), then end
        the subscriptions that only linger."""
        while self._cleanups:
            await asyncio.wait(set(self._cleanups))
        if self._hub is not None:
            await self._hub.settle()

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
        """``pubsub_connections``, ``subscribed_channels``, ``waiters`` and friends;
        pub/sub mode also ``wakeups_passed_on``: wakeups that reached this client after its
        waiter had left, handed on to the next waiting client."""
        stats: dict[str, Any] = {"wakeup": self._wakeup}
        if self._hub is not None:
            stats.update(self._hub.statistics())
            stats["wakeups_passed_on"] = self._passed_on
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
        attempt = self._attempts.run  # notes what the releases that follow need to know
        fence = self._fence_ms
        signals = self._signals  # BLPOP mode: pass the keys a granted waiter leaves
        with self._errors["acquire"]:
            if kind is Kind.MUTEX:
                if spec.fair:
                    handed = self._handed.get(owner)
                    if handed is not None:
                        self._fair_done(keys, owner)
                        return handed
                    answer = self._rechecks.answer(owner)
                    if answer is not None:
                        return answer
                    if self._attempts.queued(owner):
                        # In the queue already: this attempt may be the one that takes the
                        # lock, and everyone behind it waits for it.
                        return await self._fair_attempt(keys, owner, ms, first=True)
                    async with self._entries.turn(keys.mutex):
                        return await self._fair_attempt(keys, owner, ms, first=False)
                elif self._hub is not None:
                    return await self._mutex_attempt(keys, owner, ms)
                else:
                    mutex_keys = keys.mutex_acquire if signals is None else keys.mutex_acquire_l
                    reply = await call(
                        attempt, lua.MUTEX_ACQUIRE, mutex_keys, owner, ms, self._client_id, fence
                    )
            elif kind is Kind.READ:
                chain = "0"
                read_keys: tuple[bytes, ...] = keys.read_acquire
                if signals is not None:
                    read_keys = keys.read_acquire_l
                    if owner in signals.woken_readers:
                        # Woken by a token: if we get in, pass one on to the next reader.
                        signals.woken_readers.discard(owner)
                        chain = "1"
                reply = await call(attempt, lua.READ_ACQUIRE, read_keys, owner, ms, chain, fence)
            elif kind is Kind.WRITE:
                write_keys = keys.write_acquire if signals is None else keys.write_acquire_l
                reply = await call(attempt, lua.WRITE_ACQUIRE, write_keys, owner, ms, fence)
            else:
                sem_keys = keys.sem_acquire if signals is None else keys.sem_acquire_l
                reply = await call(
                    attempt, lua.SEM_ACQUIRE, sem_keys, owner, ms, spec.limit, fence
                )
        if reply[0] == 1:
            return Grant(reply[1])
        if reply[0] == -1:  # SEM_ACQUIRE: the holders use another limit; nothing was taken
            raise LimitMismatchError(spec.name, int(reply[1]), spec.limit)
        return _busy(reply[1])

    async def _mutex_attempt(self, keys: Keys, owner: str, ms: int) -> Grant | Busy:
        # Pub/sub mode. A refusal registers this client among the lock's waiting clients
        # when its channel for the lock is live as the attempt is sent (_mutex_send); then
        # the re-check after arming is answered here (see _Rechecks). While another task of
        # this client holds the lock, the attempt is refused here, unsent (_held_here).
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
        busy = self._held_here(keys, owner, channel)
        if busy is not None:
            self._refused(channel, owner, ms, registered=False)
            return busy
        leaving = self._deregistering.get(keys.clients)
        if leaving is not None:
            await asyncio.wait((leaving,))  # a registration must not be overtaken by it
        sent = asyncio.get_running_loop().time()
        try:
            reply = await self._source.call(self._mutex_send, keys, channel, owner, ms)
        except BaseException:
            self._unexpect(channel, owner)
            raise
        if reply[0] == 1:
            self._unexpect(channel, owner)
            self._armed.pop(owner, None)
            self._hold(keys, owner, sent, ms)
            return Grant(reply[1])
        busy = _busy(reply[1])
        self._refused(channel, owner, ms, registered=rechecks.refused(owner, busy))
        return busy

    def _held_here(self, keys: Keys, owner: str, channel: bytes) -> Busy | None:
        """The refusal of ``owner``'s attempt if another task of this client holds the mutex
        (and its lease has not run out): nothing to ask the server. Its release hands the lock
        to the longest-waiting armed task of ours, or, if another client registered first,
        wakes that one and registers this client (MUTEX_HANDOFF), so a waiter refused here
        is never left unregistered. Only while this client's channel for the lock is live,
        so the waiter is armed on it at once."""
        hub = self._hub
        holding = self._holding.get(keys.mutex)
        if holding is None or holding[0] == owner or hub is None:
            return None
        left = holding[1] - asyncio.get_running_loop().time()
        if left <= 0:
            del self._holding[keys.mutex]  # abandoned, or not renewed: ask the server
            return None
        if not hub.subscription(channel):
            return None
        return _busy(int(left * 1000))

    def _hold(self, keys: Keys, owner: str, sent: float, ms: int) -> None:
        if self._handoffs:
            self._holding[keys.mutex] = (owner, sent + ms / 1000)

    def _unhold(self, keys: Keys, owner: str) -> None:
        holding = self._holding.get(keys.mutex)
        if holding is not None and holding[0] == owner:
            del self._holding[keys.mutex]

    def _refused(self, channel: bytes, owner: str, ms: int, *, registered: bool) -> None:
        # The core arms the waiter in this very loop step (see _joined); an attempt that is
        # not followed by a wait (a single try) stops being expected with the step.
        if owner in self._armed:
            self._armed[owner] = ms  # a re-check: its waiter is armed already
        else:
            self._refused_ms[owner] = ms
        asyncio.get_running_loop().call_soon(self._refusal_ends, channel, owner, registered)

    def _refusal_ends(self, channel: bytes, owner: str, registered: bool) -> None:
        self._refused_ms.pop(owner, None)
        if registered:
            self._unexpect(channel, owner)

    async def _mutex_send(
        self, client: aioredis.Redis, keys: Keys, channel: bytes, owner: str, ms: int
    ) -> Any:
        # Once a connection is ours: if our channel for the lock is live now, a release
        # after this attempt that wakes us is heard, and kept until the waiter joins.
        hub = self._hub
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
        )

    def _unexpect(self, channel: bytes, owner: str) -> None:
        """``owner`` will not wait (granted, failed, or it was a single try): a wakeup kept
        for it goes on to the next client."""
        self._rechecks.drop(owner)
        hub = self._hub
        if hub is not None and hub.forget(channel, owner):
            self._pass_on(channel)

    def _pass_on(self, channel: bytes) -> None:
        """A wakeup reached one of this client's mutex channels with nobody left to use it:
        the next registered client gets it (``WAKE_NEXT``), in the background."""
        keys = wake_next_keys(channel, self._client)
        if keys is not None:
            self._passed_on += 1
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
            with self._errors["release"]:
                sent: tuple[Any, ...] = (*args, self._mode)
                await self._source.call_first(lua.run, script, keys, *sent)
        except BackendError as exc:
            _log.debug("%s failed: %s", what, exc)

    async def _hand_over(
        self, keys: Keys, channel: bytes, owner: str, taker: str, ms: int
    ) -> bool:
        """Release ``owner``'s lock by handing it to ``taker``, a waiter of this client, in
        one script (``MUTEX_HANDOFF``), unless another client has waited longer (then it is
        released to that one). The taker's lease is timed from this request; its re-check
        picks the grant up (:meth:`_mutex_attempt`).

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
            first=True,
        )
        reply.add_done_callback(partial(self._handed_over, keys, channel, taker, sent))
        answer = await asyncio.shield(reply)
        return bool(answer[0] != 0)

    def _handed_over(
        self, keys: Keys, channel: bytes, taker: str, sent: float, reply: asyncio.Future[Any]
    ) -> None:
        hub = self._hub
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

    def _taker(self, keys: Keys) -> tuple[bytes, str, int] | None:
        """This client's longest-waiting armed waiter for ``keys``' mutex, its channel and
        lease, if a release may hand the lock over to it."""
        hub = self._hub
        if hub is None or not self._handoffs or not self._armed:
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

    async def _fair_attempt(
        self, keys: Keys, owner: str, ms: int, *, first: bool
    ) -> Grant | Busy:
        # Always in a task of the source (``submit``): if we are cancelled while it is in
        # flight, its reply is still read (the connection is not dropped), and the release
        # that follows waits for it (_Attempts.landed). A release that overtook it on another
        # connection would find nothing, and the attempt would then queue an owner that
        # nobody releases: a dead head for a whole deadline.
        source = self._source
        hub = self._hub
        if hub is None:
            reply = await wait_outcome(
                source.submit(self._attempts.run, *self._fair_acquire(keys, owner, ms), first=first)
            )
            return Grant(reply[1]) if reply[0] == 1 else _busy(reply[1])
        try:
            reply = await wait_outcome(source.submit(self._fair_send, keys, owner, ms, first=first))
        except BaseException:
            self._fair_done(keys, owner)
            raise
        if reply[0] == 1:
            self._fair_done(keys, owner)  # granted (or handed the lock, and this confirmed it)
            return Grant(reply[1])
        busy = _busy(reply[1])
        self._rechecks.refused(owner, busy)
        return busy

    def _fair_done(self, keys: Keys, owner: str) -> None:
        """``owner`` no longer waits in the fair queue of ``keys``: forget what was kept for
        it (a release that follows gives back a lock handed to it meanwhile)."""
        self._rechecks.drop(owner)
        self._handed.pop(owner, None)
        self._fair_sent.pop(owner, None)
        if self._hub is not None:
            self._hub.forget(keys.client_signal(self._client), owner)

    def _fair_acquire(self, keys: Keys, owner: str, ms: int) -> tuple[Any, ...]:
        """What ``_Attempts.run`` takes to run ``owner``'s fair attempt (``FAIR_ACQUIRE``)."""
        return (
            lua.FAIR_ACQUIRE,
            keys.fair_acquire,
            owner,
            ms,
            self._mode,
            self._client,
            self._fence_ms,
        )

    def _fair_release(self, keys: Keys, owner: str) -> tuple[Any, ...]:
        """What the source runs to release ``owner``'s fair lock or take it off the queue
        (``FAIR_RELEASE``; in pub/sub mode it hands the lock to the queue's head)."""
        return (
            lua.run,
            lua.FAIR_RELEASE,
            keys.fair_release,
            owner,
            self._mode,
            self._fair_handoff,
            self._fence_ms,
        )

    def _fair_handed(self, owner: bytes, token: int) -> None:
        """A release handed ``owner``, a fair waiter of ours, the lock (see FAIR_RELEASE): its
        re-check takes the grant. The lease counts from its latest attempt's request, which
        the server ran before that release: no later than the server counts it."""
        name = owner.decode("utf-8", "surrogatepass")
        sent = self._fair_sent.get(name)
        if sent is not None:
            self._handed[name] = Grant(token, sent)

    async def _fair_send(
        self, client: aioredis.Redis, keys: Keys, owner: str, ms: int
    ) -> Any:
        # Pub/sub mode, once a connection is ours: if this client's channel for the lock is
        # live now, a release that follows this attempt reaches us, and is kept until the
        # waiter joins.
        hub = self._hub
        assert hub is not None
        channel = keys.client_signal(self._client)
        live = hub.subscription(channel)
        if live:
            hub.expect(channel, owner)
            self._rechecks.sent(owner, live)
        self._fair_sent[owner] = asyncio.get_running_loop().time()
        return await self._attempts.run(client, *self._fair_acquire(keys, owner, ms))

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Release-if-owner (also: leave the fair queue); notifies waiters.

        Served before queued attempts: it lets others go on. Sent only once ``owner``'s own
        attempt, if one is still in flight, has landed; a fair owner whose attempt never left
        this process is answered here, without a round trip.
        """
        keys = keys_for(spec.namespace, spec.name)
        kind = spec.kind
        call = self._source.call_first
        mode = self._mode
        attempts = self._attempts
        await attempts.landed(owner)
        with self._errors["release"]:
            if kind is Kind.MUTEX:
                if spec.fair:
                    self._fair_done(keys, owner)
                    left = await attempts.left(owner)
                    if left is not None:
                        return left  # it left its queue as its waiter ended (see waiter())
                    if not attempts.leave(owner):
                        return False
                    try:
                        done = await call(*self._fair_release(keys, owner))
                    except BaseException:
                        attempts.stay(owner)  # the outcome is unknown: a retry must be sent
                        raise
                else:
                    self._unhold(keys, owner)
                    taker = self._taker(keys)
                    if taker is not None:
                        return await self._hand_over(keys, taker[0], owner, taker[1], taker[2])
                    done = await call(
                        lua.run,
                        lua.MUTEX_RELEASE,
                        keys.mutex_release if self._signals is not None else keys.mutex_release_c,
                        owner,
                        mode,
                        self._client_id,
                        self._own_waiters(keys),
                        lua.COURTESY_MS,
                    )
            elif kind is Kind.READ:
                done = await call(lua.run, lua.READ_RELEASE, keys.read_release, owner, mode)
            elif kind is Kind.WRITE:
                done = await call(lua.run, lua.WRITE_RELEASE, keys.write_release, owner, mode)
            else:
                done = await call(
                    lua.run, lua.SEM_RELEASE, keys.sem_release, owner, mode, spec.limit
                )
        return bool(done == 1)

    def _own_waiters(self, keys: Keys) -> int:
        """How many of the clients a mutex release wakes are this client: its pub/sub
        subscription to the lock's channel (one for all its waiters), or its waiters in the
        BLPOP registry. Only the others make the release leave a courtesy (MUTEX_RELEASE)."""
        if self._hub is not None:
            return 1 if self._hub.subscribed(keys.signal) else 0
        if self._signals is not None:
            return self._signals.registered[keys.mutex_waiters]
        return 0

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Compare-and-extend to ``ttl`` from now; ``False`` (nothing recreated) if not held."""
        keys = keys_for(spec.namespace, spec.name)
        ms = _lease_ms(ttl)
        kind = spec.kind
        call = self._source.call_first  # a renewal that queues behind attempts risks the lease
        with self._errors["renew"]:
            if kind is Kind.MUTEX:
                sent = asyncio.get_running_loop().time()
                done = await call(lua.run, lua.MUTEX_RENEW, (keys.mutex,), owner, ms)
                holding = self._holding.get(keys.mutex)
                if done == 1 and holding is not None and holding[0] == owner:
                    self._holding[keys.mutex] = (owner, sent + ms / 1000)
            elif kind is Kind.WRITE:
                done = await call(lua.run, lua.MUTEX_RENEW, (keys.writer,), owner, ms)
            elif kind is Kind.READ:
                done = await call(lua.run, lua.ZSET_RENEW, (keys.readers,), owner, ms)
            else:
                done = await call(lua.run, lua.ZSET_RENEW, keys.sem_renew, owner, ms)
        return bool(done == 1)

    async def post_note(self, spec: LockSpec, owner: str, note: str, ttl: float) -> bool:
        """Noticeboard: ``T:note`` holds ``owner`` and the note; ``False`` if not held."""
        keys = keys_for(spec.namespace, spec.name)
        with self._errors["note"]:
            done = await self._source.call(
                lua.run, lua.NOTE_POST, (keys.mutex, keys.note), owner, note, _lease_ms(ttl)
            )
        return bool(done == 1)

    async def read_note(self, spec: LockSpec) -> str | None:
        """Noticeboard: the note of the mutex's current holder, if it posted one."""
        keys = keys_for(spec.namespace, spec.name)
        with self._errors["note"]:
            note = await self._source.call(lua.run, lua.NOTE_READ, (keys.mutex, keys.note))
        if note is None or isinstance(note, str):  # str: an app's client with decode_responses
            return note
        return bytes(note).decode("utf-8", "surrogatepass")

    # ---------------------------------------------------------------- operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern``, sorted by name.

        Walks the namespace's keys with ``SCAN`` (every primary, through the source), then
        reads each name's families in one read-only script (:data:`~._scripts.INSPECT`).
        Holders carry their remaining lease; waiters are counted where the service can tell
        (a fair queue, BLPOP waiter registries), else ``None``.
        """
        names: set[str] = set()
        async for key in self._source.scan_iter(namespace_match(namespace)):
            split = split_key(namespace, key)
            if split is not None and split[1] in _HELD_SUFFIXES:
                names.add(split[0])
        found: list[LockInfo] = []
        for name in sorted(n for n in names if fnmatch.fnmatchcase(n, pattern)):
            keys = keys_for(namespace, name)
            with self._errors["inspect"]:
                reply = await self._source.call(lua.run, lua.INSPECT, keys.inspect)
            found.extend(_lock_infos(name, reply))
        return found

    async def break_lock(self, spec: LockSpec) -> int:
        """Force-release: delete every holder of ``spec``'s family and move its fencing
        counter on, in one script (:data:`~._scripts.BREAK`); waiters are woken as by a
        release. The holders' next renewal is refused, so their watchdogs report the loss."""
        keys = keys_for(spec.namespace, spec.name)
        family_keys: tuple[bytes, ...]
        if spec.kind is Kind.MUTEX:
            family, family_keys = "m", keys.break_mutex
        elif spec.kind is Kind.SEMAPHORE:
            family, family_keys = "s", keys.break_sem
        else:
            family, family_keys = "rw", keys.break_rw
        with self._errors["break"]:
            dropped, _ = await self._source.call_first(
                lua.run, lua.BREAK, family_keys, family, self._mode, self._fence_ms
            )
        return int(dropped)

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """``None``: a Redis lease ends by expiry or deletion, which only ``renew`` can see."""
        return None

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """None: a Redis lease is a TTL lease, bounded by its renewals."""
        return None

    def waiter(
        self, spec: LockSpec, owner: str
    ) -> PubSubWaiter | ShardedWaiter | BlpopWaiter | _ArmedWaiter:
        """Arm a wakeup for one waiting acquisition (see :mod:`._pubsub`, :mod:`._blpop`).

        A fair waiter that ends with an exception (cancelled, timed out) also leaves the queue
        at once, in the same loop step, rather than when the core's compensating release gets
        its turn: until then it would be a dead head that everyone behind it waits for.
        """
        inner = self._waiter(spec, owner)
        hub = self._hub
        if spec.fair:
            channel = keys_for(spec.namespace, spec.name).client_signal(self._client)
            return _ArmedWaiter(
                inner,
                partial(self._joined, channel, owner),
                partial(self._leave_now, spec, owner),
            )
        if hub is not None and spec.kind is Kind.MUTEX:
            keys = keys_for(spec.namespace, spec.name)
            channel = keys.client_signal(self._client)
            return _ArmedWaiter(
                inner,
                partial(self._joined_mutex, channel, owner),
                partial(self._left_mutex, keys, owner),
            )
        return inner

    def _joined_mutex(self, channel: bytes, owner: str) -> None:
        self._joined(channel, owner)
        # A release of this client may hand it the lock, once its lease is known (0: from
        # its next refusal, if its first one was answered before a SUBSCRIBE).
        self._armed[owner] = self._refused_ms.get(owner, 0)

    def _left_mutex(self, keys: Keys, owner: str) -> None:
        # Left with an exception (timed out, cancelled, closed): a grant handed to it that
        # its re-check did not pick up goes back (one still in flight: see _handed_over).
        self._armed.pop(owner, None)
        if self._handed.pop(owner, None) is not None:
            self._give_back(keys, owner)
        hub = self._hub
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

    def _joined(self, channel: bytes, owner: str) -> None:
        # The waiter is armed. If the channel has stayed live since the attempt was sent,
        # every release after that attempt has reached the waiter (or was kept for it), so
        # the core's re-check can be answered without asking the server again.
        hub = self._hub
        if hub is not None:
            self._rechecks.joined(owner, hub.subscription(channel))

    def _leave_now(self, spec: LockSpec, owner: str) -> None:
        attempts = self._attempts
        if attempts.in_flight(owner) or not attempts.leave(owner):
            return  # the core's release waits for the attempt, then sends the release
        keys = keys_for(spec.namespace, spec.name)
        self._fair_done(keys, owner)
        leaving = self._source.submit(*self._fair_release(keys, owner), first=True)
        attempts.leaving(owner, leaving)

    def _waiter(self, spec: LockSpec, owner: str) -> PubSubWaiter | ShardedWaiter | BlpopWaiter:
        _ = self._source.client  # BackendError unless open
        keys = keys_for(spec.namespace, spec.name)
        kind = spec.kind
        hub = self._hub
        if hub is not None:
            if kind is Kind.MUTEX:
                # Fair waiters too: a release wakes the head on its client's channel.
                return hub.waiter(keys.client_signal(self._client), owner)
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


_HELD_SUFFIXES: Final = frozenset({b"", b":writer", b":readers", b":sem"})
"""Key suffixes of a name whose locks may be held (see :mod:`._keys`)."""


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)


def _members(flat: list[Any], now: int) -> tuple[HolderInfo, ...]:
    """ZSET ``member, expiry ms, ...`` pairs as holders with their remaining lease."""
    return tuple(
        HolderInfo(_text(flat[i]), max(float(flat[i + 1]) - now, 0.0) / 1000)
        for i in range(0, len(flat), 2)
    )


def _lock_infos(name: str, reply: list[Any]) -> list[LockInfo]:
    """The families of ``name`` held now, from an :data:`~._scripts.INSPECT` reply."""
    now, fence, owner, pttl, mutex_waiting, writer, writer_pttl, readers, rw_waiting = reply[:9]
    permits, sem_waiting = reply[9], reply[10]
    token = None if fence is None else int(fence)
    found = []

    def waiting(count: int) -> int | None:
        return int(count) or None  # pub/sub waiters are invisible to the server: unknown

    if owner is not None:
        holder = HolderInfo(_text(owner), max(int(pttl), 0) / 1000)
        found.append(LockInfo(name, Kind.MUTEX, (holder,), token, waiting(mutex_waiting)))
    if writer is not None:
        holder = HolderInfo(_text(writer), max(int(writer_pttl), 0) / 1000)
        found.append(LockInfo(name, Kind.WRITE, (holder,), token, waiting(rw_waiting)))
    elif readers:
        found.append(LockInfo(name, Kind.READ, _members(readers, now), token, waiting(rw_waiting)))
    if permits:
        holders = _members(permits, now)
        found.append(LockInfo(name, Kind.SEMAPHORE, holders, token, waiting(sem_waiting)))
    return found


class _Attempts:
    """What a release needs to know about the attempts of its owner: whether one is still in
    flight, and (fair locks) whether one ever reached the server.

    *In flight.* A release waits until its owner's attempt, if one is still running, has
    landed. The core releases right away when an attempt is interrupted, and a command that
    had to queue for a connection goes on without its caller (see :mod:`._node`): sent on
    another connection, the release could reach the server first and find nothing, and the
    attempt would then take the lock, or a place in the fair queue, for nobody.

    *Places in a fair queue.* An owner may hold a place at the server only once its attempt
    has a connection and is about to be sent. The core follows every refused or interrupted
    fair attempt with a release, also when its caller was cancelled while still queued for a
    connection; that release is answered here, without a round trip -- in a storm of
    cancellations most of them are. A place is given up as its release is sent (and taken
    back if that release fails), so the second of two overlapping releases of one owner (the
    core may compensate twice) costs nothing either.
    """

    __slots__ = ("_flight", "_leaving", "_places", "_replicated")

    def __init__(self, replicated: tuple[int, int] | None = None) -> None:
        # (replicas, timeout in ms): a grant returns once that many replicas have it.
        self._replicated = replicated
        self._flight: dict[str, asyncio.Future[None] | None] = {}
        self._places: set[str] = set()
        self._leaving: dict[str, asyncio.Future[Any]] = {}

    async def run(
        self,
        client: aioredis.Redis,
        script: lua.Script,
        keys: tuple[bytes, ...],
        owner: str,
        *args: Any,
    ) -> Any:
        """Run the acquire ``script`` for ``owner`` (by the source, once a connection is ours)."""
        if script is lua.FAIR_ACQUIRE:
            self._places.add(owner)
        flight = self._flight
        flight[owner] = None  # a future only once a release waits for it (rarely)
        try:
            if self._replicated is None:
                return await lua.run(client, script, keys, owner, *args)
            replicas, timeout_ms = self._replicated
            return await lua.run_replicated(
                client, script, keys, owner, *args, replicas=replicas, timeout_ms=timeout_ms
            )
        finally:
            landed = flight.pop(owner, None)
            if landed is not None:
                landed.set_result(None)

    def in_flight(self, owner: str) -> bool:
        """Whether an attempt of ``owner`` is running."""
        return owner in self._flight

    async def landed(self, owner: str) -> None:
        """Return once no attempt of ``owner`` is in flight."""
        flight = self._flight
        if owner not in flight:
            return
        landed = flight[owner]
        if landed is None:
            landed = flight[owner] = asyncio.get_running_loop().create_future()
        await asyncio.shield(landed)

    def leaving(self, owner: str, reply: asyncio.Future[Any]) -> None:
        """``owner`` gave up its place, and the release that leaves the queue is on its way."""
        self._leaving[owner] = reply
        reply.add_done_callback(partial(self._left, owner))

    def _left(self, owner: str, reply: asyncio.Future[Any]) -> None:
        if self._leaving.get(owner) is reply:
            del self._leaving[owner]
        if reply.cancelled() or reply.exception() is not None:
            self._places.add(owner)  # the outcome is unknown: a release must be sent again

    async def left(self, owner: str) -> bool | None:
        """Wait for the release sent by :meth:`leaving`, if any: whether it released the lock,
        or None (none was sent, or it failed: ``owner`` holds its place again)."""
        reply = self._leaving.get(owner)
        if reply is None:
            return None
        if not reply.done():
            await asyncio.wait((reply,))  # neither raises its error nor cancels it
        if reply.cancelled() or reply.exception() is not None:
            self._places.add(owner)
            return None
        return bool(reply.result() == 1)

    def queued(self, owner: str) -> bool:
        """Whether ``owner`` may hold a place in a fair queue (or the fair lock)."""
        return owner in self._places

    def leave(self, owner: str) -> bool:
        """Give up ``owner``'s place before releasing it: ``False`` if it has none (never
        sent, or another release of it is under way or done) and nothing need be sent."""
        if owner not in self._places:
            return False
        self._places.discard(owner)
        return True

    def stay(self, owner: str) -> None:
        """The release of ``owner`` failed or was interrupted: it may still hold its place."""
        self._places.add(owner)


class _ArmedWaiter:
    """A wakeup whose arming the backend follows: ``joined`` is called once it is armed,
    ``leave`` (if any) when it is left with an exception (a fair waiter leaves its queue)."""

    __slots__ = ("_inner", "_joined", "_leave")

    def __init__(
        self,
        inner: PubSubWaiter | ShardedWaiter | BlpopWaiter,
        joined: Callable[[], None],
        leave: Callable[[], None] | None,
    ) -> None:
        self._inner = inner
        self._joined = joined
        self._leave = leave

    async def __aenter__(self) -> _ArmedWaiter:
        await self._inner.__aenter__()
        self._joined()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self._leave is not None:
            self._leave()
        await self._inner.__aexit__(exc_type, exc, tb)

    async def wait(self, timeout: float | None) -> None:
        """Return when woken (or a wakeup was banked), or after ``timeout`` seconds."""
        await self._inner.wait(timeout)


class _Entries:
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


class _Rechecks:
    """Waiters (pub/sub mode: fair ones, and mutex waiters whose client registers) whose
    re-check may be answered without a round trip.

    The core re-checks right after arming a wakeup, because a release between the refused
    attempt and the arming would otherwise be missed. A fair waiter's wakeup is addressed to
    it by owner id, a mutex waiter's to its client (which its refusal registered, on the
    client's own channel); when that channel was live before the attempt was sent, and is
    still the same subscription once the waiter is armed, every such wakeup published after
    the attempt has reached the hub, which keeps it for the waiter (``PubSubHub.expect``).
    Then nothing can have been missed, and the re-check is the attempt's own refusal again
    -- one round trip fewer for every waiter, which a storm of short-lived waiters feels.
    The refusal's ``retry_after`` still bounds the wait (a holder that crashed publishes
    nothing).
    """

    __slots__ = ("_by_owner",)

    def __init__(self) -> None:
        # owner -> (the live subscription when its attempt was sent, the refusal or None,
        # whether its waiter joined while that subscription was still live)
        self._by_owner: dict[str, tuple[int, Busy | None, bool]] = {}

    def sent(self, owner: str, subscription: int) -> None:
        self._by_owner[owner] = (subscription, None, False)

    def refused(self, owner: str, busy: Busy) -> bool:
        """Note ``owner``'s refusal; False if its attempt was not sent on a live channel."""
        entry = self._by_owner.get(owner)
        if entry is None:
            return False
        self._by_owner[owner] = (entry[0], busy, False)
        return True

    def joined(self, owner: str, subscription: int) -> None:
        entry = self._by_owner.get(owner)
        if entry is None:
            return
        if entry[1] is None or entry[0] != subscription:
            del self._by_owner[owner]
        else:
            self._by_owner[owner] = (entry[0], entry[1], True)

    def answer(self, owner: str) -> Busy | None:
        """The refusal that answers ``owner``'s re-check, once; None: ask the server."""
        entry = self._by_owner.pop(owner, None)
        if entry is None or not entry[2]:
            return None
        return entry[1]

    def drop(self, owner: str) -> None:
        self._by_owner.pop(owner, None)


class _SignalScripts:
    """The commands BLPOP waiters need (:class:`~._blpop.SignalCommands`), run like every
    lock step: on a command connection of the source, bounded, errors translated."""

    __slots__ = ("_arming", "_errors", "_source")

    def __init__(self, source: ConnectionSource) -> None:
        self._source = source
        self._errors = source.errors("wakeup")
        # (registry, owner) -> resolved once its WAIT_ARM in flight has landed.
        self._arming: dict[tuple[bytes, str], asyncio.Future[None]] = {}

    async def arm_waiter(self, registry: bytes, owner: str) -> None:
        """Register ``owner`` in ``registry`` (``WAIT_ARM``); raise ``BackendError``.

        Run in a task of the source, so that once sent it lands even if the caller gives
        up, and a deregistration of the same owner waits for it rather than overtaking it
        on another connection (which would leave the registry behind).
        """
        with self._errors:
            await wait_outcome(self._source.submit(self._arm, registry, owner))

    async def _arm(self, client: aioredis.Redis, registry: bytes, owner: str) -> None:
        key = (registry, owner)
        landed = self._arming[key] = asyncio.get_running_loop().create_future()
        try:
            await lua.run(client, lua.WAIT_ARM, (registry,), owner, lua.WAITERS_TTL_MS)
        finally:
            if self._arming.get(key) is landed:
                del self._arming[key]
            landed.set_result(None)

    async def leave_waiter(self, registry: bytes, lists: tuple[bytes, ...], owner: str) -> None:
        """Deregister ``owner`` (``WAIT_LEAVE``), once its registration has landed; best
        effort, never raises."""
        landed = self._arming.get((registry, owner))
        if landed is not None:
            await asyncio.wait((landed,))
        # Best effort: the registry's TTL bounds what a failed deregistration leaves.
        with contextlib.suppress(BackendError, RedisError, OSError):
            await self._source.call(lua.run, lua.WAIT_LEAVE, (registry, *lists), owner)

    async def push_back(self, key: bytes, registry: bytes, cap: int) -> None:
        """Hand a wake token back to ``key`` (``SIGNAL_PUSH``); best effort, never raises."""
        # Best effort: the waiters' caps bound what a lost token costs.
        with contextlib.suppress(BackendError, RedisError, OSError):
            await self._source.call(lua.run, lua.SIGNAL_PUSH, (key, registry), cap)
