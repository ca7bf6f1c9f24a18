"""The ZooKeeper backend: one session per session timeout its locks' ttls ask for.

A crashed holder's node goes when the server expires its session, so the session timeout,
not the lock's ``ttl``, says how soon a dead holder is replaced. A lock whose ``ttl`` is
shorter than ``session_ttl`` is therefore kept on a session of its own, whose timeout is the
largest step of :data:`SESSION_STEPS` not above the ttl (1 s at least): a holder SIGKILLed
with ``ttl=3`` is replaced about 3 s later, as on Redis. That session is opened by the first
attempt that needs it and kept until :meth:`ZooKeeperBackend.aclose`, so a client has at most
one per step below ``session_ttl``; a ttl at or above ``session_ttl`` uses the main session
(docs/zookeeper.md, "Lease, session and loss").

Example::

    backend = ZooKeeperBackend(parse_url("zookeeper://zk1:2181/apps"), {"session_ttl": 10})
    await backend.open(tasks)  # what aiodlock.connect() does, with the client's Tasks share
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Final

from .. import BackendError, Busy, Capability, Grant, LockInfo, LockSpec, ParsedURL, Tasks, Waiter
from ._backend import SessionBackend
from ._settings import OPTIONS, Settings

__all__ = ["SESSION_STEPS", "ZooKeeperBackend", "session_timeout_for"]

logger = logging.getLogger("aiodlock.zookeeper")

SESSION_STEPS: Final = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0)
"""The session timeouts a short ttl may get (seconds): a few sessions at most per client."""

_SUMMED: Final = (
    "entries", "kept", "handed", "held", "waiters", "watches", "doomed", "sessions",
    "reconnects", "losses", "adopted",
)  # fmt: skip


def session_timeout_for(ttl: float, session_ttl: float) -> float | None:
    """The session timeout a lock of ``ttl`` is kept on; ``None``: the main session's."""
    if ttl >= session_ttl:
        return None
    fitting = [step for step in SESSION_STEPS if step <= ttl]
    step = fitting[-1] if fitting else SESSION_STEPS[0]
    return None if step >= session_ttl else step


