""":class:`RedisBackend`: the backend protocol on one Redis deployment (``redis://``,
``rediss://``, ``unix://``, ``redis+sentinel://``, ``redis+cluster://``).

Every lock step is one Lua script (:mod:`._scripts`), atomic on the server and one round trip,
on the keys of one lock name (:mod:`._keys`), sent through a connection source
(:mod:`._source`). This module chooses, per call, which script runs on which keys and reads
the replies; fair queues are :mod:`._fair`'s, handoffs between the tasks of one client
:mod:`._handoff`'s, wakeups :mod:`._pubsub`'s or :mod:`._blpop`'s. docs/redis.md has the design.

Example::

    async with aiodlock.connect("redis://localhost:6379/0") as locks:
        async with locks.lock("order:42", ttl=10) as lease:
            print(lease.fencing_token)
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Coroutine, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from .. import (
    Busy,
    Capability,
    Grant,
    Kind,
    LimitMismatchError,
    LockInfo,
    LockSpec,
    Tasks,
    UnsupportedError,
)
from . import _scripts as lua
from ._armed import ArmedWaiter
from ._attempts import Attempts
from ._blpop import BlockingSignals, BlpopWaiter
from ._cluster import ClusterSource
from ._fair import FairQueue
from ._handoff import Handoff
from ._keys import Keys, keys_for
from ._keyspace import check_keyspace_events, holds
from ._losses import Losses
from ._operator import Operator
from ._pubsub import PubSubHub, PubSubWaiter
from ._rechecks import Rechecks
from ._settings import OPTIONS, Settings, busy, lease_ms, make_source
from ._sharded import AnyMaster, ShardedHub, ShardedWaiter
from ._signal_scripts import SignalScripts
from ._source import disconnect_quietly
from ._waiters import plain_waiter

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import AbstractConnection

    from .. import ParsedURL

__all__ = ["RedisBackend"]

_BACKGROUND = "aiodlock-redis-background"
"""The name of the backend's background tasks (clean-ups, BLPOP reads, disconnects)."""


