"""The acquires in flight on one client, so that closing the client can end them.

:meth:`InFlight.interrupt` cancels each waiting task *inside* its acquire (as
:func:`asyncio.timeout` does), and the acquire turns that into one ``RuntimeError`` on every
backend; a task also cancelled from outside stays cancelled (why: docs/core.md).

Example (what a lock does around its wait)::

    with inflight.entered(task, spec):
        granted = await wait_for_grant(...)
    ...
    await inflight.interrupt()  # the client is closing
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Final

from .backends._protocol import LockSpec

__all__ = ["INTERRUPT_GRACE", "InFlight"]

INTERRUPT_GRACE: Final = 5.0
"""Seconds :meth:`InFlight.interrupt` waits for interrupted acquires to leave (a task that
swallows its cancellation is not waited for longer)."""


class InFlight:
    """The tasks now inside an acquire of one client (see the module docstring)."""

    __slots__ = ("_closed", "_interrupted", "_left", "_tasks")

    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[Any], int] = {}  # task -> acquires it is inside
        self._interrupted: set[asyncio.Task[Any]] = set()
        self._left: asyncio.Event | None = None  # set when the last one leaves
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def entered(self, task: asyncio.Task[Any], spec: LockSpec) -> _Entered:
        """A ``with`` block around one acquire of ``spec`` by ``task`` (the current task)."""
        return _Entered(self, task, spec)

    async def interrupt(self) -> None:
        """Refuse new acquires; cancel every one in flight and wait (bounded) until each has
        left."""
        self._closed = True
        if not self._tasks:
            return
        for task in self._tasks:
            if task not in self._interrupted:
                self._interrupted.add(task)
                task.cancel()
        self._left = asyncio.Event()
        try:
            async with asyncio.timeout(INTERRUPT_GRACE):
                await self._left.wait()
        except TimeoutError:
            pass  # the stragglers meet a closed client and fail on their own

    def enter(self, task: asyncio.Task[Any]) -> None:
        """``task`` starts an acquire (use :meth:`entered`).

        Raises:
            RuntimeError: the client is closing.
        """
        if self._closed:
            raise RuntimeError("this LockClient is closing; acquire from a client that is open")
        self._tasks[task] = self._tasks.get(task, 0) + 1

    def leave(self, task: asyncio.Task[Any], spec: LockSpec, exc: BaseException | None) -> None:
        """``task`` leaves an acquire of ``spec`` with ``exc``; an interrupted one raises
        ``RuntimeError`` in place of our cancellation."""
        depth = self._tasks.pop(task) - 1
        if depth:
            self._tasks[task] = depth
        elif not self._tasks and self._left is not None:
            self._left.set()
        if task not in self._interrupted or depth:
            return
        self._interrupted.discard(task)
        # Ours if the task was cancelled no more times than we cancelled it (as asyncio.timeout
        # decides); a cancellation from outside as well wins and propagates.
        if task.uncancel() == 0 and isinstance(exc, asyncio.CancelledError):
            raise RuntimeError(
                f"the LockClient was closed while waiting for {spec.describe()}"
            ) from None


class _Entered:
    __slots__ = ("_inflight", "_spec", "_task")

    def __init__(self, inflight: InFlight, task: asyncio.Task[Any], spec: LockSpec) -> None:
        self._inflight = inflight
        self._task = task
        self._spec = spec

    def __enter__(self) -> None:
        self._inflight.enter(self._task)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._inflight.leave(self._task, self._spec, exc)
