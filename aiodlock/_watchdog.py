"""Keeping a lease alive, and saying so loudly when it cannot be.

The watchdog is one coroutine per held lease. It renews every ``ttl / 3`` and keeps
``lease.valid_until`` — the pessimistic local deadline computed from the *send* time of the
last confirmed renewal minus a drift margin. It ends only by raising :class:`LockLostError`
(or by being cancelled when the lease is released):

* the service refused the renewal (someone deleted or expired the lock);
* renewals kept failing (connection gone) until ``valid_until`` passed;
* the event loop stalled or the process was stopped past ``valid_until`` — checked on every
  wakeup, before anything else;
* ``max_hold`` was reached: renewals stop and the lease runs out.

Run inside the ``async with`` TaskGroup, its failure cancels the guarded body; run in the
client's TaskGroup (``acquire()`` outside ``async with``), it sets ``lease.lost``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, NoReturn

from ._exceptions import BackendError, LockLostError

if TYPE_CHECKING:
    from ._lease import Lease
    from ._locks import _LockBase

__all__ = ["drift", "keep_alive"]

# How many times per lease period a renewal is attempted, and how often a failed renewal is
# retried within the remaining validity.
RENEWALS_PER_TTL = 3
RETRY_FRACTION = 0.1


def drift(ttl: float) -> float:
    """Clock-drift margin subtracted from every lease (1 % + 2 ms, as in Redlock)."""
    return ttl * 0.01 + 0.002


async def keep_alive(lock: _LockBase, lease: Lease) -> NoReturn:
    """Renew ``lease`` until cancelled; raise :class:`LockLostError` (and mark it lost) on loss."""
    try:
        await _renew_forever(lock, lease)
    except LockLostError as exc:
        lease._mark_lost(exc)
        lock._note_lost()
        raise
    except Exception as exc:
        # A keep-alive that dies unexpectedly must not die silently (the renewal-thread bug
        # of the incumbents): without it the lease is not being kept, so it is lost.
        lost = LockLostError(f"the keep-alive of {lock.name!r} failed: {exc!r}")
        lost.__cause__ = exc
        lease._mark_lost(lost)
        lock._note_lost()
        raise lost from exc


async def _renew_forever(lock: _LockBase, lease: Lease) -> NoReturn:
    loop = asyncio.get_running_loop()
    ttl = lock.ttl
    interval = ttl / RENEWALS_PER_TTL
    hold_until = None if lock.max_hold is None else loop.time() + lock.max_hold
    next_renewal = loop.time() + interval
    # Session backends (ZooKeeper, MySQL) signal a loss the moment they see it.
    lost_signal = lock._backend.loss_signal(lock._spec, lease._owner)
    while True:
        wake_at = next_renewal
        if hold_until is not None and next_renewal >= hold_until:
            # max_hold reached: no more renewals; the lease runs out at valid_until.
            wake_at = lease.valid_until
        await _sleep_until(loop, min(wake_at, lease.valid_until), lost_signal)
        if lost_signal is not None and lost_signal.is_set():
            raise LockLostError(
                f"lock {lock.name!r} was lost: {lock._backend.describe()} "
                "ended the session or connection that held it"
            )
        now = loop.time()
        if now >= lease.valid_until:
            if hold_until is not None and now >= hold_until:
                raise LockLostError(f"lock {lock.name!r} was held longer than max_hold")
            raise LockLostError(
                f"lease on {lock.name!r} passed its local validity deadline "
                "(renewals failed, or the event loop or process was stalled)"
            )
        if now < next_renewal:
            continue
        sent = now
        try:
            async with asyncio.timeout_at(lease.valid_until):
                still_ours = await lock._backend.renew(lock._spec, lease._owner, ttl)
        except (BackendError, TimeoutError):
            # Transient failure: retry soon, but never past the validity deadline (the
            # check at the top of the loop turns that into a loss).
            next_renewal = min(loop.time() + ttl * RETRY_FRACTION, lease.valid_until)
            continue
        if not still_ours:
            raise LockLostError(f"lock {lock.name!r} is no longer held (renewal refused)")
        lease._valid_until = sent + ttl - drift(ttl)
        next_renewal = sent + interval


async def _sleep_until(
    loop: asyncio.AbstractEventLoop, when: float, signal: asyncio.Event | None
) -> None:
    # A timer, not a poll: the only periodic work is the renewal the lease needs anyway.
    delay = when - loop.time()
    if delay <= 0:
        return
    if signal is None:
        await asyncio.sleep(delay)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay):
            await signal.wait()