class ZooKeeperBackend:
    """Locks on a ZooKeeper ensemble (docs/zookeeper.md has the recipe and options).

    Example::

        async with aiodlock.connect("zookeeper://127.0.0.1:2181/apps?session_ttl=6") as locks:
            async with locks.read_lock("catalog"):
                ...
    """

    queues_on_busy: ClassVar[bool] = SessionBackend.queues_on_busy
    capabilities: ClassVar[frozenset[Capability]] = SessionBackend.capabilities
    options: ClassVar[Mapping[str, type]] = OPTIONS

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        self._settings = Settings.parse(url, options)
        self._main = SessionBackend(self._settings)
        self._shorter: dict[float, SessionBackend] = {}  # by session timeout
        self._opening: dict[float, asyncio.Task[None]] = {}
        self._tasks: Tasks | None = None
        # The locks our tasks take turns for now: a session opened meanwhile is told too.
        self._turning: dict[LockSpec, None] = {}

    def _sessions(self) -> list[SessionBackend]:
        return [self._main, *self._shorter.values()]

    # ------------------------------------------------------------------ lifetime

    async def open(self, tasks: Tasks) -> None:
        """Connect and start the main session; BackendError if no server answers in time."""
        self._tasks = tasks
        await self._main.open(tasks)

    async def aclose(self) -> None:
        """Close every session (the server deletes their nodes) and stop every task."""
        for task in self._opening.values():
            task.cancel()
        shorter, self._shorter = list(self._shorter.values()), {}
        for backend in shorter:
            with contextlib.suppress(Exception):
                await backend.aclose()
        await self._main.aclose()  # last: it closes the Tasks share

    async def settle(self) -> None:
        """Wait for the queue nodes every session leaves in the background."""
        for backend in self._sessions():
            await backend.settle()

    async def _session_for(self, ttl: float) -> SessionBackend:
        timeout = session_timeout_for(ttl, self._settings.session_ttl)
        if timeout is None:
            return self._main
        backend = self._shorter.get(timeout)
        if backend is not None:
            return backend
        opening = self._opening.get(timeout)
        if opening is None:
            if self._tasks is None or self._tasks.closed:
                raise BackendError(f"{self.describe()} backend is not open")
            opening = self._tasks.spawn(self._open(timeout), "aiodlock-zk-open-session")
            self._opening[timeout] = opening
        await asyncio.wait((opening,))  # a cancelled caller leaves it opening for the next
        backend = self._shorter.get(timeout)
        if backend is None:
            if not opening.cancelled() and opening.exception() is not None:
                raise BackendError(f"could not open a {timeout:g} s session on {self.describe()}")
            raise BackendError(f"{self.describe()} backend is closing")
        return backend

    async def _open(self, timeout: float) -> None:
        """Open the session of ``timeout`` seconds (see the module docstring)."""
        assert self._tasks is not None
        settings = dataclasses.replace(self._settings, session_ttl=timeout)
        backend = SessionBackend(settings, owns_tasks=False)
        try:
            await backend.open(self._tasks)
            # Turns that began before it existed (the first attempt of a turn opens it): its
            # cancelled turns may keep their nodes for the next task, as the main session's do.
            for spec in self._turning:
                backend.turns_began(spec)
            self._shorter[timeout] = backend
            granted = backend.statistics()["session_timeout"]
            if granted > timeout:  # the server's minSessionTimeout (2 ticks by default)
                logger.warning(
                    "%s granted a %g s session for locks asking %g s: a crashed holder of "
                    "theirs is replaced after %g s",
                    self.describe(), granted, timeout, granted,
                )  # fmt: skip
        finally:
            del self._opening[timeout]

    def _of(self, spec: LockSpec, owner: str) -> SessionBackend:
        """The session ``owner`` queued or holds in (the main one if none)."""
        for backend in self._shorter.values():
            if backend.knows(spec, owner):
                return backend
        return self._main

    # ------------------------------------------------------------------ description

    def check(self, spec: LockSpec) -> None:
        """Every kind is supported (the FIFO queue makes ``fair=True`` a no-op)."""

    @property
    def request_timeout(self) -> float:
        """Seconds one request may take (the ``request_timeout`` option)."""
        return self._settings.request_timeout

    def describe(self) -> str:
        """The URL without credentials."""
        return self._settings.url.redacted()

    def statistics(self) -> Mapping[str, Any]:
        """The main session's state and counters (see :meth:`SessionBackend.statistics`),
        the counters summed over every session; ``short_sessions``: the session id of each
        shorter session, by its timeout."""
        stats = dict(self._main.statistics())
        requests: Counter[str] = Counter(stats["requests"])
        for backend in self._shorter.values():
            more = backend.statistics()
            for key in _SUMMED:
                stats[key] += more[key]
            requests.update(more["requests"])
        stats["requests"] = dict(requests)
        stats["short_sessions"] = {
            timeout: backend.statistics()["session_id"]
            for timeout, backend in sorted(self._shorter.items())
        }
        return stats

    # ------------------------------------------------------------------ operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern``."""
        return await self._main.inspect(namespace, pattern)

    async def namespaces(self) -> list[str]:
        """The namespaces with a directory under the root, sorted."""
        return await self._main.namespaces()

    async def break_lock(self, spec: LockSpec) -> int:
        """Delete the holders' nodes of ``spec``'s family."""
        return await self._main.break_lock(spec)

    # ------------------------------------------------------------------ turns

    def turns_began(self, spec: LockSpec) -> None:
        """The core's TurnObserver (see :meth:`.Handover.turns_began`)."""
        self._turning[spec] = None
        for backend in self._sessions():
            backend.turns_began(spec)

    def turns_ended(self, spec: LockSpec) -> None:
        """The core's TurnObserver (see :meth:`.Handover.turns_ended`)."""
        self._turning.pop(spec, None)
        for backend in self._sessions():
            backend.turns_ended(spec)

    # ------------------------------------------------------------------ protocol

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """Queue on the session ``ttl`` asks for (see the module docstring)."""
        timeout = session_timeout_for(ttl, self._settings.session_ttl)
        backend = self._main if timeout is None else self._shorter.get(timeout)
        if backend is not None:
            return await backend.try_acquire(spec, owner, ttl)
        # The first attempt of its ttl opens the session: bounded as a whole (the connect
        # and the attempt) by request_timeout, as every try_acquire is.
        budget = asyncio.timeout(self._settings.request_timeout)
        try:
            async with budget:
                backend = await self._session_for(ttl)
                return await backend.try_acquire(spec, owner, ttl)
        except TimeoutError as exc:
            if not budget.expired():
                raise
            raise BackendError(
                f"try_acquire of {spec.describe()} got no answer from {self.describe()} "
                f"within request_timeout ({self._settings.request_timeout:g} s)"
            ) from exc

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Delete ``owner``'s node; True if it was held."""
        return await self._of(spec, owner).release(spec, owner)

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Confirm ``owner``'s node exists in its live session."""
        return await self._of(spec, owner).renew(spec, owner, ttl)

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        """The wakeup of ``owner``'s queued node (see :meth:`SessionBackend.waiter`)."""
        async with self._of(spec, owner).waiter(spec, owner) as waiter:
            yield waiter

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """Set the moment ``owner``'s held lease is known lost."""
        return self._of(spec, owner).loss_signal(spec, owner)

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """Until when ``owner``'s session surely lives on the server."""
        return self._of(spec, owner).session_deadline(spec, owner)
