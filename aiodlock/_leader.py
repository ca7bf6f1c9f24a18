"""Leader election: one process leads, the others wait their turn; anyone can ask who leads.

Built on the public API only: leadership *is* holding a mutex (lease, watchdog, fencing
token), and the leader pins its identity to it (the backend's
:class:`~aiodlock.backends.Noticeboard`) so that an observer can ask who leads. The three
shapes (one term, terms for ever, ``run``) and the note's refresh: docs/core.md.

Example::

    async with locks.election("scheduler") as term:  # LockLostError if leadership is lost
        await run_scheduler(term.fencing_token)
    await locks.election("scheduler").who_leads()    # "web-3:4711", or None
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol, TypeVar, TypeVarTuple, final

from ._exceptions import BackendError, LockLostError, UnsupportedError
from ._lease import Lease
from ._locks import Lock
from ._validate import USE_CLIENT_DEFAULT, UseClientDefault, check_async_callable, check_name
from .backends._protocol import Backend, Kind, LockSpec, Noticeboard
from .backends._tasks import Tasks

__all__ = ["Election", "Term", "default_identity"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

logger = logging.getLogger("aiodlock.leader")


def default_identity() -> str:
    """``hostname:pid``: who this process is, in a form an operator can find."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LockMaker(Protocol):
    """What an election needs from its client (a :class:`~aiodlock.LockClient`)."""

    @property
    def namespace(self) -> str: ...

    @property
    def ttl(self) -> float: ...

    @property
    def backend(self) -> Backend: ...

    def lock(
        self,
        name: str,
        *,
        ttl: float | UseClientDefault = ...,
        timeout: float | UseClientDefault | None = ...,
    ) -> Lock: ...


@final
class Term:
    """One term of leadership: ``async with term:`` campaigns, then leads until the block ends.

    Inside, ``term.lease`` is the mutex's :class:`~aiodlock.Lease` (``fencing_token`` tells
    this term from every earlier one: pass it to what the leader writes). When leadership is
    lost, the block is cancelled at its next ``await``; leaving it releases leadership. Taken
    from ``async for term in election`` the loss is absorbed (the loop campaigns again);
    entered through ``async with election`` it raises :class:`~aiodlock.LockLostError`.
    """

    __slots__ = ("_absorb_loss", "_election", "_lease", "_lock", "_publisher")

    def __init__(self, election: Election, *, absorb_loss: bool) -> None:
        self._election = election
        self._absorb_loss = absorb_loss
        self._lock = election.new_lock()
        self._lease: Lease | None = None
        self._publisher: asyncio.Task[None] | None = None

    @property
    def identity(self) -> str:
        """The identity this process campaigns under."""
        return self._election.identity

    @property
    def lease(self) -> Lease:
        """The lease of this term (inside ``async with term`` only)."""
        if self._lease is None:
            raise RuntimeError("not leading: enter the term with `async with term:` first")
        return self._lease

    @property
    def fencing_token(self) -> int:
        """Strictly greater than the token of every earlier term of this election."""
        return self.lease.fencing_token

    async def __aenter__(self) -> Term:
        lease = await self._lock.__aenter__()
        self._lease = lease
        election = self._election
        logger.info(
            "%s leads %r (fencing token %d)", election.identity, election.name, lease.fencing_token
        )
        board = election.board
        if board is not None:
            # Pinned before the term starts, so an observer asked from the leader's code
            # names it; refreshed by a sibling task, whose failures are only logged (the
            # lease's watchdog, not the note, decides whether we still lead).
            try:
                await election.post(board, lease)
                self._publisher = election.start_publishing(board, lease)
            except BaseException:
                await self._lock.__aexit__(None, None, None)
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
        try:
            await self._lock.__aexit__(exc_type, exc, tb)
        except LockLostError as lost:
            logger.warning("%s lost leadership of %r: %s", self.identity, self._election.name, lost)
            if self._absorb_loss:
                return True
            raise
        return False

    def __repr__(self) -> str:
        state = "leading" if self._lease is not None and self._lease.held else "not leading"
        return f"<Term {self._election.name!r} {self.identity!r} {state}>"


