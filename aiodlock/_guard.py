"""Cancelling the guarded code when its lease is lost — and saying so with LockLostError.

:class:`LossGuard` does for a lease what :func:`asyncio.timeout` does for a deadline, telling
its own cancellation from anyone else's by the task's cancel count (outcomes: docs/core.md).

Example (what ``Lock.__aenter__``/``__aexit__`` do)::

    guard = LossGuard(state, task)
    guard.arm()
    try:
        await body()
    finally:
        if guard.disarm():  # lost while armed
            outcome = await guard.settle(exc_type)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ._exceptions import LockLostError
from ._lease import LeaseState

__all__ = ["GuardOutcome", "LossGuard"]


@dataclass(frozen=True, slots=True)
class GuardOutcome:
    """How the body ended, as far as the lease is concerned.

    ``lost`` is the error to raise instead of the body's ``CancelledError`` (our cancellation
    only); ``cancelled`` says a cancellation from outside must propagate although its delivery
    was taken here.
    """

    lost: LockLostError | None = None
    cancelled: bool = False


_QUIET = GuardOutcome()


class LossGuard:
    """Cancel ``task`` when ``state`` is lost (the outcomes: docs/core.md)."""

    __slots__ = ("_cancelling", "_reason", "_state", "_task")

    def __init__(self, state: LeaseState, task: asyncio.Task[Any]) -> None:
        self._state = state
        self._task = task
        self._cancelling = 0
        self._reason: LockLostError | None = None

    def arm(self) -> None:
        """Start listening; a lease that is already lost cancels the body at its first await."""
        self._cancelling = self._task.cancelling()
        self._state.on_loss(self._on_loss)

    def _on_loss(self, reason: LockLostError) -> None:
        if self._reason is None:
            self._reason = reason
            self._task.cancel(f"aiodlock: {reason}")

    def disarm(self) -> bool:
        """Stop listening. True if the lease was lost while armed: then :meth:`settle` how the
        body ended (the hot path, False, has nothing to undo and no await)."""
        self._state.cancel_on_loss(self._on_loss)
        return self._reason is not None

    async def settle(self, exc_type: type[BaseException] | None) -> GuardOutcome:
        """After a loss, settle the cancel count and say what to raise (docs/core.md)."""
        reason = self._reason
        if reason is None:
            return _QUIET
        delivered_here = False
        if exc_type is not asyncio.CancelledError:
            # The body finished (or raised) after we asked for its cancellation but before it
            # was delivered: take the delivery here, not at the caller's next await.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                delivered_here = True
        outside = self._task.uncancel() > self._cancelling
        if exc_type is asyncio.CancelledError:
            return GuardOutcome(cancelled=True) if outside else GuardOutcome(lost=reason)
        if outside and delivered_here:
            return GuardOutcome(cancelled=True)
        if exc_type is None:
            # The body swallowed our cancellation or finished first: it still ran unprotected.
            return GuardOutcome(lost=reason)
        return _QUIET  # the body's own exception wins
