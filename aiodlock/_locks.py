"""The lock kinds, written once over the backend protocol.

Every kind has one shape: ``acquire(timeout=)`` → :class:`Lease` or
:class:`LockTimeoutError`; ``try_acquire()`` → :class:`Lease` or ``None``; ``async with``
holds the lock under a watchdog that cancels the body on loss; ``statistics()``; a ``repr``
with state and waiters.

The waiting loop is the same for every backend: try; if refused, arm the wakeup (subscribe),
*then* try again (a release between the two would otherwise be missed); then wait until woken
or until the blocking holder's lease could have run out (``Busy.retry_after``), and repeat.
Nothing sleeps on a fixed interval.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar, TypeVarTuple, final

from ._exceptions import (
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    UnsupportedError,
)
from ._lease import Lease
from ._watchdog import drift, keep_alive
from .backends._protocol import Backend, Busy, Capability, Grant, Kind, LockSpec

if TYPE_CHECKING:
    from ._client import LockClient

__all__ = ["Lock", "LockStatistics", "ReadLock", "Semaphore", "WriteLock"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
logger = logging.getLogger("aiodlock")

RELEASE_TIMEOUT: Final = 5.0
"""Seconds a background (compensating) release may take before it is abandoned to the
lease's own expiry."""


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()
"""Marks "not passed" where ``None`` means "no limit"."""


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """What one lock object has seen, in this process.

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


class _LockBase:
    """The shared machinery; the public kinds below only choose the :class:`Kind`."""

    _kind: Kind

    def __init__(
        self,
        client: LockClient,
        spec: LockSpec,
        *,
        ttl: float,
        timeout: float | None,
        max_hold: float | None,
        reentrant: bool = False,
    ) -> None:
        self._client = client
        self._backend: Backend = client._backend
        self._spec = spec
        self._queued_on_busy = spec.fair or getattr(self._backend, "queues_on_busy", False)
        # Local turns for exclusive kinds, unless the service already queues (fair, ZooKeeper).
        self._gated = spec.kind in (Kind.MUTEX, Kind.WRITE) and not self._queued_on_busy
        self.ttl = ttl
        self.timeout = timeout
        self.max_hold = max_hold
        self.reentrant = reentrant
        # Leases entered with `async with`, per task (a stack: the same task may nest).
        self._entered: dict[asyncio.Task[Any], list[_Entered]] = {}
        self._waiting = 0
        self._acquired = 0
        self._timeouts = 0
        self._lost = 0

    @property
    def name(self) -> str:
        """The lock's name, as given."""
        return self._spec.name

    # ------------------------------------------------------------------ acquiring

    async def acquire(self, *, timeout: float | _Unset | None = UNSET) -> Lease:
        """Wait for the lock and return the :class:`Lease`.

        The lease is kept alive in the client's background TaskGroup until
        ``lease.release()``; if it is lost, ``lease.lost`` is set. Prefer ``async with``,
        which also cancels the guarded code on loss.

        Args:
            timeout: seconds to wait; ``None`` waits forever. Defaults to the lock's timeout.

        Raises:
            LockTimeoutError: not acquired within ``timeout``.
            BackendError: the service failed.
        """
        lease = await self._acquire(self._timeout_arg(timeout))
        self._client._start_keeper(self, lease)
        return lease

    async def try_acquire(self) -> Lease | None:
        """Take the lock if it is free right now; never waits.

        Returns:
            The :class:`Lease` (kept alive like ``acquire()``'s), or ``None`` if it is taken.
        """
        owner = _new_owner()
        attempt, sent = await self._attempt(owner)
        if isinstance(attempt, Busy):
            if self._queued_on_busy:
                # The refusal queued us; we are not going to wait.
                await self._client._release(self._spec, owner)
            return None
        lease = self._grant(owner, attempt, sent)
        self._client._start_keeper(self, lease)
        return lease

    async def _acquire(self, timeout: float | None) -> Lease:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if not self._gated:
            return await self._contend(deadline, timeout)
        # Tasks of one client take turns, in arrival order, to contend at the service for an
        # exclusive lock: a task that has just released cannot barge in ahead of its local
        # waiters, and N local waiters cost the service one waiter, not N.
        turn = self._client._local_turn(self._spec)
        try:
            self._waiting += 1
            try:
                async with asyncio.timeout_at(deadline):
                    await turn.acquire()
            except TimeoutError:
                self._timeouts += 1
                raise LockTimeoutError(
                    f"could not acquire {self._describe()} within {timeout} s"
                ) from None
            finally:
                self._waiting -= 1
            try:
                return await self._contend(deadline, timeout)
            finally:
                turn.release()
        finally:
            self._client._leave_turn(self._spec)

    async def _contend(self, deadline: float | None, timeout: float | None) -> Lease:
        owner = _new_owner()
        loop = asyncio.get_running_loop()
        attempt, sent = await self._attempt(owner)
        if isinstance(attempt, Grant):
            return self._grant(owner, attempt, sent)
        self._waiting += 1
        granted: Grant | None = None
        try:
            async with self._backend.waiter(self._spec, owner) as waiter:
                while True:
                    # Re-check now that the wakeup is armed: a release that happened before
                    # the subscription was live would otherwise be missed.
                    attempt, sent = await self._attempt(owner)
                    if isinstance(attempt, Grant):
                        granted = attempt
                        break
                    wait_for = attempt.retry_after
                    if deadline is not None:
                        remaining = deadline - loop.time()
                        if remaining <= 0:
                            self._timeouts += 1
                            raise LockTimeoutError(
                                f"could not acquire {self._describe()} within {timeout} s"
                            )
                        wait_for = remaining if wait_for is None else min(wait_for, remaining)
                    await waiter.wait(wait_for)
        except BaseException:
            if granted is not None or self._queued_on_busy:
                # Granted, then cancelled while leaving the waiter: give the lock back. Or
                # leave the queue so the waiters behind us are not held up.
                self._client._spawn_release(self._spec, owner)
            raise
        finally:
            self._waiting -= 1
        assert granted is not None  # the loop ends only by a grant or an exception
        return self._grant(owner, granted, sent)

    async def _attempt(self, owner: str) -> tuple[Grant | Busy, float]:
        """One try, compensated if its outcome is unknown.

        If we are cancelled (or the connection drops) while the request is in flight, the
        service may have granted the lock anyway: release-if-owner runs, shielded, before the
        exception propagates, so no orphan lock is left behind.
        """
        sent = asyncio.get_running_loop().time()
        try:
            attempt = await self._backend.try_acquire(self._spec, owner, self.ttl)
        except BaseException:
            self._client._spawn_release(self._spec, owner)
            raise
        return attempt, sent

    def _grant(self, owner: str, grant: Grant, sent: float) -> Lease:
        self._acquired += 1
        return Lease(self, owner, grant.fencing_token, sent + self.ttl - drift(self.ttl))

    def _timeout_arg(self, timeout: float | _Unset | None) -> float | None:
        if isinstance(timeout, _Unset):
            return self.timeout
        from ._url import check_seconds

        return check_seconds(timeout, argument="timeout")

    # ------------------------------------------------------------------ releasing

    async def _release_lease(self, lease: Lease) -> None:
        if lease._released:
            return
        reason = lease._lost_reason
        lease._released = True
        self._client._stop_keeper(lease)
        released = await self._client._release(self._spec, lease._owner)
        if reason is not None:
            raise LockNotOwnedError(f"{self._describe()} was lost before release") from reason
        if not released:
            raise LockNotOwnedError(f"{self._describe()} was not held at release (it expired)")

    def _note_lost(self) -> None:
        self._lost += 1

    # ------------------------------------------------------------------ async with

    async def __aenter__(self) -> Lease:
        task = asyncio.current_task()
        assert task is not None, "aiodlock locks must be used from an asyncio task"
        exclusive = self._spec.kind in (Kind.MUTEX, Kind.WRITE)
        outer = self._client._reentrant_lease(self._spec, task) if exclusive else None
        if outer is not None and not self.reentrant:
            raise RuntimeError(
                f"this task already holds {self._describe()}; pass reentrant=True to re-enter it"
            )
        stack = self._entered.setdefault(task, [])
        if outer is not None:
            self._client._reenter(self._spec, task, +1)
            stack.append(_Entered(outer, None, None, nested=True))
            return outer
        try:
            lease = await self._acquire(self.timeout)
        except BaseException:
            if not stack:
                del self._entered[task]
            raise
        group = asyncio.TaskGroup()
        await group.__aenter__()
        keeper = group.create_task(keep_alive(self, lease), name=f"aiodlock-keepalive-{self.name}")
        stack.append(_Entered(lease, group, keeper, nested=False))
        if self._spec.kind in (Kind.MUTEX, Kind.WRITE):
            self._client._reenter(self._spec, task, +1, lease)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task = asyncio.current_task()
        assert task is not None
        stack = self._entered[task]
        entered = stack.pop()
        if not stack:
            del self._entered[task]
        if entered.nested:
            self._client._reenter(self._spec, task, -1)
            return None
        if self._spec.kind in (Kind.MUTEX, Kind.WRITE):
            self._client._reenter(self._spec, task, -1)
        lease = entered.lease
        assert entered.group is not None
        assert entered.keeper is not None
        entered.keeper.cancel()
        lost: LockLostError | None = None
        try:
            try:
                if exc_type is asyncio.CancelledError:
                    # Let the TaskGroup do its uncancel() bookkeeping for a cancellation it
                    # may have caused itself; an outside cancellation propagates from here.
                    await entered.group.__aexit__(exc_type, exc, tb)
                else:
                    # The body's own exception is not the TaskGroup's business: keep it
                    # out, so it propagates unwrapped rather than inside an ExceptionGroup.
                    await entered.group.__aexit__(None, None, None)
            except BaseExceptionGroup as group_error:
                lost = _only_lock_lost(group_error)
        finally:
            await self._release_after_body(lease)
        if lost is not None:
            if task.cancelling():
                # Somebody outside cancelled us too: that cancellation wins.
                raise asyncio.CancelledError from lost
            if exc_type is None or exc_type is asyncio.CancelledError:
                raise lost
        return None

    async def _release_after_body(self, lease: Lease) -> None:
        try:
            await self._release_lease(lease)
        except LockNotOwnedError:
            pass  # lost or expired: reported through LockLostError, not here
        except LockError as exc:
            # The service is unreachable: the lease ends by expiry. The body's outcome is
            # what the caller needs to see, so this is logged rather than raised.
            logger.warning("could not release %s: %s", self._describe(), exc)

    # ------------------------------------------------------------------ introspection

    def statistics(self) -> LockStatistics:
        """Counters for this lock object in this process (no server round trip)."""
        return LockStatistics(
            name=self.name,
            kind=self._spec.kind.value,
            held=sum(1 for s in self._entered.values() for e in s if not e.nested)
            + self._client._keepers_of(self),
            waiting=self._waiting,
            acquired=self._acquired,
            timeouts=self._timeouts,
            lost=self._lost,
        )

    def _describe(self) -> str:
        return f"{type(self).__name__.lower().replace('lock', ' lock').strip()} {self.name!r}"

    def __repr__(self) -> str:
        stats = self.statistics()
        extra = f" limit={self._spec.limit}" if self._spec.kind is Kind.SEMAPHORE else ""
        fair = " fair" if self._spec.fair else ""
        reentrant = " reentrant" if self.reentrant else ""
        return (
            f"<{type(self).__name__} {self.name!r}{extra}{fair}{reentrant} "
            f"held={stats.held} waiting={stats.waiting} on {self._backend.describe()}>"
        )


