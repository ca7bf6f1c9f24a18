"""``connect()`` and the LockClient: URL → backend, namespace, defaults, and its lifetime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, TypeVar, TypeVarTuple, final

from ._exceptions import LockLostError
from ._lease import Lease
from ._locks import (
    RELEASE_TIMEOUT,
    UNSET,
    Lock,
    ReadLock,
    Semaphore,
    WriteLock,
    _LockBase,
    _Unset,
    check_kind,
    run_guarded,
)
from ._url import (
    check_limit,
    check_name,
    check_namespace,
    check_seconds,
    convert_query,
    load_backend,
    parse_url,
)
from ._watchdog import keep_alive
from .backends._protocol import Backend, Kind, LockSpec

__all__ = ["ClientStatistics", "LockClient", "connect"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
L = TypeVar("L", bound=_LockBase)

DEFAULT_NAMESPACE: Final = "aiodlock"
DEFAULT_TTL: Final = 30.0
_COMMON_OPTIONS: Final[Mapping[str, type]] = {
    "namespace": str,
    "ttl": float,
    "timeout": float,
    "max_hold": float,
}


def connect(url: str | None = None, **options: Any) -> LockClient:
    """Make a client for the coordination service at ``url`` (``memory://`` when omitted).

    Use it as an async context manager: entering connects, leaving releases what is still
    held and disconnects::

        async with aiodlock.connect("redis://127.0.0.1:6379/0", namespace="shop") as locks:
            async with locks.lock("order:42"):
                ...

    Args:
        url: ``memory://[store]``, ``redis://``, ``rediss://``, ``unix://``,
            ``zookeeper://h1:p1,h2:p2/chroot``, ``mysql://user:password@host:port/db``.
            Query parameters are options (``?ttl=10&wakeup=blpop``); keyword options win over them.
        **options: ``namespace`` (default ``"aiodlock"``), ``ttl`` (lease seconds, default
            30, renewed every ttl/3), ``timeout`` (default acquire wait, ``None`` = forever),
            ``max_hold`` (stop renewing after this many seconds), and the backend's own
            options (Redis: ``wakeup="pubsub"|"blpop"``, ``connect_timeout``...).

    Raises:
        ValueError: unknown scheme (the message lists the known ones), a bad option value.
        TypeError: an unknown option, or an option of the wrong type.
        ImportError: the backend's driver is not installed (the message says which extra).
    """
    parsed = parse_url(url)
    backend_cls = load_backend(parsed.scheme)
    accepted: dict[str, type] = {**_COMMON_OPTIONS, **backend_cls.options}
    merged: dict[str, Any] = {}
    for key, text in parsed.query.items():
        if key not in accepted:
            raise TypeError(_unknown_option(key, accepted, "URL query parameter"))
        merged[key] = convert_query(key, text, accepted[key])
    for key, value in options.items():
        if key not in accepted:
            raise TypeError(_unknown_option(key, accepted, "option"))
        merged[key] = value
    namespace = check_namespace(merged.pop("namespace", DEFAULT_NAMESPACE))
    ttl = check_seconds(merged.pop("ttl", DEFAULT_TTL), argument="ttl", allow_none=False)
    timeout = check_seconds(merged.pop("timeout", None), argument="timeout")
    max_hold = check_seconds(merged.pop("max_hold", None), argument="max_hold")
    assert ttl is not None
    backend: Backend = backend_cls(parsed, merged)
    return LockClient(backend, namespace=namespace, ttl=ttl, timeout=timeout, max_hold=max_hold)


def _unknown_option(key: str, accepted: Mapping[str, type], what: str) -> str:
    return f"unknown {what} {key!r}; this backend accepts: {', '.join(sorted(accepted))}"


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """What a client holds and runs now.

    Attributes:
        background_leases: leases from ``acquire()``/``try_acquire()`` kept alive by the client.
        cleanups: compensating releases still running in the background.
        backend: the backend's own counters (connections, subscriptions, ...).
    """

    background_leases: int
    cleanups: int
    backend: Mapping[str, Any]


@final
class LockClient:
    """Makes locks on one coordination service, and owns their background work.

    Every background task — the keep-alive of a lease taken with ``acquire()``, a
    compensating release after a cancelled acquire — runs in this client's TaskGroup, so
    leaving ``async with`` (or ``aclose()``) waits for all of it and leaves nothing behind.

    Example::

        async with aiodlock.connect() as locks:
            async with locks.lock("job:nightly", ttl=10) as lease:
                print("running with token", lease.fencing_token)
    """

    def __init__(
        self,
        backend: Backend,
        *,
        namespace: str,
        ttl: float,
        timeout: float | None,
        max_hold: float | None,
    ) -> None:
        self._backend = backend
        self.namespace = namespace
        self.ttl = ttl
        self.timeout = timeout
        self.max_hold = max_hold
        self._group: asyncio.TaskGroup | None = None
        self._state = "new"
        self._keepers: dict[Lease, tuple[_LockBase, asyncio.Task[None]]] = {}
        self._cleanups: set[asyncio.Task[None]] = set()
        self._reentry: dict[tuple[Kind, str, asyncio.Task[Any]], list[Any]] = {}
        # Per exclusive lock: a FIFO turn among this client's tasks, and how many use it.
        self._turns: dict[tuple[Kind, str], tuple[asyncio.Lock, list[int]]] = {}

    # ------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> LockClient:
        if self._state != "new":
            raise RuntimeError(f"{self!r} was already opened; make a new one with connect()")
        self._state = "opening"
        group = asyncio.TaskGroup()
        await group.__aenter__()
        try:
            await self._backend.open()
        except BaseException:
            await group.__aexit__(None, None, None)
            self._state = "closed"
            raise
        self._group = group
        self._state = "open"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release the leases still held through ``acquire()``, wait for cleanups, disconnect.

        Idempotent.
        """
        if self._state != "open":
            return
        self._state = "closing"
        for lease in list(self._keepers):
            self._stop_keeper(lease)
            if lease.held:
                lease._released = True
                self._spawn_release(lease._lock._spec, lease._owner)
        group, self._group = self._group, None
        try:
            if group is not None:
                await group.__aexit__(None, None, None)
        finally:
            self._state = "closed"
            await self._backend.aclose()

    # ------------------------------------------------------------------ lock factories

    def lock(
        self,
        name: str,
        *,
        ttl: float | _Unset = UNSET,
        timeout: float | _Unset | None = UNSET,
        max_hold: float | _Unset | None = UNSET,
        reentrant: bool = False,
        fair: bool = False,
    ) -> Lock:
        """A mutex named ``name``: see :class:`~aiodlock.Lock`.

        Args:
            name: any non-empty string up to 1024 bytes (opaque: ``/``, ``{``, unicode... are
                fine and never escape the namespace).
            ttl: lease seconds, renewed every ttl/3 while held (default: the client's).
            timeout: default wait for ``acquire()`` and ``async with``; ``None`` = forever.
            max_hold: stop renewing after this many seconds (a hung holder cannot pin it).
            reentrant: the holding task may enter it again.
            fair: FIFO handoff (backends that declare the FAIR capability).

        Raises:
            TypeError, ValueError: a bad argument (named in the message).
            UnsupportedError: the backend cannot provide this lock.
        """
        spec = self._spec(name, Kind.MUTEX, fair=fair)
        return self._make(Lock, spec, ttl, timeout, max_hold, reentrant=reentrant)

    def read_lock(
        self,
        name: str,
        *,
        ttl: float | _Unset = UNSET,
        timeout: float | _Unset | None = UNSET,
        max_hold: float | _Unset | None = UNSET,
    ) -> ReadLock:
        """The shared side of the reader/writer lock ``name``: see :class:`~aiodlock.ReadLock`."""
        return self._make(ReadLock, self._spec(name, Kind.READ), ttl, timeout, max_hold)

    def write_lock(
        self,
        name: str,
        *,
        ttl: float | _Unset = UNSET,
        timeout: float | _Unset | None = UNSET,
        max_hold: float | _Unset | None = UNSET,
        reentrant: bool = False,
    ) -> WriteLock:
        """The exclusive side of the reader/writer lock ``name``: see :class:`WriteLock`."""
        spec = self._spec(name, Kind.WRITE)
        return self._make(WriteLock, spec, ttl, timeout, max_hold, reentrant=reentrant)

    def semaphore(
        self,
        name: str,
        *,
        limit: int,
        ttl: float | _Unset = UNSET,
        timeout: float | _Unset | None = UNSET,
        max_hold: float | _Unset | None = UNSET,
    ) -> Semaphore:
        """Up to ``limit`` holders of ``name`` at once: see :class:`~aiodlock.Semaphore`."""
        spec = self._spec(name, Kind.SEMAPHORE, limit=check_limit(limit))
        return self._make(Semaphore, spec, ttl, timeout, max_hold)

    async def run_exclusive(
        self,
        name: str,
        fn: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        ttl: float | _Unset = UNSET,
        timeout: float | _Unset | None = UNSET,
        max_hold: float | _Unset | None = UNSET,
        fair: bool = False,
    ) -> T:
        """Run ``await fn(*args)`` holding the mutex ``name``; return its result.

        The call is guarded like an ``async with`` body: if the lease is lost, ``fn`` is
        cancelled and :class:`~aiodlock.LockLostError` raised. Handy for background workers
        (``fair=True`` makes a pool of workers take turns in arrival order)::

            await locks.run_exclusive("nightly-report", build_report, date.today())

        Raises:
            LockTimeoutError: the lock was not acquired within ``timeout``.
            LockLostError: the lease was lost while ``fn`` ran.
        """
        if not callable(fn):
            raise TypeError(f"fn must be a coroutine function, not {type(fn).__name__}")
        lock = self.lock(name, ttl=ttl, timeout=timeout, max_hold=max_hold, fair=fair)
        return await run_guarded(lock, fn, *args)

    def statistics(self) -> ClientStatistics:
        """Background leases, running cleanups and the backend's counters."""
        return ClientStatistics(
            background_leases=len(self._keepers),
            cleanups=len(self._cleanups),
            backend=self._backend.statistics(),
        )

    def __repr__(self) -> str:
        return (
            f"<LockClient {self._state} {self._backend.describe()} "
            f"namespace={self.namespace!r} ttl={self.ttl}>"
        )

    # ------------------------------------------------------------------ internals

    def _spec(self, name: str, kind: Kind, *, limit: int = 1, fair: bool = False) -> LockSpec:
        check_name(name)
        if not isinstance(fair, bool):
            raise TypeError(f"fair must be a bool, not {type(fair).__name__}")
        spec = LockSpec(self.namespace, name, kind, limit, fair)
        check_kind(self._backend, spec)
        return spec

    def _make(
        self,
        cls: type[L],
        spec: LockSpec,
        ttl: float | _Unset,
        timeout: float | _Unset | None,
        max_hold: float | _Unset | None,
        *,
        reentrant: bool = False,
    ) -> L:
        if not isinstance(reentrant, bool):
            raise TypeError(f"reentrant must be a bool, not {type(reentrant).__name__}")
        ttl_s = self.ttl if isinstance(ttl, _Unset) else check_seconds(ttl, argument="ttl")
        if ttl_s is None:
            raise TypeError("ttl must be a number of seconds, not None")
        return cls(
            self,
            spec,
            ttl=ttl_s,
            timeout=self.timeout
            if isinstance(timeout, _Unset)
            else check_seconds(timeout, argument="timeout"),
            max_hold=self.max_hold
            if isinstance(max_hold, _Unset)
            else check_seconds(max_hold, argument="max_hold"),
            reentrant=reentrant,
        )

    def _require_group(self) -> asyncio.TaskGroup:
        if self._group is None:
            raise RuntimeError(
                f"{self!r} is not open: use `async with aiodlock.connect(...) as locks:`"
            )
        return self._group

    def _start_keeper(self, lock: _LockBase, lease: Lease) -> None:
        task = self._require_group().create_task(
            self._keep(lock, lease), name=f"aiodlock-keepalive-{lock.name}"
        )
        self._keepers[lease] = (lock, task)

    async def _keep(self, lock: _LockBase, lease: Lease) -> None:
        # A child of the client's TaskGroup must never fail (that would cancel the task that
        # opened the client): a loss is reported through lease.lost instead.
        with contextlib.suppress(LockLostError):
            await keep_alive(lock, lease)

    def _stop_keeper(self, lease: Lease) -> None:
        entry = self._keepers.pop(lease, None)
        if entry is not None:
            entry[1].cancel()

    def _keepers_of(self, lock: _LockBase) -> int:
        return sum(1 for owner, _ in self._keepers.values() if owner is lock)

    async def _release(self, spec: LockSpec, owner: str) -> bool:
        """Release-if-owner; if cancelled midway, finish it in the background.

        The fast path runs inline (no task, no extra timer per release: every backend call is
        bounded by the backend's own request timeout). Release is idempotent, so when the
        caller is cancelled while the request is in flight the same release is simply sent
        again from an owned background task, and the cancellation propagates at once.
        """
        try:
            return await self._backend.release(spec, owner)
        except asyncio.CancelledError:
            self._spawn_release(spec, owner)
            raise

    def _spawn_release(self, spec: LockSpec, owner: str) -> None:
        """Release-if-owner in the background (compensation for an unknown outcome)."""
        group = self._group
        if group is None:
            return  # closed: the lease ends by expiry
        task = group.create_task(self._background_release(spec, owner))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _background_release(self, spec: LockSpec, owner: str) -> None:
        # Must not fail: it is a child of the client's TaskGroup.
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                await self._backend.release(spec, owner)
        except Exception as exc:
            from ._locks import logger

            logger.warning("background release of %r failed: %s", spec.name, exc)

    def _local_turn(self, spec: LockSpec) -> asyncio.Lock:
        """The FIFO turn this client's tasks take to contend for ``spec`` (counted; see
        :meth:`_leave_turn`)."""
        key = (spec.kind, spec.name)
        entry = self._turns.get(key)
        if entry is None:
            entry = self._turns[key] = (asyncio.Lock(), [0])
        entry[1][0] += 1
        return entry[0]

    def _leave_turn(self, spec: LockSpec) -> None:
        key = (spec.kind, spec.name)
        entry = self._turns[key]
        entry[1][0] -= 1
        if entry[1][0] == 0:
            del self._turns[key]

    def _reentrant_lease(self, spec: LockSpec, task: asyncio.Task[Any]) -> Lease | None:
        entry = self._reentry.get((spec.kind, spec.name, task))
        return None if entry is None else entry[0]

    def _reenter(
        self, spec: LockSpec, task: asyncio.Task[Any], delta: int, lease: Lease | None = None
    ) -> None:
        key = (spec.kind, spec.name, task)
        entry = self._reentry.get(key)
        if entry is None:
            self._reentry[key] = [lease, delta]
            return
        entry[1] += delta
        if entry[1] <= 0:
            del self._reentry[key]
