"""The Redlock backend: ``redlock://[[user]:password@]h1:p1,h2:p2,h3:p3[/DB]``.

N independent Redis masters (N odd, at least 3), one :class:`~._node.NodeSource` each, and the
single-node Lua scripts (:mod:`._scripts`) run on every one of them. An attempt is sent to every
master at once and is ours once a quorum granted it, valid until ``start + ttl - drift``;
otherwise it is given back (:mod:`._redlock_rounds`). Fencing tokens are the quorum's maximum,
written back to a quorum; waiters wait on one pub/sub hub per master (:mod:`._quorum_waiter`).
docs/redlock.md explains the algorithm, its validity rule and its limits.

Example::

    async with aiodlock.connect("redlock://r1:6379,r2:6379,r3:6379/0?drift_factor=0.02") as locks:
        async with locks.lock("order:42", ttl=10) as lease:
            print(lease.fencing_token)
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Final

from .. import (
    BackendError,
    Busy,
    Capability,
    Grant,
    Kind,
    LimitMismatchError,
    LockInfo,
    LockSpec,
    Tasks,
    UnsupportedError,
    canonical_options,
    check_bool,
    check_seconds,
    with_aliases,
)
from . import _scripts as lua
from ._keys import keys_for
from ._keyspace import holds_on
from ._losses import Losses
from ._node import NodeSource
from ._pubsub import PubSubHub
from ._quorum import Round
from ._quorum_connect import QuorumConnect
from ._quorum_waiter import QuorumWaiter
from ._redlock_inspect import break_on_masters, inspect_masters, namespaces_on_masters
from ._redlock_rounds import (
    Masters,
    acquire_call,
    arbiter,
    load,
    quorum,
    renew_call,
    retry_after,
)
from ._redlock_wake import ArbiterWakeups
from ._settings import identity_arg, lease_ms

if TYPE_CHECKING:
    from .. import ParsedURL

__all__ = ["RedlockBackend", "quorum"]

_log = logging.getLogger("aiodlock.redis")

_DEFAULT_DRIFT_FACTOR: Final = 0.01
_DRIFT_FLOOR: Final = 0.002  # the Redis docs' "+ 2 ms"
_DEFAULT_NODE_TIMEOUT: Final = 0.1  # of ttl
_MIN_NODE_TIMEOUT: Final = 0.05  # seconds: below this a busy machine answers "no" too often
_WRITE_PHASE_CAP: Final = 1.0
"""Seconds the fencing write phase may wait beyond node_timeout (within the grant's validity):
the masters it writes to answered a moment ago, so only a stall (a loaded machine) delays it,
and with a short ttl node_timeout alone (50 ms at ttl 0.5) turned such stalls into failed
acquisitions."""
_DEFAULT_FENCE_TTL: Final = 7 * 24 * 3600.0
_DEFAULT_REQUEST_TIMEOUT: Final = 2.0
_ALIASES: Final[Mapping[str, str]] = {"ssl": "tls"}
"""Redlock's own spelling of the shared ``tls`` (the masters' options have theirs: see
:mod:`._node_settings`)."""
_BACKGROUND = "aiodlock-redlock-background"
"""The name of the backend's background tasks (late releases, deferred attempts)."""


def _factor(options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"option {key} must be a number, not {type(value).__name__}")
    if not (0 <= value < 1) or math.isnan(value):
        raise ValueError(f"option {key} must be a fraction of ttl in [0, 1), not {value!r}")
    return float(value)