@dataclass(slots=True)
class _Entered:
    lease: Lease
    group: asyncio.TaskGroup | None
    keeper: asyncio.Task[Any] | None
    nested: bool


def _only_lock_lost(group_error: BaseExceptionGroup[BaseException]) -> LockLostError:
    """The watchdog fails only with LockLostError; anything else is a bug worth seeing."""
    lost, rest = group_error.split(LockLostError)
    if rest is not None or lost is None:
        raise group_error
    first = lost.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, LockLostError)
    return first


def _new_owner() -> str:
    return secrets.token_hex(12)


@final
class Lock(_LockBase):
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
class ReadLock(_LockBase):
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
class WriteLock(_LockBase):
    """The exclusive side of a reader/writer lock: one writer, no readers.

    Example::

        async with locks.write_lock("catalog"):
            await rebuild_catalog()
    """

    _kind = Kind.WRITE


@final
class Semaphore(_LockBase):
    """Up to ``limit`` concurrent holders, each with its own lease and fencing token.

    Every client must use the same ``limit`` for a name. Like :class:`asyncio.Semaphore`, but
    a crashed holder's permit comes back when its lease expires.

    Example::

        async with locks.semaphore("api-quota", limit=5):
            await call_partner_api()
    """

    _kind = Kind.SEMAPHORE


async def run_guarded(lock: _LockBase, fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
    """Run ``await fn(*args)`` while holding ``lock``, cancelled on loss (LockLostError)."""
    async with lock:
        return await fn(*args)


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

