"""``connect()`` and the LockClient: the composition root.

``connect()`` turns a URL and options into a backend (found by scheme in the registry) and a
client; the client builds the pieces every lock shares — the supervisor that owns background
tasks, the table of live leases and local turns — hands them to each lock object it makes, and
closes them in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from types import TracebackType
from typing import Any, Final, NoReturn, ParamSpec, TypeVar, TypeVarTuple, final

from ._exceptions import UnsupportedError
from ._inflight import InFlight
from ._leader import Election
from ._lease import Lease
from ._local import Holdings
from ._lock_all import all_of
from ._locks import (
    BaseLock,
    Lock,
    LockContext,
    ReadLock,
    Semaphore,
    WriteLock,
    check_kind,
    run_guarded,
)
from ._recipes import exclusive, run_periodic
from ._stats import ClientStatistics
from ._supervisor import Supervisor
from ._validate import (
    USE_CLIENT_DEFAULT,
    UseClientDefault,
    check_async_callable,
    check_bool,
    check_limit,
    check_name,
    check_namespace,
    check_seconds,
    check_timeout,
    check_ttl,
    default_identity,
)
from .backends._protocol import (
    Backend,
    Breaker,
    Inspector,
    Kind,
    LockInfo,
    LockSpec,
    NamespaceLister,
    Settler,
)
from .backends._tasks import TaskRoot

__all__ = ["ClientStatistics", "LockClient", "abandon_lease", "settle_client"]

P = ParamSpec("P")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")
L = TypeVar("L", bound=BaseLock)

# How long aclose() lets a backend's background clean-ups land (a release still running on a
# slow Redlock master, a wait queue being left) before it closes the connections under them.
CLOSE_SETTLE_GRACE: Final = 1.0


def _check_kind(kind: object) -> Kind:
    """``kind`` as a :class:`Kind`: the enum itself, or its value (``"mutex"``...)."""
    if isinstance(kind, Kind):
        return kind
    if not isinstance(kind, str):
        raise TypeError(f"kind must be an aiodlock.Kind or a str, not {type(kind).__name__}")
    try:
        return Kind(kind)
    except ValueError:
        known = ", ".join(repr(k.value) for k in Kind)
        raise ValueError(f"kind must be one of {known}, not {kind!r}") from None


@final
class LockClient:
    """Makes locks on one coordination service, and owns their background work.

    Every background task — the keep-alive of each lease, a compensating release after a
    cancelled acquire — runs in this client's TaskGroup, so leaving ``async with`` (or
    ``aclose()``) waits for all of it and leaves nothing behind.

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
        identity: str | None = None,
    ) -> None:
        self._backend = backend
        self.namespace = namespace
        self.identity = identity if identity is not None else default_identity()
        self.ttl = ttl
        self.timeout = timeout
        self.max_hold = max_hold
        self._state = "new"
        self._root = TaskRoot()
        self._supervisor = Supervisor(backend, self._root.tasks())
        self._holdings = Holdings(self._supervisor)
        self._inflight = InFlight()
        self._context = LockContext(backend, self._supervisor, self._holdings, self._inflight)

    # ------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> LockClient:
        if self._state != "new":
            raise RuntimeError(f"{self!r} was already opened; make a new one with connect()")
        self._state = "opening"
        await self._root.start()
        try:
            await self._backend.open(self._root.tasks())
        except BaseException:
            await self._supervisor.stop()
            await self._root.stop()
            self._state = "closed"
            raise
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
        """End everything this client does, then disconnect.

        Each task still waiting in an acquire raises ``RuntimeError`` (leaving any queue it
        joined); each lease still held is given back, and a body still running under it is
        cancelled and raises :class:`LockLostError`, as on any loss; background clean-ups are
        awaited; then the connections close. Idempotent.
        """
        if self._state != "open":
            return
        self._state = "closing"
        # Waiters first (they raise RuntimeError and leave their queues), then holders (their
        # bodies are cancelled with LockLostError), while the connections are still open.
        await self._inflight.interrupt()
        self._holdings.close()
        try:
            await self._supervisor.stop()
            if isinstance(self._backend, Settler):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_SETTLE_GRACE):
                        await self._backend.settle()
        finally:
            self._state = "closed"
            try:
                await self._backend.aclose()
            finally:
                await self._root.stop()

    # ------------------------------------------------------------------ lock factories

    def lock(
        self,
        name: str,
        *,
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
        max_hold: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
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
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
        max_hold: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
    ) -> ReadLock:
        """The shared side of the reader/writer lock ``name``: see :class:`~aiodlock.ReadLock`."""
        return self._make(ReadLock, self._spec(name, Kind.READ), ttl, timeout, max_hold)

    def write_lock(
        self,
        name: str,
        *,
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
        max_hold: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
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
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
        max_hold: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
    ) -> Semaphore:
        """Up to ``limit`` holders of ``name`` at once: see :class:`~aiodlock.Semaphore`."""
        spec = self._spec(name, Kind.SEMAPHORE, limit=check_limit(limit))
        return self._make(Semaphore, spec, ttl, timeout, max_hold)

    def lock_all(
        self,
        locks: Iterable[str | BaseLock],
        *,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
        max_hold: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
    ) -> contextlib.AbstractAsyncContextManager[tuple[Lease, ...]]:
        """Several locks, all or nothing: ``async with`` gives their leases, a tuple in the
        order given (docs/core.md, "Several locks at once")::

            async with locks.lock_all(["a", locks.read_lock("b")], timeout=5) as (a, b):
                ...

        They are taken in one order whatever the order given — by name, then family (mutex,
        reader/writer, semaphore) — so callers asking for the same locks never deadlock.
        ``timeout`` is one deadline for them all (a lock object's own still bounds its own
        wait); on a timeout, an error or a cancellation what was taken is released, in
        reverse. Losing any lease cancels the body with :class:`~aiodlock.LockLostError` naming
        that lock.

        Args:
            locks: names (mutexes, made with ``ttl`` and ``max_hold``) and lock objects of
                this client (``lock``, ``read_lock``, ``write_lock``, ``semaphore``).
            timeout: seconds to get them all; ``None`` = forever (default: the client's).
            ttl: the lease of the locks given by name (default: the client's).
            max_hold: the longest hold of the locks given by name (default: the client's).

        Raises:
            TypeError, ValueError: a bad argument; the same lock twice (name and family); a
                lock object of another client.
            UnsupportedError: the backend cannot provide a mutex.
        """
        wait = self.timeout if timeout is USE_CLIENT_DEFAULT else check_timeout(timeout)
        return all_of(
            locks,
            make=lambda name: self.lock(name, ttl=ttl, timeout=wait, max_hold=max_hold),
            mine=lambda lock: lock._context is self._context,
            timeout=wait,
        )

    async def run_exclusive(
        self,
        name: str,
        fn: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
        max_hold: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
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
        check_async_callable(fn)
        lock = self.lock(name, ttl=ttl, timeout=timeout, max_hold=max_hold, fair=fair)
        return await run_guarded(lock, fn, *args)

    # ------------------------------------------------------------------ worker recipes

    def election(
        self,
        name: str,
        *,
        identity: str | None = None,
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
    ) -> Election:
        """Leader election ``name``: see :class:`~aiodlock.Election`.

        ``async with locks.election("scheduler") as term:`` leads for one term;
        ``async for term in locks.election("scheduler"): async with term: ...`` leads, and
        campaigns again after each loss; ``await election.who_leads()`` names the leader.

        Args:
            name: the election's name (a mutex of that name is the leadership).
            identity: what :meth:`Election.who_leads` reports while this process leads
                (default ``hostname:pid``).
            ttl: the leadership lease (default: the client's). A leader that dies is replaced
                within about ``ttl`` seconds.
        """
        return Election(self, name, tasks=self._root.tasks(), identity=identity, ttl=ttl)

    def exclusive(
        self,
        name_template: str,
        *,
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
        max_hold: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
        fair: bool = False,
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
        """Decorate a coroutine function so that each call holds the mutex its arguments name.

        ::

            @locks.exclusive("report:{day}", timeout=60)
            async def build_report(day: str) -> None: ...

        The name is ``name_template`` formatted with the call's arguments (bound to the
        function's signature, defaults applied). A field that is not a parameter is a
        ``ValueError`` when decorating. Each call is guarded like an ``async with`` body:
        cancelled on loss (:class:`~aiodlock.LockLostError`); busy past ``timeout`` is
        :class:`~aiodlock.LockTimeoutError`.
        """

        def make_lock(name: str) -> Lock:
            return self.lock(name, ttl=ttl, timeout=timeout, max_hold=max_hold, fair=fair)

        make_lock("exclusive")  # bad options fail when decorating, not at the first call
        return exclusive(name_template, make_lock)

    async def periodic(
        self,
        name: str,
        fn: Callable[[*Ts], Awaitable[object]],
        *args: *Ts,
        every: float,
        identity: str | None = None,
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
    ) -> NoReturn:
        """Run ``await fn(*args)`` every ``every`` seconds on exactly one of the instances
        that call this (the leader of election ``name``); never returns (cancel it to stop).

        ::

            await locks.periodic("cleanup", purge_expired_sessions, every=60)

        An exception from ``fn`` is logged (logger ``aiodlock.recipes``) and the schedule goes
        on; if the leader dies or loses its lease, another instance takes over and runs
        ``fn`` at once.
        """
        await run_periodic(self.election(name, identity=identity, ttl=ttl), fn, *args, every=every)

    # ------------------------------------------------------------------ operators

    async def inspect(self, pattern: str = "*", *, namespace: str | None = None) -> list[LockInfo]:
        """The locks of this client's namespace (or of ``namespace``) in use now, whose names
        match ``pattern``.

        For operators (``python -m aiodlock inspect``): each
        :class:`~aiodlock.LockInfo` names the lock, its kind, its holders (owner and
        remaining lease where the backend can tell), its newest fencing token and its waiters
        where the backend can tell::

            for info in await locks.inspect("order:*"):
                print(info.name, info.fencing_token, [h.owner for h in info.holders])

        Args:
            pattern: a glob over lock names (``*``, ``?``, ``[...]``), matched case-sensitively.
            namespace: another namespace to look into (see :meth:`namespaces`).

        Raises:
            UnsupportedError: the backend cannot list its locks.
            BackendError: the service failed.
        """
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, not {type(pattern).__name__}")
        namespace = self.namespace if namespace is None else check_namespace(namespace)
        self._require_open()
        backend = self._backend
        if not isinstance(backend, Inspector):
            raise UnsupportedError(f"{backend.describe()} cannot list its locks (inspect)")
        return await backend.inspect(namespace, pattern)

    async def namespaces(self) -> list[str]:
        """The namespaces of this service with locks in use, sorted (some backends also name
        ones with only records left); ``for ns in await locks.namespaces(): ...``.

        Raises:
            UnsupportedError: the backend cannot list its namespaces.
            BackendError: the service failed.
        """
        self._require_open()
        backend = self._backend
        if not isinstance(backend, Inspector) or not isinstance(backend, NamespaceLister):
            raise UnsupportedError(f"{backend.describe()} cannot list its namespaces")
        return await backend.namespaces()

    async def break_lock(self, name: str, *, kind: Kind | str = Kind.MUTEX) -> int:
        """Force-release the lock ``name`` of this namespace, whoever holds it.

        Every holder is dropped and the fencing token moves on, so a broken holder's fenced
        writes are refused; its watchdog reports the loss within its renewal interval (its
        guarded body is cancelled with :class:`~aiodlock.LockLostError`) and the next waiter
        gets the lock. What it takes depends on the backend (docs/operations.md): Redis and
        ZooKeeper delete the holders' keys or nodes, MySQL and PostgreSQL end the holding
        sessions. For an operator clearing a stuck lock, never for a program's own locks::

            dropped = await locks.break_lock("order:42")

        Args:
            name: the lock's name.
            kind: a :class:`~aiodlock.Kind` or its value: ``Kind.MUTEX``/``"mutex"``
                (``locks.lock()``), ``READ``/``"read"`` or ``WRITE``/``"write"`` (either
                side: the whole reader/writer lock is broken) or ``SEMAPHORE``/``"semaphore"``
                (every permit) — the ``kind`` of a :class:`~aiodlock.LockInfo` fits as it is.

        Returns:
            How many holders were dropped (0: nobody held it).

        Raises:
            TypeError: ``kind`` is neither a :class:`~aiodlock.Kind` nor a str.
            ValueError: an unknown ``kind``.
            UnsupportedError: the backend cannot break locks, or has no locks of ``kind``.
            BackendError: the service failed.
        """
        check_name(name)
        lock_kind = _check_kind(kind)
        self._require_open()
        backend = self._backend
        if not isinstance(backend, Breaker):
            raise UnsupportedError(f"{backend.describe()} cannot break locks")
        spec = LockSpec(self.namespace, name, lock_kind)
        check_kind(backend, spec)  # a kind the backend has no locks of: UnsupportedError
        return await backend.break_lock(spec)

    @property
    def backend(self) -> Backend:
        """The backend this client talks to: for its ``statistics()``, its optional operations
        (``Capability.INSPECT``, ``Capability.BREAK``) and backend-specific tests."""
        return self._backend

    def statistics(self) -> ClientStatistics:
        """Live leases, running cleanups, the backend's counters, and what the client's locks
        have done: totals, and per lock name for the names used most recently (no server
        round trip)::

            stats = locks.statistics()
            print(stats.grants, stats.timeouts, stats.losses, stats.wait_histogram)
            print(stats.by_name["order:42"].grants)  # every lock object named "order:42"
        """
        counters = self._context.stats
        totals = counters.totals()
        return ClientStatistics(
            leases=len(self._holdings),
            cleanups=self._supervisor.cleanups,
            backend=self._backend.statistics(),
            grants=totals.grants,
            timeouts=totals.timeouts,
            losses=totals.losses,
            wait_histogram=totals.wait_histogram,
            by_name=counters.by_name(),
        )

    def __repr__(self) -> str:
        return (
            f"<LockClient {self._state} {self._backend.describe()} "
            f"namespace={self.namespace!r} ttl={self.ttl}>"
        )

    # ------------------------------------------------------------------ internals

    def _require_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"{self!r} is not open; use it inside 'async with'")

    def _spec(self, name: str, kind: Kind, *, limit: int = 1, fair: bool = False) -> LockSpec:
        check_name(name)
        spec = LockSpec(self.namespace, name, kind, limit, check_bool(fair, argument="fair"))
        check_kind(self._backend, spec)
        return spec

    def _make(
        self,
        cls: type[L],
        spec: LockSpec,
        ttl: float | UseClientDefault,
        timeout: float | UseClientDefault | None,
        max_hold: float | UseClientDefault | None,
        *,
        reentrant: bool = False,
    ) -> L:
        check_bool(reentrant, argument="reentrant")
        ttl_s = self.ttl if ttl is USE_CLIENT_DEFAULT else check_ttl(ttl)
        return cls(
            self._context,
            spec,
            ttl=ttl_s,
            timeout=self.timeout if timeout is USE_CLIENT_DEFAULT else check_timeout(timeout),
            max_hold=self.max_hold
            if max_hold is USE_CLIENT_DEFAULT
            else check_seconds(max_hold, argument="max_hold"),
            reentrant=reentrant,
        )


# ---------------------------------------------------------------------- test hooks
# The hooks behind aiodlock.testing.abandon() and settle(): they reach into the client, so they
# live in its module; fault-injection tests call them through aiodlock.testing, not from here.


def abandon_lease(client: LockClient, lease: Lease) -> None:
    """Stop keeping ``lease`` alive and forget it, without releasing it (a crash)."""
    client._holdings.abandon(lease)


async def settle_client(client: LockClient) -> None:
    """Wait for the client's compensating releases and its backend's background clean-ups."""
    await client._supervisor.settle()
    if isinstance(client._backend, Settler):
        await client._backend.settle()