class RedisBackend:
    """Locks on one Redis server (see the module docstring for scripts and waiting).

    Options (URL query or keyword): ``wakeup`` (``"pubsub"`` default, or ``"blpop"``),
    ``connect_timeout`` (seconds, default 5; bounds connecting, AUTH and the first PING),
    ``request_timeout`` (alias ``socket_timeout``; seconds, default 5; bounds each command),
    ``max_connections``
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
    ``keyspace_events`` (bool, default false; not on a cluster): also hear an external
    ``DEL`` of a held key at once, through the server's key events (its
    ``notify-keyspace-events`` must include ``Eg``; checked at connect). A ``break_lock()``
    is heard at once without it (see :mod:`._losses`).

    Example::

        async with aiodlock.connect("redis://localhost:6379/0?wakeup=pubsub") as locks:
            async with locks.lock("order:42", ttl=10) as lease:
                print(lease.fencing_token)

        async with aiodlock.connect("rediss://cache:6380/0?tls_ca=/etc/ssl/ca.pem"):
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
    options: ClassVar[Mapping[str, type]] = OPTIONS

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        settings = self._settings = Settings(url, options)
        source = self._source = make_source(url, options)
        self._where = source.describe()
        self._wakeup = settings.wakeup
        self._mode = settings.mode
        self._fence_ms = settings.fence_ms
        self._errors = {action: source.errors(action) for action in ("acquire", "release", "renew")}
        self._tasks: Tasks | None = None
        self._cleanups: set[asyncio.Task[None]] = set()
        self._hub: PubSubHub | ShardedHub | None = None
        self._signals: BlockingSignals | None = None
        self._attempts = Attempts(settings.replicated(source))
        self._rechecks = Rechecks()
        self._opened = False
        self._closed = False
        # Names this client in the mutex scripts (its courtesy, its place among the waiting
        # clients and its own channel: see _handoff).
        self._client_id = secrets.token_hex(8)
        self._client = self._client_id.encode()
        self._handoff = Handoff(
            source,
            self._attempts,
            self._rechecks,
            settings,
            self._client_id,
            clean_up=self._clean_up,
        )
        self._fair = FairQueue(
            source,
            self._attempts,
            self._rechecks,
            settings,
            self._client,
            handoffs=not settings.wait_replicas,
        )
        self._operator = Operator(source, mode=settings.mode, fence_ms=settings.fence_ms)
        self._losses = Losses(spawn=self._spawn, verify=self._verify)
        self._keyspace: bytes | None = None  # the del-event channel (keyspace_events)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._opened else "new"
        return f"<RedisBackend {self._where} wakeup={self._wakeup} {state}>"

    # ---------------------------------------------------------------- lifetime

    async def open(self, tasks: Tasks) -> None:
        """Connect and PING (bounded by ``connect_timeout``), load the scripts, start waking."""
        if self._opened or self._closed:
            raise RuntimeError("a RedisBackend is opened once")
        await self._source.open(tasks, self._prepare)
        self._opened = True
        self._tasks = tasks
        if self._wakeup == "pubsub":
            source = self._source
            unclaimed, handed = self._handoff.pass_on, self._fair.on_handed
            hub = self._hub = (
                ShardedHub(source, unclaimed=unclaimed, handed=handed)
                if isinstance(source, ClusterSource)
                else PubSubHub(source, unclaimed=unclaimed, handed=handed)
            )
            self._handoff.hub = self._fair.hub = hub
            hub.start(tasks)
            if isinstance(hub, PubSubHub):
                self._losses.bind([hub])
        else:
            self._signals = BlockingSignals(
                self._source,
                SignalScripts(self._source),
                spawn=self._spawn,
                clean_up=self._clean_up,
            )
        if not isinstance(self._hub, PubSubHub):
            # BLPOP mode, or a cluster's sharded hubs: losses are heard on a plain
            # subscription of their own (connected once something is held).
            source = self._source
            side = (
                AnyMaster(source, b"aiodlock", "losses")
                if isinstance(source, ClusterSource)
                else source
            )
            self._losses.listen_on_own(PubSubHub(side), tasks)
        if self._keyspace is not None:
            self._losses.watch_deletions(self._keyspace)

    async def _prepare(self, client: aioredis.Redis) -> None:
        """Load the scripts; with ``keyspace_events``, check the server sends key events."""
        await lua.load_all(client)
        if self._settings.keyspace_events:
            self._keyspace = await check_keyspace_events(client, self._where)

    async def _verify(self, key: bytes, spec: LockSpec, owner: str) -> bool:
        """Whether ``owner`` still holds its lease in ``key`` (after a ``del`` event)."""
        with self._errors["renew"]:
            return await holds(self._source, key, spec, owner)

    async def aclose(self) -> None:
        """Close the pub/sub connection, its tasks, BLPOP connections and the pool.

        Idempotent. Waiters are woken and their next attempt fails with ``BackendError``;
        commands already in flight finish (within ``request_timeout``) before the pool
        closes, so no connection is reopened behind our back.
        """
        if self._closed:
            return
        self._closed = True
        if self._hub is not None:
            self._hub.close()
        self._losses.close()
        idle: list[AbstractConnection] = []
        if self._signals is not None:
            idle = self._signals.close()
        # From here on every command fails fast (the source is closing); none of our tasks
        # below uses the pool, so it may close before they end.
        await self._source.aclose()
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            for conn in idle:
                tasks.try_spawn(disconnect_quietly(conn), _BACKGROUND)
            # Our tasks end on cancellation (the hub's, the BLPOP reads: cancelled above) or
            # soon (clean-ups, disconnects): let them finish, as they always did, then close.
            await tasks.wait()
            await tasks.aclose()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        # Background work runs in our share of the client's tasks; once closing, nothing
        # new starts.
        tasks = self._tasks
        if tasks is None or self._closed:
            coro.close()
            return None
        return tasks.try_spawn(coro, _BACKGROUND)

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
        self._losses.settle()
        if self._hub is not None:
            await self._hub.settle()
        await self._losses.settle_hub()

    # ---------------------------------------------------------------- protocol

    def check(self, spec: LockSpec) -> None:
        """Fairness is offered for the mutex only."""
        if spec.fair and spec.kind is not Kind.MUTEX:
            raise UnsupportedError(
                f"redis offers fair=True for locks.lock() only, not for {spec.kind.value} locks"
            )

    @property
    def request_timeout(self) -> float:
        """Seconds one request may take (the ``request_timeout`` option)."""
        return self._source.request_timeout

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
            stats["wakeups_passed_on"] = self._handoff.passed_on
        elif self._signals is not None:
            stats.update(self._signals.statistics())
        else:
            stats.update(pubsub_connections=0, subscribed_channels=0, waiters=0)
        stats.update(self._losses.statistics())
        return stats

    def hears_losses(self, namespace: str) -> bool:
        """Whether a break of a lock of ``namespace`` (and, with ``keyspace_events``, a
        deletion) reaches this client now: it listens once it held a lock there."""
        return self._losses.listening(namespace)

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """One attempt; ``Busy.retry_after`` is the blocking lease's remaining time + 1 ms."""
        keys = keys_for(spec.namespace, spec.name)
        ms = lease_ms(ttl)
        kind = spec.kind
        call = self._source.call
        attempt = self._attempts.run  # notes what the releases that follow need to know
        fence = self._fence_ms
        last = (fence, self._settings.identity)  # every acquire script's last two ARGVs
        signals = self._signals  # BLPOP mode: pass the keys a granted waiter leaves
        with self._errors["acquire"]:
            if kind is Kind.MUTEX:
                if spec.fair:
                    fair = self._fair
                    handed = fair.handed.get(owner)
                    if handed is not None:
                        fair.done(keys, owner)
                        return handed
                    answer = self._rechecks.answer(owner)
                    if answer is not None:
                        return answer
                    if self._attempts.queued(owner):
                        # In the queue already: this attempt may be the one that takes the
                        # lock, and everyone behind it waits for it.
                        return await fair.attempt(keys, owner, ms, first=True)
                    async with fair.entries.turn(keys.mutex):
                        return await fair.attempt(keys, owner, ms, first=False)
                elif self._hub is not None:
                    return await self._handoff.attempt(keys, owner, ms)
                else:
                    mutex_keys = keys.mutex_acquire if signals is None else keys.mutex_acquire_l
                    reply = await call(
                        attempt, lua.MUTEX_ACQUIRE, mutex_keys, owner, ms, self._client_id, *last
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
                reply = await call(attempt, lua.READ_ACQUIRE, read_keys, owner, ms, chain, *last)
            elif kind is Kind.WRITE:
                write_keys = keys.write_acquire if signals is None else keys.write_acquire_l
                reply = await call(attempt, lua.WRITE_ACQUIRE, write_keys, owner, ms, *last)
            else:
                sem_keys = keys.sem_acquire if signals is None else keys.sem_acquire_l
                reply = await call(attempt, lua.SEM_ACQUIRE, sem_keys, owner, ms, spec.limit, *last)
        if reply[0] == 1:
            return Grant(reply[1])
        if reply[0] == -1:  # SEM_ACQUIRE: the holders use another limit; nothing was taken
            raise LimitMismatchError(spec.name, int(reply[1]), spec.limit)
        return busy(reply[1])

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
        self._losses.drop(owner)  # a deletion from here on is ours
        await attempts.landed(owner)
        with self._errors["release"]:
            if kind is Kind.MUTEX:
                if spec.fair:
                    self._fair.done(keys, owner)
                    left = await attempts.left(owner)
                    if left is not None:
                        return left  # it left its queue as its waiter ended (see waiter())
                    if not attempts.leave(owner):
                        return False
                    try:
                        done = await call(*self._fair.release_call(keys, owner))
                    except BaseException:
                        attempts.stay(owner)  # the outcome is unknown: a retry must be sent
                        raise
                else:
                    handoff = self._handoff
                    handoff.unhold(keys, owner)
                    taker = handoff.taker(keys)
                    if taker is not None:
                        return await handoff.hand_over(keys, taker[0], owner, taker[1], taker[2])
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
        ms = lease_ms(ttl)
        kind = spec.kind
        call = self._source.call_first  # a renewal that queues behind attempts risks the lease
        with self._errors["renew"]:
            if kind is Kind.MUTEX:
                sent = asyncio.get_running_loop().time()
                done = await call(lua.run, lua.MUTEX_RENEW, (keys.mutex,), owner, ms)
                if done == 1:
                    self._handoff.renewed(keys, owner, sent, ms)
            elif kind is Kind.WRITE:
                done = await call(lua.run, lua.MUTEX_RENEW, (keys.writer,), owner, ms)
            elif kind is Kind.READ:
                done = await call(lua.run, lua.ZSET_RENEW, (keys.readers,), owner, ms)
            else:
                done = await call(lua.run, lua.ZSET_RENEW, keys.sem_renew, owner, ms)
        if done != 1:
            self._losses.drop(owner)  # told by the renewal
            return False
        return True

    # ---------------------------------------------------------------- noticeboard, operators

    async def post_note(self, spec: LockSpec, owner: str, note: str, ttl: float) -> bool:
        """Noticeboard: ``T:note`` holds ``owner`` and the note; ``False`` if not held."""
        return await self._operator.post_note(spec, owner, note, ttl)

    async def read_note(self, spec: LockSpec) -> str | None:
        """Noticeboard: the note of the mutex's current holder, if it posted one."""
        return await self._operator.read_note(spec)

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern`` (see
        :meth:`~._operator.Operator.inspect`)."""
        return await self._operator.inspect(namespace, pattern)

    async def namespaces(self) -> list[str]:
        """The namespaces with a lock held or waited for, sorted (see
        :meth:`~._operator.Operator.namespaces`)."""
        return await self._operator.namespaces()

    async def break_lock(self, spec: LockSpec) -> int:
        """Force-release every holder of ``spec``'s family (see
        :meth:`~._operator.Operator.break_lock`)."""
        return await self._operator.break_lock(spec)

    # ---------------------------------------------------------------- waiting

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """Set when a ``BREAK`` drops ``owner``'s lease (or, with ``keyspace_events``, its key
        is deleted): heard on the namespace's broken channel (see :mod:`._losses`). An
        expiry, or a message missed while reconnecting, is for ``renew`` to see."""
        return self._losses.signal(spec, owner)

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """None: a Redis lease is a TTL lease, bounded by its renewals."""
        return None

    def waiter(
        self, spec: LockSpec, owner: str
    ) -> PubSubWaiter | ShardedWaiter | BlpopWaiter | ArmedWaiter:
        """Arm a wakeup for one waiting acquisition (see :mod:`._pubsub`, :mod:`._blpop`).

        A fair waiter that ends with an exception (cancelled, timed out) also leaves the queue
        at once, in the same loop step, rather than when the core's compensating release gets
        its turn: until then it would be a dead head that everyone behind it waits for.
        """
        _ = self._source.client  # BackendError unless open
        hub = self._hub
        inner = plain_waiter(hub, self._signals, self._client, spec, owner)
        if spec.fair:
            keys = keys_for(spec.namespace, spec.name)
            channel = keys.client_signal(self._client)
            return ArmedWaiter(
                inner,
                partial(self._fair.joined, channel, owner),
                partial(self._fair.leave_now, keys, owner),
            )
        if hub is not None and spec.kind is Kind.MUTEX:
            keys = keys_for(spec.namespace, spec.name)
            channel = keys.client_signal(self._client)
            return ArmedWaiter(
                inner,
                partial(self._handoff.joined, channel, owner),
                partial(self._handoff.left, keys, owner),
            )
        return inner
