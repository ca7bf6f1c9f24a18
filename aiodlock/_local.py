"""What one client holds and queues for locally: local turns, reentrancy and live leases.

Every lease the client is granted — through ``async with``, ``acquire()`` or ``try_acquire()``
— is recorded in :class:`Holdings` with its keep-alive, so there is one path for keep-alive,
reentrancy and teardown. The tasks of one client take :class:`Turns` at the service for a
mutex, a write lock or a semaphore permit, in arrival order: N local waiters cost the service
one. Nothing here grows with the number of lock names ever used. The design: docs/core.md.
"""

from __future__ import annotations

import asyncio
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from ._exceptions import LockLostError, LockNotOwnedError
from ._lease import Lease, LeaseState, LeaseStatus
from ._supervisor import Keeper, Supervisor
from .backends._protocol import Kind, LockSpec

__all__ = ["Holdings", "LiveLease", "Turn", "Turns", "is_exclusive", "takes_turns"]

_Family = tuple[Kind, str]  # one lock of the client's namespace: its kind and name
_TaskKey = tuple[Kind, str, "asyncio.Task[Any]"]


def is_exclusive(spec: LockSpec) -> bool:
    """Kinds with one holder at a time: the ones that can be re-entered."""
    return spec.kind in (Kind.MUTEX, Kind.WRITE)


def takes_turns(spec: LockSpec) -> bool:
    """Kinds whose local waiters contend at the service one at a time: all but readers, who
    share (when a writer leaves, every waiting reader must go at once)."""
    return spec.kind is not Kind.READ


class Turn:
    """One lock's FIFO turn among the tasks of one client.

    Like an :class:`asyncio.Lock` that hands itself over: :meth:`take` takes a free turn at
    once, with no await and no future (the common case: one task at a time); a task that finds
    it taken waits in arrival order (:meth:`wait`), and :meth:`release` passes the turn straight
    to the first waiter, so a task that just released cannot barge in ahead of it.

    Example::

        if not turn.take():
            await turn.wait()
        try:
            ...  # this task's turn
        finally:
            turn.release()
    """

    __slots__ = ("_taken", "_waiters", "users")

    def __init__(self) -> None:
        self._taken = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.users = 0  # tasks that joined and have not left (see Turns)

    def take(self) -> bool:
        """Take the turn if it is free; False if another task has it (then :meth:`wait`)."""
        if self._taken:
            return False
        self._taken = True
        return True

    async def wait(self) -> None:
        """Wait, in arrival order, until the turn is handed to this task."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                with suppress(ValueError):  # not yet passed over by a release
                    self._waiters.remove(waiter)
            else:
                self.release()  # handed over, then cancelled: pass the turn on
            raise

    def release(self) -> None:
        """End this task's turn: the first waiter has it now, or it is free."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._taken = False


class Turns:
    """Per lock that takes turns, a :class:`Turn` among this client's tasks (counted, so it is
    dropped when nobody uses it)."""

    __slots__ = ("_turns",)

    def __init__(self) -> None:
        self._turns: dict[_Family, Turn] = {}

    def join(self, spec: LockSpec) -> Turn:
        """The turn for ``spec``. Every join must be matched by one :meth:`leave`."""
        key = (spec.kind, spec.name)
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = Turn()
        turn.users += 1
        return turn

    def leave(self, spec: LockSpec) -> bool:
        """Stop using the turn for ``spec``; True if it was the last user (the turn is gone)."""
        key = (spec.kind, spec.name)
        turn = self._turns[key]
        turn.users -= 1
        if turn.users:
            return False
        del self._turns[key]
        return True

    def __len__(self) -> int:
        return len(self._turns)


@dataclass(slots=True, eq=False)
class LiveLease:
    """One lease the client keeps alive: its state, public view, keep-alive and entries."""

    state: LeaseState
    lease: Lease
    keeper: Keeper
    source: object  # the lock object that took it, for its statistics
    task_key: _TaskKey | None  # set for exclusive kinds: the owning task, for reentrancy
    depth: int = 1
    guarded: set[asyncio.Task[Any]] = field(default_factory=set)


