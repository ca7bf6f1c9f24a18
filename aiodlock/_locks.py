"""The lock kinds: policy only.

Every kind has one shape: ``acquire(timeout=)`` → :class:`Lease` or
:class:`LockTimeoutError`; ``try_acquire()`` → :class:`Lease` or ``None``; ``async with``
holds the lock and cancels the body if the lease is lost; ``statistics()``; a ``repr`` with
state and waiters. What a kind decides is *which* lock it asks for (its :class:`Kind`) and how
a task's second entry is treated; the mechanisms are elsewhere, each with one owner:

* waiting for a grant — :mod:`aiodlock._acquire` (the one wait loop);
* keeping the lease alive, reentrancy, release, teardown — the client's
  :class:`~aiodlock._local.Holdings`, the same path whether a lease was taken with
  ``async with`` or ``acquire()``;
* cancelling the body on loss — :class:`~aiodlock._guard.LossGuard`.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar, TypeVarTuple, final

from . import _telemetry
from ._acquire import AcquireCounters, Granted, attempt_once, wait_for_grant
from ._exceptions import (
    BackendError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    UnsupportedError,
)
from ._guard import LossGuard
from ._inflight import InFlight
from ._lease import Lease, LeaseState, LeaseStatus
from ._local import Holdings, LiveLease
from ._stats import LockCounters
from ._supervisor import Supervisor
from ._validate import USE_CLIENT_DEFAULT, UseClientDefault, check_timeout, check_ttl
from ._watchdog import drift, renew_once
from .backends._protocol import Backend, Capability, Inspector, Kind, LockSpec

__all__ = [
    "BaseLock",
    "Lock",
    "LockContext",
    "LockStatistics",
    "ReadLock",
    "Semaphore",
    "WriteLock",
    "check_kind",
    "run_guarded",
]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


@dataclass(frozen=True, slots=True)
class LockContext:
    """What a lock object works with: its client's backend, supervisor, holdings, the
    acquires in flight (which a closing client interrupts) and its statistics recorder."""

    backend: Backend
    supervisor: Supervisor
    holdings: Holdings
    inflight: InFlight
    stats: LockCounters = field(default_factory=LockCounters)


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """What one lock object has seen, in this process.

    Only this object's own acquisitions count: a new ``locks.lock("a")`` starts at zero even
    if "a" was used before. The figures of every lock object of a name are the client's:
    ``locks.statistics().by_name["a"]``.

    Attributes:
        name: the lock's name.
        kind: ``"mutex"``, ``"read"``, ``"write"`` or ``"semaphore"``.
        held: leases this lock object holds now.
        waiting: acquisitions of this lock object waiting now.
        acquired: grants so far.
        timeouts: acquisitions that gave up with :class:`LockTimeoutError`.
        lost: leases lost while held.
    """

    name: str
    kind: str
    held: int
    waiting: int
    acquired: int
    timeouts: int
    lost: int


@dataclass(slots=True)
class _Entry:
    """One ``async with`` entry of a task: the lease, and the guard it armed (if outermost)."""

    live: LiveLease
    guard: LossGuard | None


class BaseLock:
    """The shared policy; the public kinds below only choose the :class:`Kind`."""

    _kind: Kind

    def __init__(
        self,
        context: LockContext,
        spec: LockSpec,
        *,
        ttl: float,
        timeout: float | None,
        max_hold: float | None,
        reentrant: bool = False,
    ) -> None:
        self._context = context
        self._spec = spec
        self.ttl = ttl
        self.timeout = timeout
        self.max_hold = max_hold
        self.reentrant = reentrant
        # `async with` entries per task (a stack: the same task may nest).
        self._entered: dict[asyncio.Task[Any], list[_Entry]] = {}
        self._counters = AcquireCounters()
        self._lost = 0

    @property
    def name(self) -> str:
        """The lock's name, as given."""
        return self._spec.name

    # ------------------------------------------------------------------ acquiring

    async def acquire(
        self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT
    ) -> Lease:
        """Wait for the lock and return the :class:`Lease`.

        The lease is kept alive by the client until ``lease.release()``; if it is lost,
        ``lease.lost`` is set. Prefer ``async with``, which also cancels the guarded code on
        loss. On a reentrant lock the task that holds it gets the same lease back (one more
        entry, undone by one ``release()``).

        Args:
            timeout: seconds to wait; ``None`` waits forever. Defaults to the lock's timeout.

        Raises:
            LockTimeoutError: not acquired within ``timeout``.
            BackendError: the service failed.
            RuntimeError: the client is not open.
        """
        wait = self.timeout if timeout is USE_CLIENT_DEFAULT else _seconds(timeout)
        return (await self._take(_current_task(), wait)).lease

    async def try_acquire(self) -> Lease | None:
        """Take the lock if it is free right now; never waits.

        Returns:
            The :class:`Lease` (kept alive like ``acquire()``'s), or ``None`` if it is taken.
        """
        task = _current_task()
        held = self._reentry(task, strict=False)
        if held is not None:
            return self._context.holdings.reenter(held)
        context = self._context
        context.supervisor.require_running()
        started = asyncio.get_running_loop().time()
        with context.inflight.entered(task, self._spec):
            granted = await attempt_once(
                context.backend,
                context.supervisor,
                self._spec,
                ttl=self.ttl,
                counters=self._counters,
            )
        return None if granted is None else self._hold(granted, task, started).lease

    async def _take(
        self, task: asyncio.Task[Any], timeout: float | None, *, strict: bool = False
    ) -> LiveLease:
        held = self._reentry(task, strict=strict)
        if held is not None:
            self._context.holdings.reenter(held)
            return held
        context = self._context
        context.supervisor.require_running()
        started = asyncio.get_running_loop().time()
        with context.inflight.entered(task, self._spec):
            try:
                granted = await wait_for_grant(
                    context.backend,
                    context.supervisor,
                    context.holdings.turns,
                    self._spec,
                    ttl=self.ttl,
                    timeout=timeout,
                    counters=self._counters,
                )
            except LockTimeoutError:
                waited = asyncio.get_running_loop().time() - started
                _telemetry.timed_out(self._spec, waited=waited)
                context.stats.timed_out(self._spec.name)
                raise
        return self._hold(granted, task, started)

    def _reentry(self, task: asyncio.Task[Any], *, strict: bool) -> LiveLease | None:
        """The lease to re-enter, if ``task`` holds this lock and it is reentrant.

        A non-reentrant lock held by the same task is an error for ``async with`` (``strict``:
        it could only deadlock); ``acquire()`` and ``try_acquire()`` contend as any caller
        would, and time out or answer None.
        """
        held = self._context.holdings.held_by(self._spec, task)
        if held is None or self.reentrant:
            return held
        if strict:
            raise RuntimeError(
                f"this task already holds {self._spec.describe()}; "
                "pass reentrant=True to re-enter it"
            )
        return None

    def _hold(self, granted: Granted, task: asyncio.Task[Any], started: float) -> LiveLease:
        valid_until = granted.sent + self.ttl - drift(self.ttl)
        now = asyncio.get_running_loop().time()
        waited = now - started
        hold = _telemetry.acquired(self._spec, token=granted.fencing_token, waited=waited)
        self._context.stats.granted(self._spec.name, waited=waited)
        # Session backends bound the lease by their session; a TTL backend may bound it by
        # a stricter validity rule of its own (Redlock's drift_factor). Others return None.
        state = LeaseState(
            self._spec,
            granted.owner,
            granted.fencing_token,
            valid_until,
            session_deadline=self._context.backend.session_deadline,
            hold=hold,
            ttl=self.ttl,
            granted_at=now,
        )
        state.on_loss(self._note_lost)
        live = self._context.holdings.add(
            state, task=task, source=self, ttl=self.ttl, max_hold=self.max_hold
        )
        state.extender = lambda state, ttl: self._extend(live, ttl)
        return live

    def _note_lost(self, reason: LockLostError) -> None:
        self._lost += 1
        self._context.stats.lost(self._spec.name)

    # ------------------------------------------------------------------ extend (Lease.extend)

    async def _extend(self, live: LiveLease, ttl: float | None) -> float:
        """Renew ``live`` now, to ``ttl`` if given; return its new ``remaining``.

        Serialised with the keep-alive by the lease's renewal lock; once confirmed, the
        keep-alive is replaced by one that counts its renewals from this one (at the new
        ttl), so a shorter ttl is renewed in time and a longer one is not renewed early.
        """
        state = live.state
        context = self._context
        backend = context.backend
        current = state.ttl if state.ttl is not None else self.ttl
        new_ttl = current if ttl is None else check_ttl(ttl)
        if new_ttl != current and Capability.TTL_LEASE not in backend.capabilities:
            raise UnsupportedError(
                f"{backend.describe()} cannot change the ttl of a lease on "
                f"{self._spec.describe()}: a lease there lives as long as the client's "
                "session, and the session's timeout governs it (connect with another ttl "
                "or session_ttl instead)"
            )
        loop = asyncio.get_running_loop()
        async with state.renewal_lock:
            _check_extendable(state, loop.time())
            deadline = min(state.valid_until, loop.time() + backend.request_timeout)
            try:
                confirmed = await renew_once(backend, state, new_ttl, deadline=deadline)
            except TimeoutError as exc:
                _check_extendable(state, loop.time())
                what = f"renewal of {self._spec.describe()}"
                raise context.supervisor.no_answer(what) from exc
            except BackendError:
                _check_extendable(state, loop.time())
                raise
            if not confirmed:
                lost = LockLostError(
                    f"{self._spec.describe()} is no longer held (its renewal was refused)"
                )
                state.lose(lost)
                raise lost
            _check_extendable(state, loop.time())  # released or lost meanwhile
            state.ttl = new_ttl
            self._keep_from_now(live, new_ttl, loop.time())
        return state.remaining(loop.time())

    def _keep_from_now(self, live: LiveLease, ttl: float, now: float) -> None:
        """Replace the lease's keep-alive with one whose renewals count from ``now``."""
        max_hold = self.max_hold
        granted_at = live.state.granted_at
        if max_hold is not None and granted_at is not None:
            # max_hold still counts from the grant; past it, the keep-alive renews no more.
            max_hold = max(max_hold - (now - granted_at), _PAST_MAX_HOLD)
        live.keeper.cancel()
        live.keeper = self._context.supervisor.keep(live.state, ttl=ttl, max_hold=max_hold)

    # ------------------------------------------------------------------ locked()

    async def locked(self) -> bool:
        """Ask the service whether this lock (its name and kind) is held now, by anyone.

        Any holder counts: this client, another one, or another process. For the
        reader/writer pair, ``read_lock(name).locked()`` and ``write_lock(name).locked()``
        both say whether the pair is held, by readers or by a writer. The answer may be stale
        by the time you read it: to act on a free lock, use :meth:`try_acquire`.
        Each call lists the namespace's locks on the service (the operators' ``inspect``).

        Example::

            if await locks.lock("nightly-report").locked():
                print("a report is being built")

        Raises:
            UnsupportedError: the backend cannot list its locks (``Capability.INSPECT``).
            BackendError: the service failed.
            RuntimeError: the client is not open.
        """
        context = self._context
        context.supervisor.require_running()
        backend = context.backend
        if Capability.INSPECT not in backend.capabilities or not isinstance(backend, Inspector):
            raise UnsupportedError(
                f"{backend.describe()} cannot list its locks, so it cannot tell whether "
                f"{self._spec.describe()} is held"
            )
        spec = self._spec
        family = _family(spec.kind)
        infos = await backend.inspect(spec.namespace, glob_escape(spec.name))
        return any(
            info.name == spec.name and _family(info.kind) == family and info.holders
            for info in infos
        )

    # ------------------------------------------------------------------ async with

    async def __aenter__(self) -> Lease:
        task = _current_task()
        live = await self._take(task, self.timeout, strict=True)
        guard = None
        if self._context.holdings.claim_guard(live, task):
            guard = LossGuard(live.state, task)
            guard.arm()
        self._entered.setdefault(task, []).append(_Entry(live, guard))
        return live.lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = _current_task()
        stack = self._entered[task]
        entry = stack.pop()
        if not stack:
            del self._entered[task]
        lost: LockLostError | None = None
        cancelled = False
        guard = entry.guard
        if guard is not None:
            self._context.holdings.drop_guard(entry.live, task)
            if guard.disarm():  # the lease was lost under the body: settle how it ended
                outcome = await guard.settle(exc_type)
                lost, cancelled = outcome.lost, outcome.cancelled
        found = await self._release_after_body(entry.live)
        if cancelled:
            raise asyncio.CancelledError from lost or exc
        if lost is not None:
            raise lost
        if found is not None and exc_type is None:
            raise found  # the release proved the body's end ran without the lock

    async def _release_after_body(self, live: LiveLease) -> LockLostError | None:
        """Release; return the loss a release-if-owner refusal proved, if nobody had seen it."""
        state = live.state
        seen_lost = state.lost_reason is not None
        try:
            await self._context.holdings.release(state)
        except LockNotOwnedError as exc:
            # Lost before: the guard reported it. Found lost by this very release: say so.
            if not seen_lost and isinstance(exc.__cause__, LockLostError):
                return exc.__cause__
        except LockError as exc:
            # The service is unreachable: the lease ends by expiry. The body's outcome is
            # what the caller needs to see, so this is logged rather than raised.
            self._context.supervisor.failed(f"release of {self._spec.describe()}", exc)
        return None

    # ------------------------------------------------------------------ introspection

    def statistics(self) -> LockStatistics:
        """Counters for this lock object in this process (no server round trip)."""
        return LockStatistics(
            name=self.name,
            kind=self._spec.kind.value,
            held=self._context.holdings.count(self),
            waiting=self._counters.waiting,
            acquired=self._counters.acquired,
            timeouts=self._counters.timeouts,
            lost=self._lost,
        )

    def __repr__(self) -> str:
        stats = self.statistics()
        extra = f" limit={self._spec.limit}" if self._spec.kind is Kind.SEMAPHORE else ""
        fair = " fair" if self._spec.fair else ""
        reentrant = " reentrant" if self.reentrant else ""
        return (
            f"<{type(self).__name__} {self.name!r}{extra}{fair}{reentrant} "
            f"held={stats.held} waiting={stats.waiting} on {self._context.backend.describe()}>"
        )


