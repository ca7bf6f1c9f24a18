"""The exception tree of aiodlock (what each one means: docs/core.md).

Every error the library raises on purpose is one of these::

    LockError
     ├── LockTimeoutError      (also a TimeoutError)  acquire() waited `timeout` seconds
     ├── LockLostError         the lease ended while it was held: the guarded body was cancelled
     ├── LockNotOwnedError     release() of a lease that was already lost or released elsewhere
     ├── StaleTokenError       a FencingGuard refused a fencing token older than one it has seen
     ├── UnsupportedError      the backend lacks a capability; raised when the lock object is built
     ├── LimitMismatchError    (also a ValueError)  a semaphore is in use with another `limit`
     └── BackendError          the coordination service failed; the driver's exception is chained

Bad arguments are ``ValueError`` / ``TypeError``; driver exceptions never escape raw.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "LimitMismatchError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "StaleTokenError",
    "UnsupportedError",
]


class LockError(Exception):
    """Base class of every error aiodlock raises on purpose."""


class LockTimeoutError(LockError, TimeoutError):
    """``acquire()`` (or ``async with``) did not get the lock within its ``timeout``.

    It is also a :class:`TimeoutError`, so ``except TimeoutError`` catches it.
    """


class LockLostError(LockError):
    """The lease ended while it was held.

    Raised from ``async with lock:`` after the guarded body was cancelled because the watchdog
    could not keep the lease alive: a renewal was refused, the connection or session is gone,
    the pessimistic local validity deadline passed, or ``max_hold`` was reached.
    """


class LockNotOwnedError(LockError):
    """``release()`` was called on a lease this client no longer owns (lost or expired)."""


class StaleTokenError(LockError):
    """A :class:`~aiodlock.FencingGuard` refused a fencing token older than the newest it saw."""


class UnsupportedError(LockError):
    """The backend cannot provide this kind of lock or option.

    Raised when the lock object is built (``locks.read_lock(...)``), never later in
    ``acquire()``, so an unsupported combination fails at the first line that names it.
    """


class LimitMismatchError(LockError, ValueError):
    """A semaphore was asked for with a ``limit`` other than the one its holders use.

    Raised from ``acquire()`` (or ``async with``): the service refused the permit, and nothing
    of this attempt is left behind. It is a programming error — every client must use the same
    ``limit`` for a name — so it is also a :class:`ValueError`, never a
    :class:`BackendError`. Once every permit of the name is released, a new limit is accepted.
    ``in_use`` is the holders' limit, ``requested`` this caller's.
    """

    def __init__(self, name: str, in_use: int, requested: int) -> None:
        super().__init__(
            f"semaphore {name!r} is in use with limit {in_use}; this one asks for limit {requested}"
        )
        self.name = name
        self.in_use = in_use
        self.requested = requested

    def __reduce__(self) -> tuple[type[LimitMismatchError], tuple[str, int, int]]:
        return (type(self), (self.name, self.in_use, self.requested))


class BackendError(LockError):
    """The coordination service failed: connection refused or lost, protocol error, timeout.

    The driver's own exception is chained as ``__cause__``. ``request_sent`` is False when the
    request provably never left this process (no connection could be made), so nothing it
    might have done on the service needs undoing.
    """

    def __init__(self, *args: object, request_sent: bool = True) -> None:
        super().__init__(*args)
        self.request_sent = request_sent
