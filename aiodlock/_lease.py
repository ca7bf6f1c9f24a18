"""The Lease: what you hold after an acquisition, and the state machine behind it.

A lease is in one of three states, and :class:`LeaseState` is the only code that changes it::

    HELD ──renewed()──▶ HELD          (the keep-alive extended valid_until)
    HELD ──lose()─────▶ LOST          (lost event set, loss callbacks run once)
    HELD | LOST ──end()──▶ RELEASED   (release() or client close; idempotent)
    RELEASED ──found_lost()──▶ RELEASED, lost set   (the release found the lock gone)

The public :class:`Lease` is a read-only view over one ``LeaseState`` plus ``release()`` and
``extend()`` (which the lock object that took the lease provides, as ``LeaseState.extender``). The
keep-alive (:mod:`aiodlock._watchdog`), the client's table of live leases
(:mod:`aiodlock._local`) and the ``async with`` guard (:mod:`aiodlock._guard`) hold the
``LeaseState`` and drive it only through its methods.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import final

from ._exceptions import LockError, LockLostError, LockNotOwnedError
from ._telemetry import Hold
from .backends._protocol import LockSpec

__all__ = ["Lease", "LeaseState", "LeaseStatus"]


class LeaseStatus(enum.Enum):
    """Where a lease is in its life."""

    HELD = "held"
    LOST = "lost"
    RELEASED = "released"


LossCallback = Callable[[LockLostError], None]
Extender = Callable[["LeaseState", float | None], Awaitable[float]]
"""Renews a lease now, maybe to a new ttl, and returns its new ``remaining`` (see
:meth:`Lease.extend`); the lock object that took the lease provides it."""


@final
class LeaseState:
    """One grant's state: who holds what, until when, and whether it is still held.

    ``valid_until`` is event-loop time: the pessimistic local deadline computed from the *send*
    time of the last confirmed acquire or renew, minus a drift margin — and, for a session
    lease, no later than ``session_deadline()``: the time until which the backend knows the
    session holding the lease is alive on the server (the backend's
    ``session_deadline(spec, owner)``, given as ``session_deadline``).
    """

    __slots__ = (
        "_callbacks",
        "_lost",
        "_renewal_lock",
        "_session_deadline",
        "_ttl_valid_until",
        "extender",
        "fencing_token",
        "granted_at",
        "hold",
        "lost_reason",
        "owner",
        "renewing",
        "spec",
        "status",
        "ttl",
    )

    def __init__(
        self,
        spec: LockSpec,
        owner: str,
        fencing_token: int,
        valid_until: float,
        *,
        session_deadline: Callable[[LockSpec, str], float | None] | None = None,
        hold: Hold | None = None,
        ttl: float | None = None,
        granted_at: float | None = None,
    ) -> None:
        self.spec = spec
        self.owner = owner
        self.fencing_token = fencing_token
        self._ttl_valid_until = valid_until
        self._session_deadline = session_deadline
        self.renewing = False  # a renewal request is in flight (set by the keep-alive)
        self.ttl = ttl  # the lease's ttl now (extend(ttl) changes it); None: not known
        self.granted_at = granted_at  # loop time of the grant (max_hold counts from it)
        self.extender: Extender | None = None  # set by the lock object that took the lease
        self._renewal_lock: asyncio.Lock | None = None  # made at the first renewal
        self.status = LeaseStatus.HELD
        self.lost_reason: LockLostError | None = None
        self._lost: asyncio.Event | None = None  # made when first asked for (rarely)
        self._callbacks: list[LossCallback] = []
        # Told of the end of the hold (logs, spans, metrics: see _telemetry).
        self.hold = hold if hold is not None else Hold(spec, fencing_token, None)

    @property
    def lost(self) -> asyncio.Event:
        """Set when the lease is lost, or found lost by its release."""
        event = self._lost
        if event is None:
            event = self._lost = asyncio.Event()
            if self.lost_reason is not None:
                event.set()
        return event

    @property
    def valid_until(self) -> float:
        """The earlier of the ttl-based deadline and the session's (module docstring)."""
        session = self.session_deadline()
        if session is None or session >= self._ttl_valid_until:
            return self._ttl_valid_until
        return session

    @property
    def renewal_lock(self) -> asyncio.Lock:
        """Held around every renewal of this lease (keep-alive or ``extend()``): never two in
        flight for one lease."""
        lock = self._renewal_lock
        if lock is None:
            lock = self._renewal_lock = asyncio.Lock()
        return lock

    def remaining(self, now: float) -> float:
        """Seconds of local validity left at ``now`` (loop time); 0 unless held."""
        if self.status is not LeaseStatus.HELD:
            return 0.0
        return max(0.0, self.valid_until - now)

    def session_deadline(self) -> float | None:
        """Until when the session holding the lease is surely alive, if it is a session lease."""
        deadline = self._session_deadline
        return None if deadline is None else deadline(self.spec, self.owner)

    def renewed(self, valid_until: float) -> None:
        """The service confirmed the lease: it is valid locally until ``valid_until``."""
        if self.status is LeaseStatus.HELD:
            self._ttl_valid_until = valid_until

    def lose(self, reason: LockLostError) -> None:
        """HELD → LOST: set ``lost`` and tell every loss callback, once. No-op otherwise."""
        if self.status is not LeaseStatus.HELD:
            return
        self.status = LeaseStatus.LOST
        self.lost_reason = reason
        if self._lost is not None:
            self._lost.set()
        self.hold.lost(reason)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(reason)

    def end(self) -> bool:
        """HELD or LOST → RELEASED. False if it already was released (release is idempotent)."""
        if self.status is LeaseStatus.RELEASED:
            return False
        if self.status is LeaseStatus.HELD:
            self.hold.released()
        self.status = LeaseStatus.RELEASED
        self._callbacks.clear()
        return True

    def found_lost(self, reason: LockLostError) -> None:
        """The release found the lock no longer ours: it was lost before anyone noticed.

        Sets ``lost`` (unless a loss was already recorded), so that the holder learns that
        part of its critical section ran unprotected.
        """
        if self.lost_reason is None:
            self.lost_reason = reason
            if self._lost is not None:
                self._lost.set()
            self.hold.lost(reason)

    def on_loss(self, callback: LossCallback) -> None:
        """Call ``callback(reason)`` when the lease is lost (at once if it already is)."""
        if self.lost_reason is not None and self.status is LeaseStatus.LOST:
            callback(self.lost_reason)
        elif self.status is LeaseStatus.HELD:
            self._callbacks.append(callback)

    def cancel_on_loss(self, callback: LossCallback) -> None:
        """Forget a callback registered with :meth:`on_loss` (no-op if it already ran)."""
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def check_valid(self, now: float) -> None:
        """Raise unless the lease is held and locally valid at ``now`` (loop time)."""
        if self.lost_reason is not None:
            raise self.lost_reason
        if self.status is LeaseStatus.RELEASED:
            raise LockNotOwnedError(f"lease on {self.spec.name!r} was released")
        session = self.session_deadline()
        if session is not None and now >= session:
            raise LockLostError(
                f"lease on {self.spec.name!r} is past its session's deadline: the server may "
                "have ended the session (the process or event loop was stalled, or the server "
                "did not answer)"
            )
        if now >= self._ttl_valid_until:
            raise LockLostError(f"lease on {self.spec.name!r} is past its validity deadline")


