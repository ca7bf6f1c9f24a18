"""The owner of every background task of one client: keep-alives and compensating releases.

They run in the client's one task group (a :class:`~aiodlock.backends.Tasks` share), so
leaving ``async with aiodlock.connect(...)`` leaves nothing running. A failing service is
logged by its state, not per request (one WARNING, one INFO at recovery: docs/core.md).

Example (what the client does)::

    supervisor = Supervisor(backend, root.tasks())
    keeper = supervisor.keep(state, ttl=30.0, max_hold=None)
    released = await supervisor.release(spec, owner)
    await supervisor.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final

from ._exceptions import BackendError, LockLostError
from ._lease import LeaseState
from ._watchdog import RENEWALS_PER_TTL, keep_alive
from .backends._deadlines import EARLY
from .backends._protocol import Backend, LockSpec, LossSignal
from .backends._tasks import Tasks

__all__ = ["RELEASE_TIMEOUT", "Keeper", "Supervisor", "logger"]

logger = logging.getLogger("aiodlock")

RELEASE_TIMEOUT: Final = 5.0
"""Seconds a background (compensating) release may take before it is abandoned to the
lease's own expiry."""


class Keeper:
    """The keep-alive of one lease: a place in a :class:`_FirstRenewals` queue until its first
    renewal is due, then a task.

    Most holds end long before their first renewal (ttl/3), so the task of the supervisor's
    group is only started when there is work for it. A lease whose backend signals losses (a
    session backend) is watched from the grant on: through a callback on its
    :class:`~aiodlock.backends.LossSignal`, which starts the task the moment the loss is
    signalled; a plain :class:`asyncio.Event` gets its task at once.
    """

    __slots__ = (
        "_max_hold",
        "_queue",
        "_signal",
        "_started",
        "_state",
        "_supervisor",
        "_ttl",
        "task",
    )

    def __init__(
        self,
        supervisor: Supervisor,
        state: LeaseState,
        ttl: float,
        max_hold: float | None,
        started: float,
        signal: asyncio.Event | None,
    ) -> None:
        self._supervisor = supervisor
        self._state = state
        self._ttl = ttl
        self._max_hold = max_hold
        self._started = started
        self._signal = signal
        self._queue: _FirstRenewals | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the keep-alive task (unless the client is closing: its holdings end the
        lease)."""
        supervisor = self._supervisor
        if supervisor.running:
            name = f"aiodlock-keepalive-{self._state.spec.name}"
            self.task = supervisor._spawn(self._keep(), name=name)

    async def _keep(self) -> None:
        # keep_alive reports a loss through the lease's state before raising it.
        with contextlib.suppress(LockLostError):
            await keep_alive(
                self._supervisor._backend,
                self._state,
                ttl=self._ttl,
                max_hold=self._max_hold,
                started=self._started,
                lost_signal=self._signal,
            )

    def watch(self) -> None:
        """Start the task as soon as the lease's loss signal is set, if it has not started by
        then."""
        assert isinstance(self._signal, LossSignal)
        self._signal.add_callback(self._start_now)

    def _start_now(self) -> None:
        if self._queue is not None:
            self._queue.start_now(self)

    def cancel(self) -> None:
        """Stop keeping the lease (a keep-alive reporting its own loss is left to finish)."""
        signal = self._signal
        if isinstance(signal, LossSignal):
            signal.remove_callback(self._start_now)
        if self._queue is not None:
            self._queue.discard(self)
            self._queue = None
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def running(self) -> asyncio.Task[None] | None:
        """The keep-alive task, if it was started and has not finished."""
        task = self.task
        return task if task is not None and not task.done() else None


class _FirstRenewals:
    """The keepers whose first renewal comes ``delay`` seconds after their grant, with one loop
    timer for all of them rather than one per lease.

    They fall due in the order they were granted, so an insertion-ordered dict is a queue
    whose head is due first, and a lease released before its renewal leaves it in O(1). The
    timer is left armed when the queue empties (most holds are that short): a hold after it
    costs a dict entry, not a timer; a timer that finds nothing due re-arms for the head, or
    drops the queue. A keep-alive started a little early is harmless: it counts its renewals
    from the grant.
    """

    __slots__ = ("_due", "_loop", "_timer", "_unused", "delay")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        delay: float,
        unused: Callable[[_FirstRenewals], None],
    ) -> None:
        self._loop = loop
        self.delay = delay
        self._due: dict[Keeper, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._unused = unused

    def push(self, keeper: Keeper, granted: float) -> None:
        """Start ``keeper``'s task ``delay`` after ``granted`` (loop time)."""
        when = granted + self.delay
        self._due[keeper] = when
        keeper._queue = self
        if self._timer is None:
            self._timer = self._loop.call_at(when, self._fire)

    def discard(self, keeper: Keeper) -> None:
        """``keeper``'s lease ended before its first renewal."""
        self._due.pop(keeper, None)

    def start_now(self, keeper: Keeper) -> None:
        """Start ``keeper``'s task now (its lease's loss was signalled)."""
        due = self._due.pop(keeper, None)
        keeper._queue = None
        if due is not None:
            keeper.start()

    def close(self) -> None:
        """Forget every keeper and the timer (the client is closing)."""
        self._due.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        due = self._due
        # Timers may fire a little before their time: a keep-alive started that early is
        # harmless, so what is due within EARLY is due now.
        now = self._loop.time() + EARLY
        while due:
            keeper = next(iter(due))
            when = due[keeper]
            if when > now:
                self._timer = self._loop.call_at(when, self._fire)
                return
            del due[keeper]
            keeper._queue = None
            keeper.start()
        self._unused(self)


