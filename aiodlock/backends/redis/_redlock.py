"""The Redlock backend: ``redlock://[[user]:password@]h1:p1,h2:p2,h3:p3[/DB]``.

N independent Redis masters (N odd, at least 3), one :class:`~._node.NodeSource` each, and
the single-node Lua scripts (:mod:`._scripts`) run on every one of them. What docs/redlock.md
explains at length, in short:

- **Acquire**: the attempt's script is sent to every master at once (one round trip, in
  parallel), each answer awaited at most ``node_timeout * ttl``. The lock is ours once a
  quorum (N//2+1; see :func:`quorum` for semaphores) granted it, valid until ``start + ttl -
  drift`` with ``drift = drift_factor * ttl + 2 ms`` (:meth:`RedlockBackend.session_deadline`
  gives the core that deadline; a quorum read after it, when the loop stalled, is a lease
  lost at once). Otherwise it is released on every master that granted it *or did not
  answer* (its grant may still land), each release sent only once the attempt on that master
  has landed. A waiter's re-checks after a wakeup ask the name's *arbiter* master first and
  the others only once it granted (:meth:`RedlockBackend._arbiter_first`): waiters of
  several processes woken at once would otherwise split the masters' votes and all fail.
- **Fencing** (ABD-style): every granting master answers with its own next token (its
  counter + 1, floored by its clock in µs); the token is the maximum over a quorum, and a
  second round trip writes it to a quorum with "set if greater" (``FENCE_RAISE``). Any two
  majorities share a master, so a later grant reads at least this token there and goes
  above it; the clock floor covers a shared master that lost its data.
- **Renew**: compare-and-extend on every master; the lease is kept only if a quorum
  confirms within the validity rule, and ``False`` (lost: the core cancels the body) once
  too many masters refuse.
- **Wakeups**: one pub/sub hub (:class:`~._pubsub.PubSubHub`) per master; a waiter is armed
  once a majority of them confirmed its subscription (a release publishes on the majority
  that held the lock, and two majorities meet), and any of them wakes it.

Example::

    async with aiodlock.connect("redlock://r1:6379,r2:6379,r3:6379/0?drift_factor=0.02") as locks:
        async with locks.lock("order:42", ttl=10) as lease:
            print(lease.fencing_token)
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import math
import secrets
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ..._exceptions import BackendError, LimitMismatchError, UnsupportedError
from ..._validate import check_seconds
from .._protocol import Busy, Capability, Grant, HolderInfo, Kind, LockInfo, LockSpec
from . import _scripts as lua
from ._keys import Keys, keys_for
from ._node import TLS_OPTIONS, NodeSource
from ._pubsub import PubSubHub
from ._quorum import Round
from ._quorum_waiter import QuorumWaiter
from ._redlock_inspect import scan_holders

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ..._url import ParsedURL

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
_DEFAULT_SOCKET_TIMEOUT: Final = 2.0


def quorum(masters: int, spec: LockSpec) -> int:
    """How many masters must grant ``spec``: a majority, and for a semaphore of limit L
    ``N·L // (L+1) + 1``, the least q for which L+1 holders cannot each hold q masters with
    at most L holders on every master ((L+1)·q > N·L). L = 1 gives the majority."""
    if spec.kind is Kind.SEMAPHORE:
        return masters * spec.limit // (spec.limit + 1) + 1
    return masters // 2 + 1


NOT_ASKED: Final = (0, -2)
"""The reply of a master an attempt skipped (:meth:`RedlockBackend._arbiter_first`): a
refusal that names no wait, with nothing of ours to give back there."""


def _arbiter(keys: Keys, masters: int) -> int:
    """The master a name's woken waiters ask first: the same in every process."""
    return zlib.crc32(keys.mutex_acquire[0]) % masters