Releaser = Callable[[LeaseState], Awaitable[None]]
"""Ends a lease for good (the client's table of live leases provides it)."""


@final
class Lease:
    """A granted lock, alive until released or lost.

    ``fencing_token`` is strictly greater than the token of every earlier grant of the same
    lock, on every backend: pass it to the resource you protect, and have the resource refuse
    a token lower than the newest it has seen (see :class:`~aiodlock.FencingGuard`). That is
    what makes a paused, stale holder harmless.

    ``lost`` is an :class:`asyncio.Event` set when the lease ends without ``release()``:
    renewal refused, connection or session gone, the local validity deadline passed, or
    ``max_hold`` reached. Inside ``async with`` you never need it: the body is cancelled and
    :class:`~aiodlock.LockLostError` raised instead.

    Example::

        lease = await locks.lock("report").acquire(timeout=5)
        try:
            await write_report(fencing_token=lease.fencing_token)
        finally:
            await lease.release()
    """

    __slots__ = ("_release", "_state")

    def __init__(self, state: LeaseState, release: Releaser) -> None:
        self._state = state
        self._release = release

    @property
    def name(self) -> str:
        """The lock's name, as given (without the namespace)."""
        return self._state.spec.name

    @property
    def fencing_token(self) -> int:
        """Strictly greater than every earlier grant's token for this lock name."""
        return self._state.fencing_token

    @property
    def owner(self) -> str:
        """The random token this lease holds the lock under on the service (as an operator's
        ``inspect`` shows it); not a secret worth guarding, but not a handle to share."""
        return self._state.owner

    @property
    def lost(self) -> asyncio.Event:
        """Set when the lease is lost (not when it is released)."""
        return self._state.lost

    @property
    def valid_until(self) -> float:
        """Event-loop time (``loop.time()``) after which the lease must be considered expired.

        Computed pessimistically from the *send* time of the last confirmed acquire or renew,
        minus a drift margin, so it passes before the server could have expired the lease.
        """
        return self._state.valid_until

    @property
    def held(self) -> bool:
        """True until the lease is released or lost."""
        return self._state.status is LeaseStatus.HELD

    @property
    def remaining(self) -> float:
        """Seconds left of the lease's local validity: ``valid_until - loop.time()``, never
        below 0, and 0 once the lease is lost or released.

        It is measured on the event loop's clock, whatever clock that loop uses, and drops
        steadily between renewals (each renewal, or :meth:`extend`, moves it back up)::

            if lease.remaining < 5:
                await lease.extend()
        """
        return self._state.remaining(asyncio.get_running_loop().time())

    async def extend(self, ttl: float | None = None) -> float:
        """Renew the lease now, through the same path as its keep-alive (never two renewals
        of one lease in flight), and count the next renewals from this one.

        With ``ttl``, the lease runs on that ttl from now on (this renewal asks the service
        for it, and the keep-alive renews it every ``ttl / 3``) — on backends whose leases
        expire by ttl (Redis, Redlock, memory). On session backends (ZooKeeper, etcd, MySQL,
        PostgreSQL) a lease lives as long as the client's session, whose timeout governs:
        a different ``ttl`` is :class:`~aiodlock.UnsupportedError` there (the same ttl is
        accepted). ``max_hold`` still counts from the grant: past it, an ``extend()`` gives
        the lease one more ttl, and the keep-alive renews it no more.

        Example::

            async with locks.lock("import", ttl=30) as lease:
                await load_first_half()
                await lease.extend(120)  # the second half is slow
                await load_second_half()

        Args:
            ttl: the lease's new ttl in seconds; ``None`` keeps the current one.

        Returns:
            The new :attr:`remaining`.

        Raises:
            LockLostError: the lease was lost before, or this renewal found it gone.
            BackendError: the service failed or did not answer within ``request_timeout``
                (the lease is still held and kept alive, until its validity runs out).
            UnsupportedError: a ttl change on a session backend.
            RuntimeError: the lease was released.
        """
        state = self._state
        if state.status is LeaseStatus.RELEASED:
            raise RuntimeError(f"lease on {self.name!r} was released: it cannot be extended")
        if state.lost_reason is not None:
            raise state.lost_reason
        extender = state.extender
        if extender is None:
            raise LockError(f"lease on {self.name!r} is not kept by a lock: it cannot be extended")
        return await extender(state, ttl)

    def assert_held(self) -> None:
        """Raise :class:`LockLostError` unless the lease is held and locally valid now.

        Call it right before a side effect that must not happen without the lock.

        Raises:
            LockLostError: the lease was lost or is past its local validity deadline.
            LockNotOwnedError: the lease was released.
        """
        self._state.check_valid(asyncio.get_running_loop().time())

    async def release(self) -> None:
        """Release the lock. Bounded in time, idempotent, and cancellation-safe.

        If the caller is cancelled while the release is in flight, the same (idempotent)
        release is finished by a background task the client owns, and the cancellation
        propagates at once: the lock is released either way. On a reentrant lock entered
        several times by its task, each ``release()`` undoes one entry.

        Raises:
            LockNotOwnedError: the lease was lost before this call (another holder may have
                the lock now); releasing twice is not an error.
            BackendError: the service could not be reached to confirm the release (the lease
                then ends by expiry).
        """
        await self._release(self._state)

    def __repr__(self) -> str:
        return (
            f"<Lease {self.name!r} {self._state.status.value} fencing_token={self.fencing_token}>"
        )
