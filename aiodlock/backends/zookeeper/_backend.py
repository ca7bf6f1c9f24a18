"""The locks of one ZooKeeper session: the protocol's doors onto the parts that do the work.

:class:`SessionBackend` composes the session transport, the queue step, node creation and
cleanup, watches, leases, the session guard and the handover of a cancelled turn (one module
each in this package); docs/zookeeper.md has the recipe and its guarantees. The backend
(:mod:`._by_ttl`) runs one per session timeout its locks' ttls ask for.

Example::

    settings = Settings.parse(parse_url("zookeeper://zk1:2181/apps"), {"connect_timeout": 2})
    backend = SessionBackend(settings)
    await backend.open(tasks)  # with the client's Tasks share
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Final

from .. import BackendError, Busy, Capability, Grant, LockInfo, LockSpec, Tasks, Waiter
from . import _operators
from ._cleanup import Cleanup
from ._context import ZKContext
from ._errors import AuthFailedError, NoNodeError, NotConnected
from ._guard import SessionGuard
from ._handover import Handover
from ._leases import Leases
from ._leaving import Leaving
from ._local import LocalMutex
from ._nodes import Nodes
from ._settings import Settings
from ._state import Entry, ZKWaiter
from ._step import QueueStep
from ._transport import ZKTransport
from ._watches import Watches

__all__ = ["SessionBackend"]

_MIN_SERVER_VERSION: Final = (3, 5, 3)


class SessionBackend:
    """The locks of one session (docs/zookeeper.md has the recipe and options).

    ``settings.session_ttl`` is the session timeout it asks for. ``owns_tasks``: its
    :meth:`aclose` closes the Tasks share it was opened with (the last session to close does).
    """

    # A refusal leaves a node in the queue, but this backend removes it itself whenever no
    # waiter claims it in the same step or the waiter is left by an error (see try_acquire
    # and waiter). So the core treats ZooKeeper as it does Redis: the tasks of one client
    # take turns for an exclusive lock, and only the one whose turn it is has a node — N
    # local waiters cost one node, and a storm of cancelled acquisitions stays in the process
    # (one node per task made 0-7 grants in 15 s under it). The node even outlives a
    # cancelled turn: the next task takes it over (turns_began/turns_ended, Handover.keep),
    # where deleting it and queueing anew at the back made 24-35 grants in 10 s under a
    # loaded storm. ``fair=True`` (``spec.fair``) gives every task its own node: strict
    # arrival order across every client's tasks.
    queues_on_busy: ClassVar[bool] = False
    # Everything but a ttl lease: a node lives as long as its session (and its renewals).
    capabilities: ClassVar[frozenset[Capability]] = frozenset(Capability) - {Capability.TTL_LEASE}

    def __init__(self, settings: Settings, *, owns_tasks: bool = True) -> None:
        self.owns_tasks = owns_tasks
        ctx = self._ctx = ZKContext(settings)
        # Each part gets the parts it calls (made before it): no part calls a later one.
        nodes = self._nodes = Nodes(ctx)
        cleanup = self._cleanup = Cleanup(ctx, nodes)
        local = self._local = LocalMutex(ctx)
        leases = self._leases = Leases(ctx, local, cleanup)
        watches = self._watches = Watches(ctx, leases)
        self._guard = SessionGuard(ctx, leases, watches, cleanup)
        leaving = self._leaving = Leaving(ctx, local, watches, cleanup)
        handover = self._handover = Handover(ctx, watches, leaving)
        self._step = QueueStep(ctx, (nodes, watches, local, leases, leaving, handover))
        self._waiting = 0

    # ------------------------------------------------------------------ lifetime

    async def open(self, tasks: Tasks) -> None:
        """Connect and start a session; BackendError if no server answers in time."""
        ctx = self._ctx
        if ctx.state != "new":
            raise RuntimeError(f"{self.describe()} backend was already opened")
        ctx.state = "opening"
        ctx.tasks = tasks
        settings = ctx.settings
        transport = ZKTransport(
            settings.hosts,
            session_timeout=settings.session_ttl,
            io_timeout=settings.connect_timeout,
            spawn=ctx.spawn_io,
            on_state=self._guard.on_state,
            on_event=self._watches.on_event,
            credentials=settings.credentials,
            acl=settings.acl,
            tls=settings.tls,
        )
        ctx.transport = transport
        try:
            await transport.start(settings.connect_timeout)
            version = transport.server_version
            if version is not None and version < _MIN_SERVER_VERSION:
                raise BackendError(
                    f"{self.describe()} runs ZooKeeper {'.'.join(map(str, version))}; "
                    "aiodlock needs 3.5.3 or later (container nodes)"
                )
            await _operators.check_identity(ctx, transport)
        except BaseException as exc:
            ctx.state = "closed"
            with contextlib.suppress(Exception):
                await transport.close()
            if self.owns_tasks:
                await tasks.aclose()
            if isinstance(exc, TimeoutError):
                failure = transport.connect_failure
                raise BackendError(
                    f"could not connect to {self.describe()} "
                    f"within {settings.connect_timeout:g} s (connect_timeout)"
                    + ("" if failure is None else f": {failure}")
                ) from exc
            if isinstance(exc, AuthFailedError):
                raise AuthFailedError(f"{self.describe()}: {exc}") from exc
            raise
        self._guard.new_session(transport.session_id)
        ctx.state = "open"
        ctx.spawn(self._guard.pinger(), "aiodlock-zk-pinger")
        ctx.spawn(self._guard.grace_watch(), "aiodlock-zk-grace")

    async def aclose(self) -> None:
        """Close the session (the server deletes all our nodes) and stop every task."""
        ctx = self._ctx
        if ctx.state in ("closing", "closed"):
            return
        if ctx.state == "new":
            ctx.state = "closed"
            return
        ctx.state = "closing"
        for entry in ctx.entries.values():
            if entry.reaper is not None:
                entry.reaper.cancel()
        for task in list(ctx.own):
            task.cancel()
        transport = ctx.transport
        try:
            if transport is not None:
                await transport.close()
        finally:
            if ctx.tasks is not None and self.owns_tasks:
                await ctx.tasks.aclose()
            for waiter in ctx.waiters.values():
                waiter.wake()
            self._watches.clear()
            ctx.doomed.clear()
            self._local.clear()
            self._handover.kept.clear()  # their nodes went with the session
            ctx.state = "closed"

    async def settle(self) -> None:
        """Wait for the queue nodes being left in the background: a node kept for a next
        turn that never came, an abandoned wait (:class:`~aiodlock.backends.Settler`). Each
        deletion is bounded by ``request_timeout`` and never waits for a lost connection (the
        janitor takes over); then the janitor's round over the nodes of lost leases."""
        leaves = self._leaving.leaves
        while leaves:
            await asyncio.wait(list(leaves))
        await self._cleanup.settle()

    # ------------------------------------------------------------------ description

    def check(self, spec: LockSpec) -> None:
        """Every kind is supported (the FIFO queue makes ``fair=True`` a no-op)."""

    @property
    def request_timeout(self) -> float:
        """Seconds one request may take (the ``request_timeout`` option)."""
        return self._ctx.request_timeout

    def describe(self) -> str:
        """The URL without credentials."""
        return self._ctx.describe()

    def statistics(self) -> Mapping[str, Any]:
        """Session, connection and recipe counters; ``requests``: those the server answered,
        by kind (``create``, ``children``, ``get``, ``delete``, ``ping``...). ``kept``: queue
        nodes a cancelled turn left for the next task (counted in ``entries`` too);
        ``handed``: how often a task took such a node over."""
        ctx = self._ctx
        transport = ctx.transport
        sid = transport.session_id if transport is not None else None
        kept = len(self._handover.kept)
        return {
            "state": transport.state if transport is not None else ctx.state,
            "server": transport.server if transport is not None else None,
            "session_id": None if sid is None else f"{sid:#x}",
            "session_timeout": transport.negotiated_timeout if transport is not None else None,
            "suspended_grace": ctx.grace,
            "entries": len(ctx.entries) + kept,
            "kept": kept,
            "handed": self._handover.handed,
            "held": sum(1 for e in ctx.entries.values() if e.held and e.lost is None),
            "waiters": self._waiting,
            "watches": len(self._watches),
            "doomed": len(ctx.doomed),
            "sessions": self._guard.sessions,
            "reconnects": self._guard.reconnects,
            "losses": self._leases.losses,
            "adopted": self._nodes.adopted,
            "requests": dict(transport.answered) if transport is not None else {},
        }

    # ------------------------------------------------------------------ operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern`` (see
        :func:`._operators.inspect`)."""
        return await _operators.inspect(self._ctx, self._nodes, namespace, pattern)

    async def namespaces(self) -> list[str]:
        """The namespaces with a directory under the root (see :func:`._operators.namespaces`)."""
        return await _operators.namespaces(self._ctx, self._nodes)

    async def break_lock(self, spec: LockSpec) -> int:
        """Delete the holders' nodes of ``spec``'s family (see :func:`._operators.break_lock`)."""
        return await _operators.break_lock(self._ctx, self._nodes, spec)

    # ------------------------------------------------------------------ turns

    def turns_began(self, spec: LockSpec) -> None:
        """The core's TurnObserver (see :meth:`.Handover.turns_began`)."""
        self._handover.turns_began(spec)

    def turns_ended(self, spec: LockSpec) -> None:
        """The core's TurnObserver (see :meth:`.Handover.turns_ended`)."""
        self._handover.turns_ended(spec)

    # ------------------------------------------------------------------ protocol

    def knows(self, spec: LockSpec, owner: str) -> bool:
        """Whether ``owner`` has an entry (queued, held, doomed) in this session."""
        key = (self._ctx.directory(spec), owner)
        ctx = self._ctx
        return key in ctx.entries or key in ctx.doomed or key in ctx.waiters

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """Queue (once per owner) and check our place: Grant(czxid) or Busy(None)."""
        transport = self._ctx.require_open()
        directory = self._ctx.directory(spec)
        key = (directory, owner)
        entry = self._ctx.entries.get(key)
        if entry is None:
            entry = self._handover.take_kept(directory, owner, spec) or Entry(
                directory, owner, spec
            )
            self._ctx.entries[key] = entry
        # One bound for the whole attempt, however many requests it takes (create, listing,
        # a wait for the connection between them): each is bounded by request_timeout too,
        # but in a row they made a stalled server's attempt last 26 s.
        budget = asyncio.timeout(self._ctx.request_timeout)
        try:
            async with budget, entry.lock:
                if entry.gone:  # left the queue meanwhile (not through the core): queue anew
                    return await self.try_acquire(spec, owner, ttl)
                try:
                    return await self._step.check(entry, spec, ttl, transport)
                except asyncio.CancelledError:
                    # Cancelled with our node on its way or queued: the next task of ours to
                    # take its turn gets it, place and all, instead of a new node at the back.
                    if not budget.expired():
                        self._handover.keep(entry)
                    raise
        except TimeoutError as exc:
            if not budget.expired():
                raise
            raise self._no_answer(f"try_acquire of {spec.describe()}") from exc

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Delete our node (and any stray one with our uuid); True if it was held."""
        if self._ctx.state != "open" or self._ctx.transport is None:
            return False
        key = (self._ctx.directory(spec), owner)
        entry = self._ctx.entries.get(key) or self._ctx.doomed.get(key)
        if entry is None:
            return False
        if entry.held and entry.lost is None and self._guard.silent_past_grace():
            # The core's session deadline and our grace watch fall due in the same instant:
            # when the core's runs first, the lease is lost all the same (and a request on
            # the silent connection would only wait out its timeout).
            self._leases.mark_lost(entry, self._guard.silence_reason())
        if entry.lost is not None:
            # Lost: nobody waits for us to confirm, and the connection that lost it may be
            # silent. The janitor deletes the node (or the session ends with it).
            if not entry.gone:
                self._leaving.retire(entry)
                self._ctx.doomed[key] = entry
                self._cleanup.kick_janitor()
            return False
        if entry.gone and self._ctx.doomed.get(key) is not entry:
            return False  # released already, or its node is being deleted
        # Held, queued, or left with its node still to delete (a release cancelled midway:
        # this is the compensating one, which finishes the job). Bounded as a whole: a node
        # not deleted in time is doomed (the janitor deletes it when the connection allows).
        budget = asyncio.timeout(self._ctx.request_timeout)
        try:
            async with budget:
                return await self._release(entry)
        except TimeoutError as exc:
            if not budget.expired():
                raise
            raise self._no_answer(f"release of {spec.describe()}") from exc

    async def _release(self, entry: Entry) -> bool:
        """Release's request (under the entry's lock): see :meth:`release`."""
        assert self._ctx.transport is not None
        async with entry.lock:
            held = entry.held and entry.lost is None and not entry.gone
            self._leaving.retire(entry)
            if held:
                await self._cleanup.remove_nodes(entry, self._ctx.transport)
                return True
            # Only queued: nobody waits for us to confirm. If the connection is down the
            # janitor deletes the node when it is back (or the session ends with it).
            with contextlib.suppress(NotConnected):
                await self._cleanup.remove_nodes(entry, self._ctx.transport, wait=False)
            return False

    def _no_answer(self, what: str) -> BackendError:
        """The error of a call cut off at ``request_timeout`` (the service stalled)."""
        return BackendError(
            f"{what} got no answer from {self.describe()} within "
            f"request_timeout ({self._ctx.request_timeout:g} s)"
        )

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Confirm our node exists in our live session; False once the lease is lost."""
        transport = self._ctx.require_open()
        entry = self._ctx.entries.get((self._ctx.directory(spec), owner))
        if entry is None or not entry.held or entry.gone or entry.lost is not None:
            return False
        if entry.session_id != transport.session_id:
            self._leases.mark_lost(entry, "the zookeeper session ended", doom=False)
            return False
        path = entry.path
        self._watches.watch_held(entry)
        try:
            _, stat = await transport.get(path, watch=True, wait=False, timeout=self._ctx.heartbeat)
        except NoNodeError:
            self._leases.mark_lost(entry, "its lock node was deleted", doom=False)
            return False
        if entry.lost_event.is_set():  # declared lost while we were asking
            return False
        if stat.ephemeral_owner != entry.session_id:
            self._leases.mark_lost(entry, "its lock node belongs to another session", doom=False)
            return False
        self._leases.schedule_reaper(entry, ttl)
        return True

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        """Arm the watch our last refused attempt chose; leaving by an error keeps our node
        for the next task's turn (see Handover.keep), or drops it."""
        transport = self._ctx.require_open()
        key = (self._ctx.directory(spec), owner)
        entry = self._ctx.entries.get(key)
        # A node taken over from a cancelled turn comes with its armed wakeup.
        waiter = (entry.kept if entry is not None else None) or ZKWaiter()
        if entry is not None:
            entry.kept = None
        self._ctx.waiters[key] = waiter  # before any await: see _drop_if_unwaited
        self._waiting += 1
        try:
            if entry is not None and not entry.held:
                await self._watches.arm(waiter, entry, transport)
            yield waiter
        except BaseException:
            # Timed out, cancelled or failed while queued: our node must not stay behind,
            # unless another task of ours takes its turn next and keeps it. A deletion takes
            # a round trip; on a connection gone silent it is left to the background (and the
            # janitor) after a heartbeat rather than holding the caller.
            entry = self._ctx.entries.get(key)
            if entry is not None and not self._handover.keep(entry):
                task = self._leaving.abandon(entry)
                if task is not None:
                    await asyncio.wait((task,), timeout=self._ctx.heartbeat)
            raise
        finally:
            self._handover.keep_waiter(waiter, key)
            if self._ctx.waiters.get(key) is waiter:
                del self._ctx.waiters[key]
            self._local.forget(key)
            self._waiting -= 1

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """An Event set the moment the held lease of ``owner`` is known to be lost.

        Session expired, grace timer run out, node deleted, or ttl passed without renewal.
        ``None`` if ``owner`` holds nothing here. The watchdog waits on it between renewals.
        """
        entry = self._ctx.entries.get((self._ctx.directory(spec), owner))
        if entry is None or not entry.held:
            return None
        return entry.lost_event

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """``contact + suspended_grace``: the server heard from our session no earlier than
        ``contact`` (the send time of the newest answered request), and the grace is shorter
        than the negotiated session timeout. With a ttl longer than the session (the defaults:
        30 s against 10 s), this is what keeps a paused holder from trusting its lease.
        ``None`` if ``owner`` holds nothing here."""
        entry = self._ctx.entries.get((self._ctx.directory(spec), owner))
        transport = self._ctx.transport
        if entry is None or not entry.held or transport is None:
            return None
        return transport.contact + self._ctx.grace
