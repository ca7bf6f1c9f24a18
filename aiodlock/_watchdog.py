"""Keeping a lease alive, and saying so loudly when it cannot be.

One coroutine per held lease renews every ``ttl / 3`` and keeps ``lease.valid_until`` (from the
*send* time of the last confirmed renewal, minus a drift margin). It ends only by a loss —
refused renewal, renewals failing past ``valid_until``, a stalled loop, ``max_hold`` — moving
the lease to LOST, or by being cancelled at release. The cases: docs/core.md.

Example (what the client's supervisor runs for every lease, from its first renewal on)::

    signal = backend.loss_signal(state.spec, state.owner)
    await keep_alive(backend, state, ttl=30.0, max_hold=None, started=granted_at,
                     lost_signal=signal)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import NoReturn

from . import _telemetry
from ._exceptions import BackendError, LockLostError
from ._lease import LeaseState, LeaseStatus
from .backends._protocol import Backend

__all__ = ["RENEWALS_PER_TTL", "drift", "keep_alive", "renew_once"]

# How many times per lease period a renewal is attempted, and how often a failed renewal is
# retried within the remaining validity.
RENEWALS_PER_TTL = 3
RETRY_FRACTION = 0.1


def drift(ttl: float) -> float:
    """Clock-drift margin subtracted from every lease (1 % + 2 ms, as in Redlock)."""
    return ttl * 0.01 + 0.002


async def keep_alive(
    backend: Backend,
    state: LeaseState,
    *,
    ttl: float,
    max_hold: float | None,
    started: float,
    lost_signal: asyncio.Event | None,
) -> NoReturn:
    """Renew ``state`` until cancelled; on loss mark it LOST and raise :class:`LockLostError`.

    ``started`` is the loop time the lease was granted at (renewals and ``max_hold`` count
    from it, even if this coroutine starts later); ``lost_signal`` is the backend's
    :meth:`~aiodlock.backends.Backend.loss_signal` for the lease.
    """
    try:
        await _renew_forever(backend, state, ttl, max_hold, started, lost_signal)
    except LockLostError as exc:
        state.lose(exc)
        raise
    except Exception as exc:
        # A keep-alive that dies unexpectedly must not die silently (the renewal-thread bug
        # of the incumbents): without it the lease is not being kept, so it is lost.
        lost = LockLostError(f"the keep-alive of {state.spec.name!r} failed: {exc!r}")
        lost.__cause__ = exc
        state.lose(lost)
        raise lost from exc


async def _renew_forever(
    backend: Backend,
    state: LeaseState,
    ttl: float,
    max_hold: float | None,
    started: float,
    lost_signal: asyncio.Event | None,
) -> NoReturn:
    loop = asyncio.get_running_loop()
    name = state.spec.name
    interval = ttl / RENEWALS_PER_TTL
    hold_until = None if max_hold is None else started + max_hold
    next_renewal = started + interval
    # Session backends (ZooKeeper, MySQL) signal a loss the moment they see it.
    failing = False  # in a streak of failed renewals (logged once, at its start)
    while True:
        wake_at = next_renewal
        if hold_until is not None and next_renewal >= hold_until:
            # max_hold reached: no more renewals; the lease runs out at valid_until.
            wake_at = state.valid_until
        await _sleep_until(loop, min(wake_at, state.valid_until), lost_signal)
        if lost_signal is not None and lost_signal.is_set():
            if hold_until is not None and loop.time() >= hold_until:
                # Renewals stopped at max_hold; a backend that ends an unrenewed lease itself
                # (ZooKeeper's reaper) may say so in the same loop turn as our own deadline.
                raise LockLostError(f"lock {name!r} was held longer than max_hold")
            raise LockLostError(
                f"lock {name!r} was lost: {backend.describe()} reported it gone (broken, "
                "deleted, or it ended the session or connection that held it)"
            )
        now = loop.time()
        if now >= state.valid_until:
            if hold_until is not None and now >= hold_until:
                raise LockLostError(f"lock {name!r} was held longer than max_hold")
            session = state.session_deadline()
            if session is not None and now >= session:
                raise LockLostError(
                    f"lease on {name!r} passed its session's deadline: no answer from "
                    f"{backend.describe()} in time (the event loop or process was stalled, or "
                    "the server is unreachable), so the server may have ended the session"
                )
            raise LockLostError(
                f"lease on {name!r} passed its local validity deadline "
                "(renewals failed, or the event loop or process was stalled)"
            )
        if now < next_renewal or (hold_until is not None and next_renewal >= hold_until):
            # Not due; or past max_hold, woken early by a session deadline that a keep-alive
            # moved meanwhile: never renew then, wait for the ttl-based deadline instead.
            continue
        sent = now
        try:
            async with state.renewal_lock:
                # Ended while this waited for an extend() to finish: nothing left to keep.
                if state.status is not LeaseStatus.HELD:
                    raise state.lost_reason or LockLostError(f"lock {name!r} was released")
                sent = loop.time()
                still_ours = await renew_once(backend, state, ttl, deadline=state.valid_until)
        except (BackendError, TimeoutError) as exc:
            # Transient failure: retry soon, but never past the validity deadline (the
            # check at the top of the loop turns that into a loss).
            next_renewal = min(loop.time() + ttl * RETRY_FRACTION, state.valid_until)
            if not failing:
                failing = True
                remaining = state.valid_until - loop.time()
                error = exc if str(exc) else TimeoutError("no answer in time")
                _telemetry.renewal_failed(
                    state.spec, state.fencing_token, error, remaining=remaining
                )
            continue
        if not still_ours:
            raise LockLostError(f"lock {name!r} is no longer held (renewal refused)")
        if failing:
            failing = False
            _telemetry.renewal_recovered(state.spec, state.fencing_token)
        next_renewal = sent + interval


async def renew_once(backend: Backend, state: LeaseState, ttl: float, *, deadline: float) -> bool:
    """One renewal of ``state`` to ``ttl``, cut off at ``deadline`` (loop time); on success
    ``valid_until`` moves to its send time + ``ttl`` - drift. The keep-alive and
    ``Lease.extend()`` both renew through it, holding ``state.renewal_lock``.

    Returns:
        False if the service says the lease is no longer held.

    Raises:
        BackendError: the service failed.
        TimeoutError: no answer by ``deadline``.
    """
    sent = asyncio.get_running_loop().time()
    state.renewing = True
    try:
        async with asyncio.timeout_at(deadline):
            still_ours = await backend.renew(state.spec, state.owner, ttl)
    finally:
        state.renewing = False
    if still_ours:
        state.renewed(sent + ttl - drift(ttl))
    return still_ours


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