_PAST_MAX_HOLD = 1e-9
"""The max_hold left for a keep-alive started past the lease's max_hold: none (no renewal)."""


def _check_extendable(state: LeaseState, now: float) -> None:
    """Raise unless ``state`` is held and locally valid (what ``extend()`` may renew)."""
    if state.status is LeaseStatus.RELEASED:
        raise RuntimeError(f"lease on {state.spec.name!r} was released: it cannot be extended")
    if state.lost_reason is not None:
        raise state.lost_reason
    if now >= state.valid_until:
        lost = LockLostError(f"lease on {state.spec.name!r} is past its validity deadline")
        state.lose(lost)
        raise lost


def _family(kind: Kind) -> Kind:
    """The lock a kind belongs to: read and write are two sides of one."""
    return Kind.WRITE if kind is Kind.READ else kind


_GLOB = re.compile(r"([*?\[])")


def glob_escape(name: str) -> str:
    """A glob (``fnmatch``) pattern that matches ``name`` and nothing else: ``"a*"`` →
    ``"a[*]"``."""
    return _GLOB.sub(r"[\1]", name)


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiodlock locks must be used from an asyncio task")
    return task


def _seconds(timeout: object) -> float | None:
    return check_timeout(timeout)


@final
class Lock(BaseLock):
    """A distributed mutex: one holder at a time, across every process using the service.

    Like :class:`asyncio.Lock`, but held by a *lease* that the service expires if the holder
    dies, kept alive by a watchdog while you hold it, and fenced: every grant carries a
    fencing token larger than all before it. If the lease is lost, the body of ``async with``
    is cancelled and :class:`LockLostError` is raised — you are told, not left to guess.

    ``reentrant=True`` lets the task that holds it enter it again (one lease, a depth count).
    ``fair=True`` hands the lock over in arrival order across processes (where the backend
    declares FAIR); within one client, waiting tasks always take turns in arrival order.

    Example::

        async with locks.lock("order:42", timeout=5) as lease:
            await ship(order=42, fencing_token=lease.fencing_token)
    """

    _kind = Kind.MUTEX


