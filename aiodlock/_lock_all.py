"""Several locks at once, all or nothing: ``locks.lock_all([...])``.

Policy only: each lock is entered through its own ``async with`` (the same wait, reentrancy,
keep-alive, release, and :class:`~aiodlock._guard.LossGuard` that cancels the body on loss),
the locks nested in one :class:`contextlib.AsyncExitStack`. What this module adds:

* the canonical order — by name, then family (mutex, reader/writer, semaphore) — so that two
  callers asking for ``{a, b}`` and ``{b, a}`` take them in the same order and never deadlock;
* one deadline for the whole set: the time spent on the first lock counts for the rest;
* rollback: a timeout, an error or a cancellation on the way in leaves the locks already
  entered, in reverse order, before it propagates (a lease lost meanwhile: its LockLostError);
* the guards of every lease, nested: the first loss cancels the body, and the block raises
  :class:`~aiodlock.LockLostError` naming the lost lock (the outermost one, if several were).

Example::

    async with locks.lock_all(["from:7", "to:9"], timeout=5) as (source, target):
        await move(7, 9, fencing_tokens=(source.fencing_token, target.fencing_token))
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from ._exceptions import LockTimeoutError
from ._lease import Lease
from ._locks import BaseLock, Lock, ReadLock, Semaphore, WriteLock

__all__ = ["AllOf", "all_of", "canonical_key"]

# The family of each kind: the two sides of a reader/writer lock are one lock.
_FAMILY: dict[type[BaseLock], int] = {Lock: 0, ReadLock: 1, WriteLock: 1, Semaphore: 2}


def canonical_key(lock: BaseLock) -> tuple[str, int]:
    """Where ``lock`` comes in the order every ``lock_all`` takes its locks: by name, then by
    family (mutex, reader/writer, semaphore). Names compare as Python strings (code points),
    the same in every process."""
    return (lock.name, _FAMILY[type(lock)])


def all_of(
    items: Iterable[str | BaseLock],
    *,
    make: Callable[[str], BaseLock],
    mine: Callable[[BaseLock], bool],
    timeout: float | None,
) -> AllOf:
    """Check the arguments of ``lock_all`` and build its context manager.

    ``make`` turns a plain name into a mutex with the call's options; ``mine`` tells a lock
    object of the calling client (the only ones accepted).

    Raises:
        TypeError: ``items`` is a single string, or holds something else than a name or a
            lock object.
        ValueError: a lock of another client, or the same lock twice (same name and family).
    """
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise TypeError(
            f"lock_all() takes a list of names and lock objects, not {type(items).__name__}"
        )
    locks: list[BaseLock] = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            locks.append(make(item))
        elif isinstance(item, BaseLock):
            if not mine(item):
                raise ValueError(
                    f"lock_all() item {index} ({item.name!r}) was made by another client"
                )
            locks.append(item)
        else:
            raise TypeError(
                f"lock_all() item {index} must be a name (str) or a lock object, "
                f"not {type(item).__name__}"
            )
    seen: dict[tuple[str, int], BaseLock] = {}
    for lock in locks:
        key = canonical_key(lock)
        if key in seen:
            raise ValueError(
                f"lock_all() got {lock!r} and {seen[key]!r}: the same lock twice "
                "(one name and family)"
            )
        seen[key] = lock
    return AllOf(locks, timeout=timeout)


class AllOf:
    """Several locks held together: what ``locks.lock_all([...])`` returns.

    ``async with`` takes them all in the canonical order (:func:`canonical_key`) by one
    deadline, ``timeout`` seconds away, and gives the leases as a tuple in the caller's order;
    leaving releases them in reverse. A lock object's own ``timeout`` still bounds its own
    wait. ``timeout=0`` tries each lock once. Any number of tasks may use one object at the
    same time (each task its own entry).
    """

    def __init__(self, locks: list[BaseLock], *, timeout: float | None) -> None:
        self._locks = locks  # the caller's order
        self._order = sorted(range(len(locks)), key=lambda i: canonical_key(locks[i]))
        self.timeout = timeout
        self._entered: dict[asyncio.Task[Any], list[contextlib.AsyncExitStack]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """The locks' names, in the caller's order."""
        return tuple(lock.name for lock in self._locks)

    async def __aenter__(self) -> tuple[Lease, ...]:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("aiodlock locks must be used from an asyncio task")
        stack = contextlib.AsyncExitStack()
        leases: dict[int, Lease] = {}
        try:
            await self._enter_all(stack, leases)
        except BaseException:
            # A timeout, an error or a cancellation: leave what was entered, in reverse. Each
            # lock's exit releases; one whose lease was lost meanwhile raises LockLostError.
            if not await stack.__aexit__(*sys.exc_info()):
                raise
        self._entered.setdefault(task, []).append(stack)
        return tuple(leases[i] for i in range(len(self._locks)))

    async def _enter_all(self, stack: contextlib.AsyncExitStack, leases: dict[int, Lease]) -> None:
        timeout = self.timeout
        if not timeout:  # None: no deadline; 0: each lock's own one attempt
            for index in self._order:
                leases[index] = await stack.enter_async_context(self._locks[index])
            return
        waiting = ""
        try:
            async with asyncio.timeout(timeout) as deadline:
                for index in self._order:
                    waiting = self._locks[index].name
                    leases[index] = await stack.enter_async_context(self._locks[index])
        except TimeoutError as exc:
            if isinstance(exc, LockTimeoutError) or not deadline.expired():
                raise
            raise LockTimeoutError(
                f"lock_all(): {waiting!r} was not acquired within {timeout} s "
                f"(of {list(self.names)!r}, all or nothing)"
            ) from exc

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task = asyncio.current_task()
        assert task is not None
        stacks = self._entered[task]
        stack = stacks.pop()
        if not stacks:
            del self._entered[task]
        return bool(await stack.__aexit__(exc_type, exc, tb))

    def __repr__(self) -> str:
        return f"<AllOf {list(self.names)!r} timeout={self.timeout}>"
