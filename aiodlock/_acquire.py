"""The one wait loop: try, arm the wakeup, re-check, wait (capped), repeat.

Shared by every lock kind and by recipes built on the public API. It is the same for every
backend: try; if refused, arm the wakeup (subscribe), *then* try again (a release between the
two would otherwise be missed); then wait until woken or until the blocking holder's lease
could have run out (``Busy.retry_after``), and repeat. Nothing sleeps on a fixed interval.

Every attempt whose outcome is unknown (cancelled in flight, connection dropped before the
reply) is compensated with a release-if-owner in the client's supervisor, and so is a grant
that lands while the waiter is being left, and a queue entry nobody will wait on.

Example (what ``Lock.acquire`` does)::

    granted = await wait_for_grant(backend, supervisor, turns, spec, ttl=30.0,
                                   timeout=5.0, counters=counters)
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from random import getrandbits
from typing import Final, NamedTuple, cast

from ._exceptions import BackendError, LockTimeoutError
from ._local import Turn, Turns, takes_turns
from ._supervisor import Supervisor
from .backends._protocol import Backend, Busy, Grant, LockSpec, TurnObserver

__all__ = [
    "REPLY_GRACE",
    "AcquireCounters",
    "Granted",
    "attempt_once",
    "wait_for_grant",
]

REPLY_GRACE: Final = 0.05
"""Seconds past an acquire's deadline that a reply already in flight may take to land (a
grant in hand beats a timeout); then the request is cut off. The deadline is kept within
``timeout`` + 100 ms whatever the service does."""


@dataclass(slots=True)
class AcquireCounters:
    """Acquisitions of one lock object: waiting now, granted, timed out."""

    waiting: int = 0
    acquired: int = 0
    timeouts: int = 0


class Granted(NamedTuple):
    """A grant: ``owner`` holds the lock with ``fencing_token``; the request left at ``sent``
    (loop time), from which the lease's local validity is counted."""

    owner: str
    fencing_token: int
    sent: float


def queues(backend: Backend, spec: LockSpec) -> bool:
    """Whether a ``Busy`` leaves the owner queued at the service (see the backend protocol)."""
    return spec.fair or backend.queues_on_busy


async def attempt_once(
    backend: Backend,
    supervisor: Supervisor,
    spec: LockSpec,
    *,
    ttl: float,
    counters: AcquireCounters,
) -> Granted | None:
    """One attempt that never waits: the grant, or None (leaving any queue it joined).

    The whole of it, however many callers share the client's connections, ends within the
    backend's ``request_timeout``: a service that stalls is a ``BackendError`` then.
    """
    owner = new_owner()
    budget = asyncio.timeout(backend.request_timeout)
    try:
        async with budget:
            attempt, sent = await _attempt(backend, supervisor, spec, owner, ttl)
            if isinstance(attempt, Busy):
                if queues(backend, spec):
                    # The refusal queued us; we will not wait.
                    await supervisor.release(spec, owner)
                return None
    except TimeoutError as exc:
        if not budget.expired():
            raise
        raise supervisor.no_answer(f"try_acquire of {spec.describe()}") from exc
    counters.acquired += 1
    return Granted(owner, attempt.fencing_token, sent)


async def wait_for_grant(
    backend: Backend,
    supervisor: Supervisor,
    turns: Turns,
    spec: LockSpec,
    *,
    ttl: float,
    timeout: float | None,
    counters: AcquireCounters,
) -> Granted:
    """Wait up to ``timeout`` seconds (``None``: forever) for a grant.

    The deadline holds whatever the service does: a request still unanswered at the deadline
    (a stalled server, a pool whose connections all hang) is cut off ``REPLY_GRACE`` later,
    and compensated like any cancelled attempt. ``timeout=0`` is one attempt: like
    ``try_acquire()``, it is given ``request_timeout`` (a deadline of 0 would refuse every
    grant that takes a round trip).

    Raises:
        LockTimeoutError: not granted in time.
        BackendError: the service failed, or (``timeout=0``) did not answer in time.
    """
    if timeout is None:
        return await _contend(backend, supervisor, turns, spec, ttl, None, timeout, counters)
    now = asyncio.get_running_loop().time()
    deadline = now + timeout
    once = timeout == 0
    cutoff = asyncio.timeout_at(now + backend.request_timeout if once else deadline + REPLY_GRACE)
    try:
        async with cutoff:
            return await _contend(
                backend, supervisor, turns, spec, ttl, deadline, timeout, counters
            )
    except TimeoutError as exc:
        if not cutoff.expired():
            raise
        if once:
            raise supervisor.no_answer(f"acquire of {spec.describe()}") from exc
        raise _timed_out(spec, timeout, counters) from None