class Holdings:
    """The client's table of live leases, reentrancy and local turns (docs/core.md)."""

    __slots__ = ("_by_task", "_live", "_supervisor", "turns")

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self._live: dict[LeaseState, LiveLease] = {}
        self._by_task: dict[_TaskKey, LiveLease] = {}
        self.turns = Turns()

    # ------------------------------------------------------------------ live leases

    def add(
        self,
        state: LeaseState,
        *,
        task: asyncio.Task[Any] | None,
        source: object,
        ttl: float,
        max_hold: float | None,
    ) -> LiveLease:
        """Record a fresh grant, owned by ``task``, and start keeping it alive."""
        keeper = self._supervisor.keep(state, ttl=ttl, max_hold=max_hold)
        spec = state.spec
        key = (spec.kind, spec.name, task) if task is not None and is_exclusive(spec) else None
        live = LiveLease(state, Lease(state, self.release), keeper, source, key)
        self._live[state] = live
        if key is not None:
            self._by_task[key] = live
        state.on_loss(lambda _: self._lost(live))
        return live

    def _lost(self, live: LiveLease) -> None:
        # A lost lease is over: the client stops tracking it at once (a lease from acquire()
        # that is never released must not stay forever), and gives back in the background
        # whatever may be left of it on the service. Its release() only reports the loss.
        if self._live.get(live.state) is not live:
            return
        self._forget(live)
        self._supervisor.compensate(live.state.spec, live.state.owner)

    def held_by(self, spec: LockSpec, task: asyncio.Task[Any]) -> LiveLease | None:
        """The exclusive lease ``task`` holds on ``spec``'s lock, if any (for reentrancy)."""
        if not is_exclusive(spec):
            return None
        live = self._by_task.get((spec.kind, spec.name, task))
        if live is not None and live.state.status is not LeaseStatus.HELD:
            # Lost in the background and never released: it no longer counts as held.
            self._forget(live)
            return None
        return live

    def reenter(self, live: LiveLease) -> Lease:
        """One more entry of a held lease by its task."""
        live.depth += 1
        return live.lease

    def claim_guard(self, live: LiveLease, task: asyncio.Task[Any]) -> bool:
        """True if ``task`` has no loss guard on this lease yet (and now has one): nested
        ``async with`` blocks of one task share the outermost guard."""
        if task in live.guarded:
            return False
        live.guarded.add(task)
        return True

    def drop_guard(self, live: LiveLease, task: asyncio.Task[Any]) -> None:
        """The guard ``task`` claimed is gone."""
        live.guarded.discard(task)

    def count(self, source: object) -> int:
        """Leases taken by ``source`` and held now."""
        return sum(
            1
            for live in self._live.values()
            if live.source is source and live.state.status is LeaseStatus.HELD
        )

    def __len__(self) -> int:
        return len(self._live)

    async def release(self, state: LeaseState) -> None:
        """Undo one entry of ``state``; the last one releases it on the service.

        Raises:
            LockNotOwnedError: the lease was lost before, or had expired on the service.
        """
        live = self._live.get(state)
        if live is not None and live.depth > 1:
            live.depth -= 1
            return
        if live is not None:
            self._forget(live)
        reason = state.lost_reason
        if not state.end():
            return  # released before: idempotent
        if reason is not None:
            # Lost before: its clean-up on the service is under way in the background
            # (_lost); the caller must not wait for a service that may be unreachable.
            raise LockNotOwnedError(f"{state.spec.describe()} was lost before release") from reason
        keeping = None if live is None or not state.renewing else live.keeper.running()
        # The caller leaves within request_timeout whatever the service does: a release still
        # unconfirmed then goes on in the background, and the lease is reported lost (its
        # holder cannot know whether the end of its critical section ran under the lock).
        budget = asyncio.timeout(self._supervisor.request_timeout)
        try:
            async with budget:
                if keeping is not None:
                    # A renewal is in flight, maybe on the very connection the release will
                    # use (MySQL pins one per lease): let the cancelled keep-alive finish.
                    try:
                        await asyncio.wait((keeping,))
                    except asyncio.CancelledError:
                        self._supervisor.compensate(state.spec, state.owner)
                        raise
                released = await self._supervisor.release(state.spec, state.owner)
        except TimeoutError as exc:
            if not budget.expired():
                raise
            what = f"release of {state.spec.describe()}"
            unconfirmed = self._supervisor.no_answer(what)
            state.found_lost(
                LockLostError(f"{unconfirmed}: it goes on in the background, the lease is lost")
            )
            raise unconfirmed from exc
        if not released:
            what = state.spec.describe()
            found = LockLostError(
                f"{what} was found expired or taken when it was released: "
                "the end of the critical section ran without it"
            )
            state.found_lost(found)
            raise LockNotOwnedError(f"{what} was not held at release (it expired)") from found

    def abandon(self, lease: Lease) -> None:
        """Stop keeping ``lease`` alive and forget it without releasing it, as a crashed
        process would: the service ends it by expiry (or session loss)."""
        for live in list(self._live.values()):
            if live.lease is lease:
                self._forget(live)

    def close(self) -> None:
        """The client is closing: stop every keep-alive and give back what is still held, in
        the background (the supervisor waits for it)."""
        for live in list(self._live.values()):
            self._forget(live)
            state = live.state
            # A body still running under the lease must not go on unprotected: it is told the
            # way any loss is told (cancelled, LockLostError; lease.lost set).
            what = state.spec.describe()
            state.lose(LockLostError(f"{what} was given back because its client closed"))
            if state.end():
                self._supervisor.compensate(state.spec, state.owner)

    def _forget(self, live: LiveLease) -> None:
        live.keeper.cancel()
        self._live.pop(live.state, None)
        if live.task_key is not None and self._by_task.get(live.task_key) is live:
            del self._by_task[live.task_key]