def _mirror(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    """Give ``target`` the outcome of the finished ``source``."""
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _lease_ms(ttl: float) -> int:
    return max(1, math.ceil(ttl * 1000.0))


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
    ``node_timeout`` (how long one master may take to answer, a fraction of ttl, default 0.1,
    at least 50 ms), ``fence_ttl`` (seconds a fencing counter outlives its last grant,
    default 7 days; 0: forever), ``ssl`` (TLS to every master, with the ``ssl_*`` options of
    ``rediss://``), and per master ``connect_timeout`` (default 5 s), ``socket_timeout``
    (default 2 s: how long a silent master keeps a command connection busy) and
    ``max_connections`` (default 2).
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
        "ssl": bool,
        "connect_timeout": float,
        "socket_timeout": float,
        "max_connections": int,
        **TLS_OPTIONS,
    }

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        count = len(url.hosts)
        if count < 3 or count % 2 == 0:
            raise ValueError(
                f"redlock:// needs an odd number of independent masters, at least 3; "
                f"the url names {count}"
            )
        self._drift = _factor(options, "drift_factor", _DEFAULT_DRIFT_FACTOR)
        self._node_timeout = _factor(options, "node_timeout", _DEFAULT_NODE_TIMEOUT)
        fence = check_seconds(
            options.get("fence_ttl", _DEFAULT_FENCE_TTL),
            argument="option fence_ttl",
            allow_none=False,
            allow_zero=True,
        )
        assert fence is not None
        self._fence_ms = 0 if fence == 0 else _lease_ms(fence)
        ssl = options.get("ssl")
        if ssl is not None and not isinstance(ssl, bool):
            raise TypeError(f"option ssl must be a bool, not {type(ssl).__name__}")
        scheme = "rediss" if ssl else "redis"
        node_options = {k: v for k, v in options.items() if k in NodeSource.options}
        if node_options.get("socket_timeout") is None:
            # A master that stopped answering holds a command connection this long; a
            # quorum goes on without it after node_timeout, so keep the backlog short.
            node_options["socket_timeout"] = _DEFAULT_SOCKET_TIMEOUT
        self._sources = [
            NodeSource(replace(url, scheme=scheme, hosts=(host,), query={}, raw=""), node_options)
            for host in url.hosts
        ]
        self._majority = count // 2 + 1
        self._client_id = secrets.token_hex(8)
        self._where = url.redacted()
        self._hubs: list[PubSubHub] = []
        self._tg: asyncio.TaskGroup | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # owner -> master index -> its attempt still in flight (a release there waits for it)
        self._flights: dict[str, dict[int, asyncio.Future[Any]]] = {}
        # owner -> loop time until which a quorum surely holds its lease (the validity rule)
        self._valid: dict[str, float] = {}
        self._ttls: dict[str, float] = {}  # owner -> the ttl of its lease
        # (owner, master index) -> the release giving back an attempt that master answered
        # too late (see _give_back)
        self._giving: dict[tuple[str, int], asyncio.Task[Any]] = {}
        self._waiting: set[str] = set()  # owners inside waiter(): see _arbiter_first
        self._opened = False
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._opened else "new"
        return f"<RedlockBackend {self._where} masters={len(self._sources)} {state}>"

    # ---------------------------------------------------------------- lifetime

    async def open(self) -> None:
        """Connect to every master in parallel; a quorum must answer (the rest may come back
        later: each master's connections are made again on demand)."""
        if self._opened or self._closed:
            raise RuntimeError("a RedlockBackend is opened once")
        results = await asyncio.gather(
            *(source.open(_load) for source in self._sources), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        up = len(results) - len(failed)
        if up < self._majority:
            await asyncio.gather(*(s.aclose() for s in self._sources), return_exceptions=True)
            for r in failed:
                if not isinstance(r, Exception):
                    raise r
            raise BackendError(
                f"redlock: only {up} of {len(self._sources)} masters answered on "
                f"{self._where} (a quorum is {self._majority}): {failed[0]}"
            ) from failed[0]
        for source, result in zip(self._sources, results, strict=True):
            if isinstance(result, BaseException):
                _log.warning("redlock master %s is down at open: %s", source.describe(), result)
        self._opened = True
        self._tg = tg = asyncio.TaskGroup()
        await tg.__aenter__()
        for source in self._sources:
            hub = PubSubHub(source)
            hub.start(tg.create_task)
            self._hubs.append(hub)

    async def aclose(self) -> None:
        """Close every hub and every master's connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for hub in self._hubs:
            hub.close()
        await asyncio.gather(*(s.aclose() for s in self._sources), return_exceptions=True)
        tg, self._tg = self._tg, None
        if tg is not None:
            for task in list(self._background):
                task.cancel()
            await tg.__aexit__(None, None, None)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        tg = self._tg
        if tg is None or self._closed:
            coro.close()
            return None
        task = tg.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def settle(self) -> None:
        """Wait for the releases still running on slow masters, then end the subscriptions
        that only linger."""
        while self._background:
            await asyncio.wait(set(self._background))
        for hub in self._hubs:
            await hub.settle()

    # ---------------------------------------------------------------- protocol

    def check(self, spec: LockSpec) -> None:
        """No fair locks on Redlock."""
        if spec.fair:
            raise UnsupportedError("redlock:// does not offer fair=True locks")

    def describe(self) -> str:
        """The URL without its password."""
        return self._where

    def statistics(self) -> Mapping[str, Any]:
        """Per-backend totals over the masters' hubs."""
        stats: dict[str, Any] = {"masters": len(self._sources)}
        for hub in self._hubs:
            for key, value in hub.statistics().items():
                stats[key] = stats.get(key, 0) + value
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
        script, script_keys, args = _acquire_call(spec, keys, owner, _lease_ms(ttl), self)
        n = len(self._sources)
        need = quorum(n, spec)
        loop = asyncio.get_running_loop()
        start = loop.time()
        send = partial(self._send_after_give_back, owner, script=script, keys=script_keys,
                       args=args)  # fmt: skip
        # Done before giving back: the masters an attempt skipped so far stay unasked.
        abandoned: asyncio.Future[None] = loop.create_future()
        if owner in self._waiting and spec.kind is Kind.MUTEX:
            futures = self._arbiter_first(send, _arbiter(keys, n), self._timeout(ttl), abandoned)
        else:
            futures = [send(i) for i in range(n)]
        flights = self._flights.setdefault(owner, {})
        for i, fut in enumerate(futures):
            flights[i] = fut
            fut.add_done_callback(partial(self._landed, owner, i))
        rnd = Round(futures)

        def enough(r: Round) -> bool:
            granted = sum(1 for v in r.replies.values() if v[0] == 1)
            refused = len(r.replies) + len(r.errors) - granted
            return granted >= need or refused > n - need

        fenced = True
        try:
            await rnd.gather(self._timeout(ttl), enough)
            granted = {i: int(v[1]) for i, v in rnd.replies.items() if v[0] == 1}
            if len(granted) >= need:
                valid_until = start + ttl - self._drift_of(ttl)
                # The write phase may take until the grant's validity ends (a grant is usable
                # until then), but at least node_timeout and at most _WRITE_PHASE_CAP more.
                left = valid_until - loop.time()
                budget = max(self._timeout(ttl), min(left, _WRITE_PHASE_CAP))
                token = await self._raise_fence(keys, granted, budget)
                fenced = token is not None
                if token is not None:
                    # A quorum whose replies were read only after valid_until (the event loop
                    # stalled) is returned all the same, already invalid: the core treats it
                    # as lost at once (the body is cancelled, LockLostError, the lock
                    # released), as every backend does with a grant whose reply came later
                    # than its lease.
                    self._valid[owner] = valid_until
                    self._ttls[owner] = ttl
                    return Grant(token)
        except BaseException:
            abandoned.set_result(None)
            self._give_back(spec, owner, rnd)  # in the background: we are leaving
            raise
        # Not ours: give back what was granted, and what may still be granted.
        abandoned.set_result(None)
        answered_grants = self._give_back(spec, owner, rnd)
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
        retry: float | None = None
        if len(rnd.replies) + failed < n:
            # Some masters did not answer in time (stopped, partitioned): ask again after
            # another per-master timeout, without waiting for a wakeup they cannot send.
            retry = self._timeout(ttl)
        waits = sorted(int(v[1]) for v in rnd.replies.values() if v[0] == 0 and v[1] >= 0)
        if waits:
            # Free on a quorum once enough of the refusals have expired.
            index = min(len(waits) - 1, max(0, need - len(granted) - 1))
            expiry = max(waits[index] + 1, 1) / 1000.0
            retry = expiry if retry is None else min(retry, expiry)
        return Busy(retry)

    def _arbiter_first(
        self,
        send: Callable[[int], asyncio.Future[Any]],
        arbiter: int,
        patience: float,
        abandoned: asyncio.Future[None],
    ) -> list[asyncio.Future[Any]]:
        """A woken waiter's attempt: to the name's arbiter master first, to the others only
        once the arbiter granted it (or did not answer within ``patience``).

        When a release wakes waiters in several processes at once and each sends to every
        master in parallel, the masters' votes split (each grants whoever came first there):
        nobody reaches a quorum, everybody gives back, and the give-backs wake everybody
        again. Asking one master first -- the same one for a name in every process -- lets
        it pick the winner; the losers are refused there atomically and have nothing to
        give back. A master that was not asked answers ``NOT_ASKED``, a refusal; so do the
        others once the attempt is ``abandoned`` (given back: a release waiting for this
        attempt on a master must not be waited for by it).
        """
        first = send(arbiter)

        async def after(i: int, outcome: asyncio.Future[Any]) -> None:
            try:
                await asyncio.wait(
                    (first, abandoned), timeout=patience, return_when=asyncio.FIRST_COMPLETED
                )
                answered = first.done() and not first.cancelled() and first.exception() is None
                if abandoned.done() or (answered and first.result()[0] != 1):
                    outcome.set_result(NOT_ASKED)
                    return
                sent = send(i)
                await asyncio.wait((sent,))
            except BaseException:
                outcome.cancel()
                raise
            _mirror(sent, outcome)

        loop = asyncio.get_running_loop()
        futures = []
        for i in range(len(self._sources)):
            if i == arbiter:
                futures.append(first)
                continue
            outcome: asyncio.Future[Any] = loop.create_future()
            if self._spawn(after(i, outcome)) is None:
                outcome.set_exception(self._closed_error())
            futures.append(outcome)
        return futures

    def _closed_error(self) -> BackendError:
        return BackendError(f"the redlock backend for {self._where} is closed")

    def _landed(self, owner: str, i: int, fut: asyncio.Future[Any]) -> None:
        flights = self._flights.get(owner)
        if flights is not None and flights.get(i) is fut:
            del flights[i]
            if not flights:
                del self._flights[owner]

    async def _raise_fence(
        self, keys: Keys, granted: dict[int, int], budget: float
    ) -> int | None:
        """The write phase: make the quorum's maximum token known to a quorum of masters
        within ``budget`` seconds."""
        token = max(granted.values())
        have = sum(1 for t in granted.values() if t >= token)
        if have >= self._majority:
            return token
        fence = keys.mutex_acquire[1]
        futures = [
            source.submit(lua.run, lua.FENCE_RAISE, (fence,), str(token), self._fence_ms)
            if granted.get(i, 0) < token
            else _done(1)
            for i, source in enumerate(self._sources)
        ]
        rnd = Round(futures)
        await rnd.gather(budget, lambda r: len(r.replies) >= self._majority)
        if len(rnd.replies) >= self._majority:
            return token
        _log.warning(
            "redlock: the fencing token reached only %d masters of %s",
            len(rnd.replies),
            self._where,
        )
        return None

    def _give_back(self, spec: LockSpec, owner: str, rnd: Round) -> list[asyncio.Task[Any]]:
        """Release, in tasks of ours, where the attempt granted, failed, or has not answered
        yet -- not where it was refused (the script refused atomically: nothing of ours is
        there). Returns the tasks of the masters that answered (quick to finish)."""
        answered = []
        for i in range(len(self._sources)):
            reply = rnd.replies.get(i)
            if reply is not None and reply[0] != 1:
                continue
            task = self._spawn(self._release_on(i, spec, owner))
            if task is None:
                continue
            if reply is not None:
                answered.append(task)
            else:
                # The next attempt of this owner on master i must come after this release:
                # sent before it, the release would delete what that attempt grants.
                self._giving[owner, i] = task
                task.add_done_callback(partial(self._given, owner, i))
        return answered

    def _given(self, owner: str, i: int, task: asyncio.Task[Any]) -> None:
        if self._giving.get((owner, i)) is task:
            del self._giving[owner, i]

    def _send_after_give_back(
        self,
        owner: str,
        i: int,
        *,
        script: lua.Script,
        keys: tuple[bytes, ...],
        args: tuple[Any, ...],
    ) -> asyncio.Future[Any]:
        """The attempt's command on master ``i``, sent at once -- or, if an earlier attempt of
        ``owner`` is still being given back there (its reply was late), right after that."""
        source = self._sources[i]
        before = self._giving.get((owner, i))
        if before is None:
            return source.submit(lua.run, script, keys, *args)
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def after() -> None:
            try:
                await asyncio.wait((before,))
                sent = source.submit(lua.run, script, keys, *args)
                await asyncio.wait((sent,))
            except BaseException:
                outcome.cancel()  # cancelled as we close: nobody will wait for it
                raise
            _mirror(sent, outcome)

        if self._spawn(after()) is None:
            outcome.set_exception(self._closed_error())
        return outcome

    async def _release_on(self, i: int, spec: LockSpec, owner: str) -> bool:
        """Release ``owner`` on master ``i`` once its attempt there has landed; never raises
        (a failure leaves the key to its TTL)."""
        try:
            flight = self._flights.get(owner, {}).get(i)
            if flight is not None:
                await asyncio.wait((flight,))
            keys = keys_for(spec.namespace, spec.name)
            script, script_keys, args = _release_call(spec, keys)
            with self._sources[i].errors("release"):
                done = await self._sources[i].call_first(
                    lua.run, script, script_keys, owner, "p", *args
                )
            return bool(done == 1)
        except Exception as exc:
            _log.debug("redlock release on %s failed: %s", self._sources[i].describe(), exc)
            return False

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Release on every master; ``True`` if one that answered still held it.

        Returns once a majority answered (or every master did), waiting at most one
        per-master timeout; the releases on slow masters go on in the background
        (:meth:`settle` waits for them). If a majority is silent, a lease still locally valid
        counts as released: the releases sent will do it, or its TTL.
        """
        valid = self._valid.pop(owner, None)
        ttl = self._ttls.pop(owner, None)
        n = len(self._sources)
        need = self._majority
        tasks = [self._spawn(self._release_on(i, spec, owner)) for i in range(n)]
        live = [t for t in tasks if t is not None]
        if not live:
            raise BackendError(f"the redlock backend for {self._where} is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (_MIN_NODE_TIMEOUT if ttl is None else self._timeout(ttl))
        pending = set(live)
        while pending and n - len(pending) < need and loop.time() < deadline:
            _, pending = await asyncio.wait(
                pending, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
            )
        if any(t.done() and t.result() for t in live):
            return True
        # Nobody that answered held it: it was lost -- unless too few answered to tell.
        return n - len(pending) < need and valid is not None and loop.time() < valid

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Compare-and-extend on every master: kept only if a quorum confirms in time."""
        keys = keys_for(spec.namespace, spec.name)
        script, script_keys = _renew_call(spec, keys)
        n = len(self._sources)
        need = quorum(n, spec)
        loop = asyncio.get_running_loop()
        start = loop.time()
        rnd = Round(self._fan_out(lua.run, script, script_keys, owner, _lease_ms(ttl), first=True))

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
            return False
        if kept >= need and loop.time() - start < ttl - self._drift_of(ttl):
            self._valid[owner] = start + ttl - self._drift_of(ttl)
            return True
        error = rnd.first_error()
        raise BackendError(
            f"redis renew failed on {self._where}: {kept} of {n} masters confirmed in time, "
            f"a quorum is {need}"
        ) from error

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """``None``: only ``renew`` can tell."""
        return None

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
        if self._tg is None or self._closed:
            raise BackendError(f"the redlock backend for {self._where} is not open")
        # Its attempts from now on are re-checks of a woken waiter: arbiter first.
        self._waiting.add(owner)
        return QuorumWaiter(
            [hub.waiter(channel, owner) for hub in self._hubs],
            self._majority,
            self._spawn,
            left=partial(self._waiting.discard, owner),
        )

    # ---------------------------------------------------------------- operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Locks of ``namespace`` matching ``pattern`` whose holders a quorum reports."""
        rnd = Round([source.submit(scan_holders, namespace) for source in self._sources])
        await rnd.gather(max(s.socket_timeout for s in self._sources), lambda r: False)
        if len(rnd.replies) < self._majority:
            raise BackendError(
                f"redis inspect failed on {self._where}: {len(rnd.replies)} masters answered"
            ) from rnd.first_error()
        # (name, kind) -> owner -> [expires_in per master that has it]; name -> tokens
        seen: dict[tuple[str, Kind], dict[str, list[float]]] = {}
        tokens: dict[str, list[int]] = {}
        for reply in rnd.replies.values():
            holders, fences = reply
            for (name, kind), owners in holders.items():
                bucket = seen.setdefault((name, kind), {})
                for owner, expires_in in owners.items():
                    bucket.setdefault(owner, []).append(expires_in)
            for name, token in fences.items():
                tokens.setdefault(name, []).append(token)
        found = []
        for (name, kind), owners in sorted(seen.items(), key=lambda e: (e[0][0], e[0][1].value)):
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            need = self._majority
            held = tuple(
                HolderInfo(owner, sorted(times)[-need])
                for owner, times in sorted(owners.items())
                if len(times) >= need
            )
            if held:
                found.append(LockInfo(name, kind, held, self._newest(tokens.get(name)), None))
        return found

    def _newest(self, counters: list[int] | None) -> int | None:
        """The newest token handed out: the largest value a majority of counters reach (the
        quorum write put it there; a master that granted late holds a larger one of its own,
        which no lease carries)."""
        if not counters or len(counters) < self._majority:
            return None
        return sorted(counters, reverse=True)[self._majority - 1]

    async def break_lock(self, spec: LockSpec) -> int:
        """Delete every holder of ``spec``'s family on every master (``BREAK``, as on one
        node) and push its fencing token above every token handed out, through the quorum
        write; waiters are woken as by a release."""
        keys = keys_for(spec.namespace, spec.name)
        family_keys: tuple[bytes, ...]
        if spec.kind is Kind.MUTEX:
            family, family_keys = "m", keys.break_mutex
        elif spec.kind is Kind.SEMAPHORE:
            family, family_keys = "s", keys.break_sem
        else:
            family, family_keys = "rw", keys.break_rw
        rnd = Round(
            [
                source.submit(lua.run, lua.BREAK, family_keys, family, "p", self._fence_ms)
                for source in self._sources
            ]
        )
        timeout = max(s.socket_timeout for s in self._sources)
        await rnd.gather(timeout, lambda r: False)
        if len(rnd.replies) < self._majority:
            raise BackendError(
                f"redis break failed on {self._where}: {len(rnd.replies)} of "
                f"{len(self._sources)} masters answered, a quorum is {self._majority}"
            ) from rnd.first_error()
        bumped = {i: int(v[1]) for i, v in rnd.replies.items()}
        if await self._raise_fence(keys, bumped, self._timeout(timeout)) is None:
            raise BackendError(f"redis break failed on {self._where}: the token write failed")
        return max(int(v[0]) for v in rnd.replies.values())


def _done(value: Any) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


async def _load(client: aioredis.Redis) -> None:
    await lua.load_all(client)
    async with client.pipeline(transaction=False) as pipe:
        for script in (lua.FENCE_RAISE,):
            pipe.script_load(script.text)
        await pipe.execute()


def _acquire_call(
    spec: LockSpec, keys: Keys, owner: str, ms: int, backend: RedlockBackend
) -> tuple[lua.Script, tuple[bytes, ...], tuple[Any, ...]]:
    fence = backend._fence_ms
    if spec.kind is Kind.MUTEX:
        # The client id only matters to a courtesy left by a release; ours leave none.
        return lua.MUTEX_ACQUIRE, keys.mutex_acquire, (owner, ms, backend._client_id, fence)
    if spec.kind is Kind.READ:
        return lua.READ_ACQUIRE, keys.read_acquire, (owner, ms, "0", fence)
    if spec.kind is Kind.WRITE:
        return lua.WRITE_ACQUIRE, keys.write_acquire, (owner, ms, fence)
    return lua.SEM_ACQUIRE, keys.sem_acquire, (owner, ms, spec.limit, fence)


def _release_call(
    spec: LockSpec, keys: Keys
) -> tuple[lua.Script, tuple[bytes, ...], tuple[Any, ...]]:
    if spec.kind is Kind.MUTEX:
        return lua.MUTEX_RELEASE, keys.mutex_release, ()
    if spec.kind is Kind.READ:
        return lua.READ_RELEASE, keys.read_release, ()
    if spec.kind is Kind.WRITE:
        return lua.WRITE_RELEASE, keys.write_release, ()
    return lua.SEM_RELEASE, keys.sem_release, (spec.limit,)


def _renew_call(spec: LockSpec, keys: Keys) -> tuple[lua.Script, tuple[bytes, ...]]:
    if spec.kind is Kind.MUTEX:
        return lua.MUTEX_RENEW, (keys.mutex,)
    if spec.kind is Kind.WRITE:
        return lua.MUTEX_RENEW, (keys.writer,)
    if spec.kind is Kind.READ:
        return lua.ZSET_RENEW, (keys.readers,)
    return lua.ZSET_RENEW, keys.sem_renew