async def _contend(
    backend: Backend,
    supervisor: Supervisor,
    turns: Turns,
    spec: LockSpec,
    ttl: float,
    deadline: float | None,
    timeout: float | None,
    counters: AcquireCounters,
) -> Granted:
    # Tasks of one client take turns, in arrival order, to contend at the service (which
    # already queues fair waiters itself). A backend told when the turns begin and end
    # (TurnObserver) may pass its queue entry on from turn to turn.
    turn = None
    if takes_turns(spec) and not queues(backend, spec):
        turn = _join(backend, turns, spec)
        if not turn.take():
            try:
                await _wait_for_turn(turn, spec, deadline, timeout, counters)
            except BaseException:
                _leave(backend, turns, spec)
                raise
    try:
        owner = new_owner()
        attempt, sent = await _attempt(backend, supervisor, spec, owner, ttl)
        if type(attempt) is Grant:
            counters.acquired += 1
            return Granted(owner, attempt.fencing_token, sent)
        return await _wait(backend, supervisor, spec, owner, ttl, deadline, timeout, counters)
    finally:
        if turn is not None:
            turn.release()
            _leave(backend, turns, spec)


def _join(backend: Backend, turns: Turns, spec: LockSpec) -> Turn:
    """Join ``spec``'s turn; the first task to want the lock tells an observing backend."""
    turn = turns.join(spec)
    if turn.users == 1 and _observes_turns(type(backend)):
        cast(TurnObserver, backend).turns_began(spec)
    return turn


def _leave(backend: Backend, turns: Turns, spec: LockSpec) -> None:
    """Leave ``spec``'s turn; the last task to leave tells an observing backend."""
    if turns.leave(spec) and _observes_turns(type(backend)):
        cast(TurnObserver, backend).turns_ended(spec)


@functools.cache
def _observes_turns(backend_type: type) -> bool:
    # Once per backend class: a runtime protocol check costs microseconds, and this runs
    # twice per acquisition.
    return issubclass(backend_type, TurnObserver)


async def _wait_for_turn(
    turn: Turn,
    spec: LockSpec,
    deadline: float | None,
    timeout: float | None,
    counters: AcquireCounters,
) -> None:
    counters.waiting += 1
    try:
        async with asyncio.timeout_at(deadline):
            await turn.wait()
    except TimeoutError:
        raise _timed_out(spec, timeout, counters) from None
    finally:
        counters.waiting -= 1


async def _wait(
    backend: Backend,
    supervisor: Supervisor,
    spec: LockSpec,
    owner: str,
    ttl: float,
    deadline: float | None,
    timeout: float | None,
    counters: AcquireCounters,
) -> Granted:
    """``owner``'s first attempt was refused (in this loop step): arm the wakeup, re-check,
    wait, repeat."""
    loop = asyncio.get_running_loop()
    counters.waiting += 1
    granted: Grant | None = None
    try:
        # Entered in the same loop step as the Busy answer (the backend protocol's rule).
        async with backend.waiter(spec, owner) as waiter:
            while True:
                # Re-check now that the wakeup is armed: a release that happened before the
                # subscription was live would otherwise be missed.
                attempt, sent = await _attempt(backend, supervisor, spec, owner, ttl)
                if isinstance(attempt, Grant):
                    granted = attempt
                    break
                wait_for = attempt.retry_after
                if deadline is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise _timed_out(spec, timeout, counters)
                    wait_for = remaining if wait_for is None else min(wait_for, remaining)
                await waiter.wait(wait_for)
    except BaseException:
        if granted is not None or queues(backend, spec):
            # Granted, then cancelled while leaving the waiter: give the lock back. Or leave
            # the queue so the waiters behind us are not held up.
            supervisor.compensate(spec, owner)
        raise
    finally:
        counters.waiting -= 1
    counters.acquired += 1
    return Granted(owner, granted.fencing_token, sent)


def _timed_out(
    spec: LockSpec, timeout: float | None, counters: AcquireCounters
) -> LockTimeoutError:
    """Count a wait that gave up, and the error it raises."""
    counters.timeouts += 1
    return LockTimeoutError(f"could not acquire {spec.describe()} within {timeout} s")


async def _attempt(
    backend: Backend, supervisor: Supervisor, spec: LockSpec, owner: str, ttl: float
) -> tuple[Grant | Busy, float]:
    """One try, compensated if its outcome is unknown.

    If we are cancelled (or the connection drops) while the request is in flight, the service
    may have granted the lock anyway: release-if-owner runs in the background before the
    exception propagates, so no orphan lock is left behind.
    """
    sent = asyncio.get_running_loop().time()
    try:
        attempt = await backend.try_acquire(spec, owner, ttl)
    except BackendError as exc:
        if exc.request_sent:
            supervisor.compensate(spec, owner)
        raise
    except BaseException:
        supervisor.compensate(spec, owner)
        raise
    supervisor.answered()
    if type(attempt) is Grant and attempt.sent is not None:
        sent = attempt.sent  # handed over: the lease began with an earlier request
    return attempt, sent


def new_owner() -> str:
    """A fresh owner token: random lowercase hex, safe in keys, paths and messages.

    96 random bits, unique across processes and time without coordination. Not from
    ``secrets``: a token is not a secret (anyone who can read the service sees it), and the
    system call would cost every acquisition; ``random`` reseeds in a forked child.
    """
    return f"{getrandbits(96):024x}"