class Supervisor:
    """Runs and owns a client's background tasks (see the module docstring)."""

    __slots__ = ("_backend", "_cleanups", "_failing", "_first_renewals", "_tasks")

    def __init__(self, backend: Backend, tasks: Tasks) -> None:
        self._backend = backend
        self._tasks = tasks
        self._cleanups: set[asyncio.Task[None]] = set()
        self._failing = False  # the last request we could judge by failed (see failed())
        self._first_renewals: dict[float, _FirstRenewals] = {}  # by delay

    @property
    def running(self) -> bool:
        """True until :meth:`stop` (while the client's task group is open)."""
        return not self._tasks.closed

    @property
    def cleanups(self) -> int:
        """Compensating releases still running."""
        return len(self._cleanups)

    async def stop(self) -> None:
        """Wait for every task still running, then take no more. Cancel keep-alives first."""
        for queue in self._first_renewals.values():
            queue.close()
        self._first_renewals.clear()
        await self._tasks.wait()
        await self._tasks.aclose()

    def require_running(self) -> None:
        """Raise ``RuntimeError`` unless the client is open (a programming error)."""
        if self._tasks.closed:
            raise RuntimeError(
                "this LockClient is not open: use `async with aiodlock.connect(...) as locks:`"
            )

    def keep(self, state: LeaseState, *, ttl: float, max_hold: float | None) -> Keeper:
        """Keep a lease granted just now alive; ``cancel()`` the returned keeper to stop."""
        self.require_running()
        loop = asyncio.get_running_loop()
        started = loop.time()
        signal = self._backend.loss_signal(state.spec, state.owner)
        keeper = Keeper(self, state, ttl, max_hold, started, signal)
        delay = ttl / RENEWALS_PER_TTL
        if signal is not None and (
            not isinstance(signal, LossSignal) or state.valid_until < started + delay
        ):
            # An Event without callbacks, or a session whose deadline comes before the first
            # renewal: the task watches it from the grant on.
            keeper.start()
            return keeper
        queue = self._first_renewals.get(delay)
        if queue is None:
            queue = self._first_renewals[delay] = _FirstRenewals(
                loop, delay, self._drop_first_renewals
            )
        queue.push(keeper, started)
        if signal is not None:
            keeper.watch()  # after push: a signal set already starts the task at once
        return keeper

    def _drop_first_renewals(self, queue: _FirstRenewals) -> None:
        if self._first_renewals.get(queue.delay) is queue:
            del self._first_renewals[queue.delay]

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Release-if-owner; if cancelled midway, finish it in the background.

        The fast path runs inline (no task, no timer of its own: the lease's release in
        ``Holdings.release`` bounds the whole of it by ``request_timeout``, and a queue's
        release in ``attempt_once`` is inside that attempt's bound). Release is idempotent,
        so when the caller is cancelled while the request is in flight the same release is
        simply sent again from an owned background task, and the cancellation propagates at
        once.
        """
        try:
            released = await self._backend.release(spec, owner)
        except asyncio.CancelledError:
            self.compensate(spec, owner)
            raise
        self.answered()
        return released

    @property
    def request_timeout(self) -> float:
        """The backend's bound on one request (what a release may keep its caller)."""
        return self._backend.request_timeout

    def no_answer(self, what: str) -> BackendError:
        """The error of a request cut off at ``request_timeout`` (the service stalled)."""
        return BackendError(
            f"{what} got no answer from {self._backend.describe()} within "
            f"request_timeout ({self.request_timeout:g} s)"
        )

    def compensate(self, spec: LockSpec, owner: str) -> None:
        """Release-if-owner in the background: for an acquire whose outcome is unknown, a grant
        nobody will use, or a queue entry nobody will wait on. After stop(), the lease simply
        ends by expiry."""
        if self._tasks.closed:
            return
        task = self._spawn(self._background_release(spec, owner), name="aiodlock-release")
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _background_release(self, spec: LockSpec, owner: str) -> None:
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                await self._backend.release(spec, owner)
        except TimeoutError as exc:
            silent = TimeoutError(f"no answer within {RELEASE_TIMEOUT:g} s")  # ours says nothing
            self.failed(f"background release of {spec.describe()}", exc if str(exc) else silent)
        except Exception as exc:
            self.failed(f"background release of {spec.describe()}", exc)
        else:
            self.answered()

    def failed(self, what: str, exc: BaseException) -> None:
        """A request to the service failed: log it if it is the first since the last answer
        (WARNING, and that the next ones are quiet), else at DEBUG."""
        if self._failing:
            logger.debug("%s failed: %s", what, exc)
            return
        self._failing = True
        logger.warning(
            "%s failed: %s (further failures are logged at DEBUG until %s answers again)",
            what,
            exc,
            self._backend.describe(),
        )

    def answered(self) -> None:
        """A request to the service succeeded: log the recovery once, after failures."""
        if self._failing:
            self._failing = False
            logger.info("%s answers again", self._backend.describe())

    async def settle(self) -> None:
        """Wait until the compensating releases running now (and any they start) are done."""
        while self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        if self._tasks.closed:
            coro.close()
            self.require_running()
        return self._tasks.spawn(coro, name)