class RedlockBackend:
    """Locks on N independent Redis masters (see the module docstring).

    Options (URL query or keyword): ``drift_factor`` (clock drift, a fraction of ttl, default
    0.01; the validity of a grant is ``ttl - elapsed - drift_factor * ttl - 2 ms``),
    ``node_timeout`` (how long one master may take to answer within a round, a fraction of
    ttl, default 0.1, at least 50 ms), ``fence_ttl`` (seconds a fencing counter outlives its
    last grant, default 7 days; 0: forever), ``tls`` (alias ``ssl``: TLS to every master, with
    the TLS options of ``rediss://``), and per master ``connect_timeout`` (default 5 s),
    ``request_timeout`` (alias ``socket_timeout``; default 2 s: how long a silent master keeps
    a command connection busy) and ``max_connections`` (default 2).
    """

    queues_on_busy: ClassVar[bool] = False
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.EXCLUSIVE,
            Capability.SHARED,
            Capability.COUNTING,
            Capability.FENCING,
            Capability.TTL_LEASE,
            Capability.SERVER_WAKEUP,
            Capability.INSPECT,
            Capability.BREAK,
        }
    )
    options: ClassVar[Mapping[str, type]] = {
        "drift_factor": float,
        "node_timeout": float,
        "fence_ttl": float,
        "identity": str,  # stored with each grant on every master, for inspect
        **with_aliases({"tls": bool}, _ALIASES),
        **NodeSource.options,
    }

    def __init__(self, url: ParsedURL, given: Mapping[str, Any]) -> None:
        count = len(url.hosts)
        if count < 3 or count % 2 == 0:
            raise ValueError(
                f"redlock:// needs an odd number of independent masters, at least 3; "
                f"the url names {count}"
            )
        options = canonical_options(given, _ALIASES)
        self._drift = _factor(options, "drift_factor", _DEFAULT_DRIFT_FACTOR)
        self._node_timeout = _factor(options, "node_timeout", _DEFAULT_NODE_TIMEOUT)
        fence = check_seconds(
            options.get("fence_ttl", _DEFAULT_FENCE_TTL),
            argument="option fence_ttl",
            allow_none=False,
            allow_zero=True,
        )
        assert fence is not None
        self._fence_ms = 0 if fence == 0 else lease_ms(fence)
        tls = options.get("tls")
        if tls is not None:
            check_bool(tls, argument=f"option {options.given('tls')}")
        scheme = "rediss" if tls else "redis"
        node_options = {k: v for k, v in options.items() if k in NodeSource.options}
        if node_options.get("request_timeout", node_options.get("socket_timeout")) is None:
            # A master that stopped answering holds a command connection this long; a
            # quorum goes on without it after node_timeout, so keep the backlog short.
            node_options.pop("socket_timeout", None)
            node_options["request_timeout"] = _DEFAULT_REQUEST_TIMEOUT
        self._sources = [
            NodeSource(replace(url, scheme=scheme, hosts=(host,), query={}, raw=""), node_options)
            for host in url.hosts
        ]
        self._majority = count // 2 + 1
        self._client_id = secrets.token_hex(8)
        self._identity = identity_arg(options)
        self._where = url.redacted()
        self._masters = Masters(
            self._sources,
            where=self._where,
            fence_ms=self._fence_ms,
            client_id=self._client_id,
            spawn=self._spawn,
        )
        self._wake = ArbiterWakeups(
            self._masters, self._client_id, self._spawn, lambda owner: owner in self._waiting
        )
        self._connects = QuorumConnect(
            self._sources, load, majority=self._majority, where=self._where
        )
        self._hubs: list[PubSubHub] = []
        # Breaks, heard on every master's hub.
        self._losses = Losses(spawn=self._spawn, verify=self._verify)
        self._tasks: Tasks | None = None
        self._background: set[asyncio.Task[None]] = set()
        # owner -> loop time until which a quorum surely holds its lease (the validity rule)
        self._valid: dict[str, float] = {}
        self._ttls: dict[str, float] = {}  # owner -> the ttl of its lease
        self._waiting: set[str] = set()  # owners inside waiter(): see Masters.arbiter_first
        self._opened = False
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._opened else "new"
        return f"<RedlockBackend {self._where} masters={len(self._sources)} {state}>"

    # ---------------------------------------------------------------- lifetime

    async def open(self, tasks: Tasks) -> None:
        """Connect to every master in parallel; return once a quorum has (the rest keep
        connecting in the background, see :mod:`._quorum_connect`, and take part in the
        rounds once they answer)."""
        if self._opened or self._closed:
            raise RuntimeError("a RedlockBackend is opened once")
        try:
            await self._connects.start(tasks)
        except BaseException:
            await asyncio.gather(*(s.aclose() for s in self._sources), return_exceptions=True)
            raise
        self._opened = True
        self._tasks = tasks
        for i, source in enumerate(self._sources):
            hub = PubSubHub(source, unclaimed=partial(self._wake.unclaimed, i))
            hub.start(tasks)
            self._hubs.append(hub)
        self._losses.bind(self._hubs)
        self._wake.bind(self._hubs)

    async def aclose(self) -> None:
        """Close every hub and every master's connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._losses.close()
        for hub in self._hubs:
            hub.close()
        await self._connects.aclose()  # first: a connect landing later would stay open
        await asyncio.gather(*(s.aclose() for s in self._sources), return_exceptions=True)
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            await tasks.aclose()  # the late releases too: their keys end by their TTL

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        tasks = self._tasks
        if tasks is None or self._closed:
            coro.close()
            return None
        task = tasks.try_spawn(coro, _BACKGROUND)
        if task is not None:
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return task

    async def settle(self) -> None:
        """Wait for the releases still running on slow masters, then end the subscriptions
        that only linger."""
        while self._background:
            await asyncio.wait(set(self._background))
        self._losses.settle()
        for hub in self._hubs:
            await hub.settle()

    # ---------------------------------------------------------------- protocol

    def check(self, spec: LockSpec) -> None:
        """No fair locks on Redlock."""
        if spec.fair:
            raise UnsupportedError("redlock:// does not offer fair=True locks")

    @property
    def request_timeout(self) -> float:
        """Seconds one request may take (the ``request_timeout`` option)."""
        return self._sources[0].request_timeout

    def describe(self) -> str:
        """The URL without its password."""
        return self._where

    def statistics(self) -> Mapping[str, Any]:
        """Per-backend totals over the masters' hubs."""
        stats: dict[str, Any] = {
            "masters": len(self._sources),
            "masters_connected": self._connects.connected,
        }
        for hub in self._hubs:
            for key, value in hub.statistics().items():
                stats[key] = stats.get(key, 0) + value
        stats.update(self._losses.statistics())
        return stats

    def _timeout(self, ttl: float) -> float:
        return max(self._node_timeout * ttl, _MIN_NODE_TIMEOUT)

    def _drift_of(self, ttl: float) -> float:
        return self._drift * ttl + _DRIFT_FLOOR

    def _fan_out(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        first: bool = False,
    ) -> list[asyncio.Future[Any]]:
        return [source.submit(fn, *args, first=first) for source in self._sources]

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """Acquire on every master at once: a quorum, or give it back everywhere."""
        keys = keys_for(spec.namespace, spec.name)
        masters = self._masters
        n = len(self._sources)
        call = partial(
            acquire_call,
            spec,
            keys,
            owner,
            lease_ms(ttl),
            client_id=self._client_id,
            fence_ms=self._fence_ms,
            identity=self._identity,
        )
        calls = [call()] * n
        lead = arbiter(keys, n) if spec.kind is Kind.MUTEX else None
        waiting = owner in self._waiting
        if lead is not None:
            courtesy = self._wake.courtesy(keys)
            if courtesy > 0 and waiting:
                # Our release woke another client, and our first attempt since was refused
                # (and registered) by the arbiter: a re-check within the courtesy would be too.
                return Busy(courtesy)
            waiting = waiting or self._wake.deferring(keys, lead)
            await self._wake.registered(keys, self._timeout(ttl))
            calls[lead] = call(registers=self._wake.registers(keys, lead))
        need = quorum(n, spec)
        loop = asyncio.get_running_loop()
        start = loop.time()

        def send(i: int, floor: int | None = None) -> asyncio.Future[Any]:
            script, script_keys, args = calls[i]
            if floor is not None:  # the arbiter's token: see _scripts.next_token
                args = (*args[:-2], f"{args[-2]}:{floor}", args[-1])
            return masters.send(owner, i, script=script, keys=script_keys, args=args)

        # Done before giving back: the masters an attempt skipped so far stay unasked.
        abandoned: asyncio.Future[None] = loop.create_future()
        patience = self._timeout(ttl)
        if lead is not None and waiting:
            futures = masters.arbiter_first(send, lead, patience, abandoned)
            # The others may be asked only once the arbiter's patience is over (it is
            # silent): they get their own per-master timeout after it.
            patience *= 2
        else:
            futures = [send(i) for i in range(n)]
        masters.track(owner, futures)
        rnd = Round(futures)

        def enough(r: Round) -> bool:
            granted = sum(1 for v in r.replies.values() if v[0] == 1)
            refused = len(r.replies) + len(r.errors) - granted
            return granted >= need or refused > n - need

        fenced = True
        try:
            await rnd.gather(patience, enough)
            granted = {i: int(v[1]) for i, v in rnd.replies.items() if v[0] == 1}
            if len(granted) >= need:
                valid_until = start + ttl - self._drift_of(ttl)
                # The write phase may take until the grant's validity ends (a grant is usable
                # until then), but at least node_timeout and at most _WRITE_PHASE_CAP more.
                left = valid_until - loop.time()
                budget = max(self._timeout(ttl), min(left, _WRITE_PHASE_CAP))
                token = await masters.raise_fence(keys, granted, budget)
                fenced = token is not None
                if token is not None:
                    # A quorum whose replies were read only after valid_until (the event loop
                    # stalled) is returned all the same, already invalid: the core treats it
                    # as lost at once (the body is cancelled, LockLostError, the lock
                    # released), as every backend does with a grant whose reply came later
                    # than its lease.
                    self._valid[owner] = valid_until
                    self._ttls[owner] = ttl
                    if lead is not None:
                        self._wake.granted(keys, lead, owner, rnd, calls[lead][2])
                    return Grant(token)
        except BaseException:
            abandoned.set_result(None)
            masters.give_back(spec, owner, rnd)  # in the background: we are leaving
            if lead is not None:
                self._wake.abandoned(keys, lead, owner, calls[lead][2])
            raise
        # Not ours: give back what was granted, and what may still be granted.
        abandoned.set_result(None)
        answered_grants = masters.give_back(spec, owner, rnd)
        if answered_grants:
            await asyncio.wait(answered_grants)
        for reply in rnd.replies.values():
            if reply[0] == -1:
                raise LimitMismatchError(spec.name, int(reply[1]), spec.limit)
        if not fenced:
            raise BackendError(
                f"redis acquire failed on {self._where}: the fencing token could not be "
                f"written to a quorum of {self._majority} masters in time"
            )
        failed = len(rnd.errors)
        if failed > n - need:
            # Too many masters fail outright (refused connections, errors): no quorum is
            # possible now, and saying so beats waiting.
            error = rnd.first_error()
            raise BackendError(
                f"redis acquire failed on {self._where}: {failed} of {n} masters failed, "
                f"a quorum is {need} ({type(error).__name__}: {error})"
            ) from error
        retry = retry_after(rnd, need, len(granted), self._timeout(ttl))
        if lead is not None:
            retry = self._wake.refused(keys, lead, owner, rnd, calls[lead][2], retry)
        return Busy(retry)

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Release on every master; ``True`` if one that answered still held it.

        Returns once a majority answered (or every master did), waiting at most one
        per-master timeout; the releases on slow masters go on in the background
        (:meth:`settle` waits for them). If a majority is silent, a lease still locally valid
        counts as released: the releases sent will do it, or its TTL.
        """
        valid = self._valid.pop(owner, None)
        ttl = self._ttls.pop(owner, None)
        self._losses.drop(owner)
        n = len(self._sources)
        need = self._majority
        released = [0] * n  # master index -> its reply (see Masters.release_on)
        release_on = partial(self._masters.release_on, spec=spec, owner=owner, released=released)
        tasks = [self._spawn(release_on(i, holder=True)) for i in range(n)]
        live = [t for t in tasks if t is not None]
        if not live:
            raise BackendError(f"the redlock backend for {self._where} is closed")
        loop = asyncio.get_running_loop()
        patience = _MIN_NODE_TIMEOUT if ttl is None else self._timeout(ttl)
        deadline = loop.time() + patience
        if spec.kind is Kind.MUTEX:
            keys = keys_for(spec.namespace, spec.name)
            lead = arbiter(keys, n)
            self._wake.follow(keys, lead, tasks[lead], released, patience)
        pending = set(live)
        while pending and n - len(pending) < need and loop.time() < deadline:
            _, pending = await asyncio.wait(
                pending, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
            )
        if any(reply > 0 for reply in released):
            return True
        # Nobody that answered held it: it was lost -- unless too few answered to tell.
        return n - len(pending) < need and valid is not None and loop.time() < valid

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Compare-and-extend on every master: kept only if a quorum confirms in time."""
        keys = keys_for(spec.namespace, spec.name)
        script, script_keys = renew_call(spec, keys)
        n = len(self._sources)
        need = quorum(n, spec)
        loop = asyncio.get_running_loop()
        start = loop.time()
        rnd = Round(self._fan_out(lua.run, script, script_keys, owner, lease_ms(ttl), first=True))

        def enough(r: Round) -> bool:
            kept = sum(1 for v in r.replies.values() if v == 1)
            return kept >= need or len(r.replies) - kept > n - need

        # Not cut at node_timeout: a quorum confirming anywhere within the validity keeps
        # the lease (the watchdog bounds the call by the lease's local deadline anyway), and
        # a loaded machine would otherwise turn slow answers into a lost lease.
        await rnd.gather(ttl - self._drift_of(ttl), enough)
        kept = sum(1 for v in rnd.replies.values() if v == 1)
        refused = len(rnd.replies) - kept
        if refused > n - need:
            self._valid.pop(owner, None)
            self._ttls.pop(owner, None)
            self._losses.drop(owner)
            return False
        if kept >= need and loop.time() - start < ttl - self._drift_of(ttl):
            self._valid[owner] = start + ttl - self._drift_of(ttl)
            return True
        error = rnd.first_error()
        raise BackendError(
            f"redis renew failed on {self._where}: {kept} of {n} masters confirmed in time, "
            f"a quorum is {need}"
        ) from error

    async def _verify(self, key: bytes, spec: LockSpec, owner: str) -> bool:
        """Whether a quorum may still hold ``owner``'s lease: read on every master once a
        hub's subscription is confirmed, since a break just before it was not heard.
        ``False`` only when more masters than a quorum can spare no longer hold it."""
        n = len(self._sources)
        need = quorum(n, spec)
        rnd = Round(self._fan_out(holds_on, key, spec, owner))

        def gone(r: Round) -> int:
            return sum(1 for v in r.replies.values() if not v)

        def enough(r: Round) -> bool:
            return gone(r) > n - need or len(r.replies) - gone(r) >= need

        await rnd.gather(self.request_timeout, enough)
        return gone(rnd) <= n - need

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """Set when a break drops ``owner``'s lease: ``BREAK`` publishes it on every master,
        and the first master's hub to hear it tells (see :mod:`._losses`; a break before the
        hubs listened is read when they do); an expiry or a
        lost quorum is for ``renew`` to see."""
        return self._losses.signal(spec, owner)

    def hears_losses(self, namespace: str) -> bool:
        """Whether a break of a lock of ``namespace`` reaches this client now (every master's
        hub listens; it starts at the first grant there)."""
        return self._losses.listening(namespace)

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """The Redlock validity of ``owner``'s lease: the start of its last confirmed acquire
        or renew + ttl - drift (``drift_factor``), so a larger drift shrinks the lease."""
        return self._valid.get(owner)

    def waiter(self, spec: LockSpec, owner: str) -> QuorumWaiter:
        """Armed once a majority of the masters confirmed the subscription."""
        keys = keys_for(spec.namespace, spec.name)
        channel = {
            Kind.MUTEX: keys.signal,
            Kind.SEMAPHORE: keys.sem_signal,
        }.get(spec.kind, keys.rw_signal)
        if self._tasks is None or self._closed:
            raise BackendError(f"the redlock backend for {self._where} is not open")
        # Its attempts from now on are re-checks of a woken waiter: arbiter first.
        self._waiting.add(owner)
        left = partial(self._left, owner)
        if spec.kind is Kind.MUTEX:
            return self._wake.waiter(keys, owner, self._majority, left)
        waiters = [hub.waiter(channel, owner) for hub in self._hubs]
        return QuorumWaiter(waiters, self._majority, self._spawn, left=left)

    def _left(self, owner: str, *, failed: bool) -> None:
        self._waiting.discard(owner)

    # ---------------------------------------------------------------- operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Locks of ``namespace`` matching ``pattern`` whose holders a quorum reports."""
        return await inspect_masters(self._masters, namespace, pattern)

    async def namespaces(self) -> list[str]:
        """The namespaces with a lock held or waited for on the masters (see
        :func:`~._redlock_inspect.namespaces_on_masters`)."""
        return await namespaces_on_masters(self._masters)

    async def break_lock(self, spec: LockSpec) -> int:
        """Delete every holder of ``spec``'s family on every master and push its fencing
        token above every token handed out (see :func:`~._redlock_inspect.break_on_masters`)."""
        return await break_on_masters(self._masters, spec, self._fence_ms)