@final
class Election:
    """Campaign for the leadership named ``name`` (the three shapes: docs/core.md).

    Made by :meth:`LockClient.election <aiodlock.LockClient.election>`. A campaign waits
    as long as it takes (no timeout): each candidate is a waiter on the mutex, woken by the
    service when the leader resigns or its lease expires.
    """

    __slots__ = ("_client", "_tasks", "_terms", "identity", "name", "ttl")

    def __init__(
        self,
        client: LockMaker,
        name: str,
        *,
        tasks: Tasks,
        identity: str | None = None,
        ttl: float | UseClientDefault = USE_CLIENT_DEFAULT,
    ) -> None:
        self._client = client
        self._tasks = tasks  # the election's share of the client's task group: its publishers
        self.name = check_name(name)
        self.identity = (
            default_identity() if identity is None else check_name(identity, argument="identity")
        )
        self.ttl = client.ttl if isinstance(ttl, UseClientDefault) else ttl
        # The terms entered with `async with election`, per task: one Election object may be
        # entered by several tasks at once.
        self._terms: dict[asyncio.Task[Any], list[Term]] = {}
        client.lock(name, ttl=self.ttl)  # a bad ttl fails here, not at the first campaign

    def new_lock(self) -> Lock:
        """A fresh mutex object for one term."""
        return self._client.lock(self.name, ttl=self.ttl, timeout=None)

    @property
    def board(self) -> Noticeboard | None:
        """Where the leader pins its identity, if the backend has a noticeboard."""
        backend = self._client.backend
        return backend if isinstance(backend, Noticeboard) else None

    def _spec(self) -> LockSpec:
        return LockSpec(self._client.namespace, self.name, Kind.MUTEX)

    async def post(self, board: Noticeboard, lease: Lease) -> bool:
        """Pin our identity to the mutex once; False if the lease is gone (or the post
        failed: logged, the next refresh tries again)."""
        try:
            return await board.post_note(self._spec(), lease.owner, self.identity, self.ttl)
        except BackendError as exc:
            logger.warning("could not publish the leader of %r: %s", self.name, exc)
            return True

    def start_publishing(self, board: Noticeboard, lease: Lease) -> asyncio.Task[None]:
        """Run :meth:`publish` in the client's task group (RuntimeError if it is closed); the
        term cancels and awaits the task when it ends, and the client's close ends it too."""
        return self._tasks.spawn(self.publish(board, lease), f"aiodlock-leader-{self.name}")

    async def publish(self, board: Noticeboard, lease: Lease) -> None:
        """Pin our identity again every ttl/3 while the lease lasts."""
        while lease.held:
            await asyncio.sleep(self.ttl / 3)  # a refresh period, not a wait for an event
            if not await self.post(board, lease):
                return  # the lease is gone; its watchdog reports the loss

    async def who_leads(self) -> str | None:
        """The identity of the current leader; ``None`` if nobody leads (or the new leader
        has not pinned its identity yet: one round trip after it won).

        Raises:
            UnsupportedError: the backend has no noticeboard (the memory and Redis backends
                have one).
            BackendError: the service failed.
        """
        board = self.board
        if board is None:
            raise UnsupportedError(
                f"{self._client.backend.describe()} cannot tell who leads (no noticeboard)"
            )
        return await board.read_note(self._spec())

    def term(self) -> Term:
        """One term, to enter with ``async with`` (a loss raises LockLostError)."""
        return Term(self, absorb_loss=False)

    async def __aenter__(self) -> Term:
        term = self.term()
        await term.__aenter__()
        self._terms.setdefault(_current_task(), []).append(term)
        return term

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task = _current_task()
        stack = self._terms[task]
        term = stack.pop()
        if not stack:
            del self._terms[task]
        return await term.__aexit__(exc_type, exc, tb)

    async def __aiter__(self) -> AsyncIterator[Term]:
        """Terms for ever: each ``async with term`` campaigns again; a loss is absorbed."""
        while True:
            yield Term(self, absorb_loss=True)

    async def run(
        self,
        fn: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        retry_after: float = 1.0,
    ) -> T:
        """Lead, and run ``await fn(*args)`` while leading; return its result.

        When leadership is lost, ``fn`` is cancelled and the campaign starts again; when the
        service fails (:class:`~aiodlock.BackendError`), it is tried again after
        ``retry_after`` seconds. Returning from ``fn`` resigns.
        """
        check_async_callable(fn)
        async for term in self:
            try:
                async with term:
                    return await fn(*args)
            except BackendError as exc:
                logger.warning("election %r: %s; campaigning again", self.name, exc)
                await asyncio.sleep(retry_after)  # back off from a failing service
        raise AssertionError("unreachable: the terms never end")  # pragma: no cover

    def __repr__(self) -> str:
        return f"<Election {self.name!r} as {self.identity!r}>"


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("elections must be used from an asyncio task")
    return task