@final
class ReadLock(BaseLock):
    """The shared side of a reader/writer lock: many readers, no writer.

    Readers of a name share it with each other and exclude :class:`WriteLock` holders of the
    same name. The read/write pair is a lock family of its own: ``locks.lock("x")`` is a
    different lock from ``locks.read_lock("x")``.

    Example::

        async with locks.read_lock("catalog"):
            prices = await load_prices()
    """

    _kind = Kind.READ


@final
class WriteLock(BaseLock):
    """The exclusive side of a reader/writer lock: one writer, no readers.

    Example::

        async with locks.write_lock("catalog"):
            await rebuild_catalog()
    """

    _kind = Kind.WRITE


@final
class Semaphore(BaseLock):
    """Up to ``limit`` concurrent holders, each with its own lease and fencing token.

    Every client must use the same ``limit`` for a name: while permits are held, ``acquire()``
    with another limit raises :class:`~aiodlock.LimitMismatchError`. Like
    :class:`asyncio.Semaphore`, but a crashed holder's permit comes back when its lease expires.
    Within one client, waiting tasks take turns in arrival order (one of them waits at the
    service at a time).

    Example::

        async with locks.semaphore("api-quota", limit=5):
            await call_partner_api()
    """

    _kind = Kind.SEMAPHORE


async def run_guarded(lock: BaseLock, fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
    """Run ``await fn(*args)`` while holding ``lock``, cancelled on loss (LockLostError)."""
    async with lock:
        awaitable = fn(*args)
        if not inspect.isawaitable(awaitable):
            raise TypeError(
                f"fn must return an awaitable (be an async function), not "
                f"{type(awaitable).__name__}"
            )
        return await awaitable


def check_kind(backend: Backend, spec: LockSpec) -> None:
    """Refuse, at construction, a kind the backend cannot serve."""
    needed = spec.kind.required | ({Capability.FAIR} if spec.fair else set())
    missing = needed - backend.capabilities
    if missing:
        names = ", ".join(sorted(c.value for c in missing))
        raise UnsupportedError(
            f"{backend.describe()} cannot provide a {spec.kind.value} lock (lacks {names})"
        )
    backend.check(spec)
