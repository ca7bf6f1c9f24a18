"""The Lease: what you hold after an acquisition."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, final

from ._exceptions import LockLostError, LockNotOwnedError

if TYPE_CHECKING:
    from ._locks import _LockBase

__all__ = ["Lease"]


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

    __slots__ = (
        "_lock",
        "_lost_reason",
        "_owner",
        "_released",
        "_valid_until",
        "fencing_token",
        "lost",
    )

    def __init__(
        self, lock: _LockBase, owner: str, fencing_token: int, valid_until: float
    ) -> None:
        self._lock = lock
        self._owner = owner
        self.fencing_token = fencing_token
        self._valid_until = valid_until
        self._released = False
        self._lost_reason: LockLostError | None = None
        self.lost = asyncio.Event()

    @property
    def name(self) -> str:
        """The lock's name, as given (without the namespace)."""
        return self._lock.name

    @property
    def valid_until(self) -> float:
        """Event-loop time (``loop.time()``) after which the lease must be considered expired.

        Computed pessimistically from the *send* time of the last confirmed acquire or renew,
        minus a drift margin, so it passes before the server could have expired the lease.
        """
        return self._valid_until

    @property
    def held(self) -> bool:
        """True until the lease is released or lost."""
        return not (self._released or self.lost.is_set())

    def assert_held(self) -> None:
        """Raise :class:`LockLostError` unless the lease is held and locally valid now.

        Call it right before a side effect that must not happen without the lock.
        """
        if self._lost_reason is not None:
            raise self._lost_reason
        if self._released:
            raise LockNotOwnedError(f"lease on {self.name!r} was released")
        if asyncio.get_running_loop().time() >= self._valid_until:
            raise LockLostError(f"lease on {self.name!r} is past its validity deadline")

    async def release(self) -> None:
        """Release the lock. Bounded in time, idempotent, and cancellation-safe.

        If the caller is cancelled while the release is in flight, the same (idempotent)
        release is finished by a background task the client owns, and the cancellation
        propagates at once: the lock is released either way.

        Raises:
            LockNotOwnedError: the lease was lost before this call (another holder may have
                the lock now); releasing twice is not an error.
            BackendError: the service could not be reached to confirm the release (the lease
                then ends by expiry).
        """
        await self._lock._release_lease(self)

    def _mark_lost(self, reason: LockLostError) -> None:
        if self._lost_reason is None and not self._released:
            self._lost_reason = reason
            self.lost.set()

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost.is_set() else "held"
        return f"<Lease {self.name!r} {state} fencing_token={self.fencing_token}>"
