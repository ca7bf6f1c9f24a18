"""The contract between the core and a coordination service — every rule, written down.

A backend does one atomic step per call and knows nothing about waiting loops, watchdogs,
reentrancy or cancellation bookkeeping: those are written once in the core (the wait loop in
``aiodlock._acquire``, the keep-alive in ``aiodlock._watchdog``, compensation in
``aiodlock._supervisor``). A new backend implements :class:`Backend`, declares its
:class:`Capability` set, and registers its URL scheme under the entry-point group
``aiodlock.backends``; nothing in aiodlock needs editing. Its test module runs the shipped
conformance suite (``from aiodlock.testing.conformance import *`` plus an ``aiodlock_url``
fixture).

The contract, per method:

``try_acquire(spec, owner, ttl)``
    One atomic attempt, never waits. Returns :class:`Grant` (with a fencing token strictly
    greater than every token handed out before for this lock) or :class:`Busy` (with how long,
    at most, until it is worth asking again — the blocking holder's remaining lease, or the
    heartbeat interval a fair-queue waiter must keep). ``owner`` is a fresh random lowercase
    hex string per acquisition (safe in keys, paths and messages). A backend whose ``Busy``
    leaves ``owner`` queued (a ZooKeeper node, a fair-queue entry) says so with
    ``queues_on_busy`` (or, for fair locks only, through ``spec.fair``); the core then always
    follows a ``Busy`` with ``waiter()`` or with ``release()``.

``release(spec, owner)``
    Release-if-owner. Idempotent: ``True`` if ``owner`` held it and no longer does, ``False``
    if it did not hold it (already released, expired, or never granted). Must also remove a
    queue entry of ``owner``, so it doubles as the compensation for an acquire whose outcome
    is unknown (cancelled in flight, connection dropped before the reply) and as "leave the
    queue" for a caller that will not wait.

``renew(spec, owner, ttl)``
    Confirm ownership and extend the lease to ``ttl`` from now. ``False`` if ``owner`` no longer
    holds it. Never resurrects an expired lease. Session backends may confirm without extending.

``loss_signal(spec, owner)``
    For a lease held by ``owner``: an :class:`asyncio.Event` the backend sets the moment it
    knows the lease is gone (session expired, connection dropped), so the watchdog reacts at
    once instead of at the next ``renew``; ``None`` if only ``renew`` can tell (TTL backends).
    Make it a :class:`LossSignal` (an Event that also calls back): the core then watches the
    lease with a callback until its first renewal is due, not with a task per grant.

``session_deadline(spec, owner)``
    For a lease held by ``owner`` on a backend that declares ``SESSION_LEASE``: the event-loop
    time until which the session holding it is surely alive on the server — the *send* time of
    the newest request the server answered, plus how long the server waits before ending a
    silent session, minus a margin — or ``None`` if there is no such bound. The core keeps
    ``lease.valid_until`` (and so ``assert_held()`` and the watchdog's deadline) no later than
    this, so a process paused past its session never believes it still holds the lock. Called
    often: no I/O. TTL backends return ``None`` (their renewals already bound the lease),
    unless their own validity rule is stricter than the core's 1 % + 2 ms drift margin: the
    Redlock backend returns the start of the last confirmed acquire or renew + ttl - its
    ``drift_factor`` margin.

``waiter(spec, owner)``
    An async context manager. Entering it arms the wakeup (subscribes) and returns only once the
    wakeup is live, so a check made after entering cannot miss a release. ``Waiter.wait(t)``
    returns when woken or after ``t`` seconds. Wakeups are level-triggered: one that arrives
    between two ``wait`` calls is kept and makes the next ``wait`` return at once. Spurious
    wakeups are allowed (the caller always re-checks). Leaving it unsubscribes; it must leave
    nothing behind even when cancelled.

    *When it is entered.* After a ``Busy`` the core enters ``waiter(spec, owner)`` for the same
    ``owner`` **in the same event-loop step** (no ``await`` in between), and after leaving it
    either holds a grant or calls ``release(spec, owner)``. A queueing backend may rely on
    this: e.g. ZooKeeper keeps the queue node created by ``try_acquire`` only if ``waiter()``
    claims it before the loop runs anything else, and deletes it otherwise.

Every call is bounded in time by the backend itself (connect, request or socket timeouts):
the core adds no timer of its own on the hot path. Driver exceptions are translated to
:class:`~aiodlock.BackendError` inside the backend; a programming error (a closed backend, an
argument it cannot serve) is ``RuntimeError``/``TypeError``/``ValueError``.

Optional operations are declared by capability and checked with ``isinstance`` against the
runtime-checkable protocols below: :class:`Inspector` (``Capability.INSPECT``: who holds what,
for an operator) and :class:`Breaker` (``Capability.BREAK``: force-release). The operator CLI
and leader election use them; the lock kinds never do. :class:`Noticeboard` (a short note
pinned to a held mutex, such as a leader's identity) is found by ``isinstance`` alone, as are
:class:`Settler` (background clean-ups a test or shutdown can wait for) and
:class:`TurnObserver` (told when a client's tasks begin and end taking turns for a lock, so a
queue entry can pass from a cancelled task to the next).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._tasks import Tasks

__all__ = [
    "Backend",
    "Breaker",
    "Busy",
    "Capability",
    "Grant",
    "HolderInfo",
    "Inspector",
    "Kind",
    "LockInfo",
    "LockSpec",
    "LossSignal",
    "NamespaceLister",
    "Noticeboard",
    "Settler",
    "TurnObserver",
    "Waiter",
]


class LossSignal(asyncio.Event):
    """The event :meth:`Backend.loss_signal` returns: set once, the moment the lease is lost.

    Besides being awaited, it calls back: until a lease's first renewal is due (most holds
    end before), the core watches it with :meth:`add_callback` rather than a task per grant.
    A callback runs inside :meth:`set`, once; added to a signal already set, it runs at once.

    Example::

        signal = LossSignal()
        signal.add_callback(lambda: print("lost"))
        signal.set()  # prints "lost"; signal.is_set() is True, as for any Event
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when the signal is set (now, if it is set already)."""
        if self.is_set():
            callback()
        else:
            self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], None]) -> None:
        """Forget ``callback`` (nothing happens if it is not registered)."""
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def set(self) -> None:
        """Set the signal: wake its waiters, then run its callbacks (first call only)."""
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class Capability(enum.Enum):
    """What a backend can do; a lock kind that needs a missing one fails at construction."""

    EXCLUSIVE = "exclusive"
    """Mutual exclusion: ``locks.lock()``."""
    SHARED = "shared"
    """Reader/writer modes: ``locks.read_lock()`` and ``locks.write_lock()``."""
    COUNTING = "counting"
    """Up to N holders: ``locks.semaphore(limit=N)``."""
    FAIR = "fair"
    """FIFO handoff: ``locks.lock(name, fair=True)``."""
    FENCING = "fencing"
    """Every grant carries a strictly increasing fencing token."""
    TTL_LEASE = "ttl_lease"
    """A lease expires unless renewed (Redis, memory)."""
    SESSION_LEASE = "session_lease"
    """A lease lives as long as a session or connection (ZooKeeper, MySQL)."""
    SERVER_WAKEUP = "server_wakeup"
    """Waiters are woken by the service; nothing sleep-polls."""
    INSPECT = "inspect"
    """Optional: the backend is an :class:`Inspector` (lists holders, for operators)."""
    BREAK = "break"
    """Optional: the backend is a :class:`Breaker` (force-release, bumping the fencing token)."""

    # Members are singletons compared by identity: hash them by identity too, in C, rather
    # than by name through Enum's Python-level __hash__ (sets of capabilities, per lock).
    __hash__ = object.__hash__


class Kind(enum.Enum):
    """The lock kinds, each written once over the backend protocol."""

    MUTEX = "mutex"
    READ = "read"
    WRITE = "write"
    SEMAPHORE = "semaphore"

    # Identity hashing (see Capability): a kind is part of every per-lock key, on the hot path.
    __hash__ = object.__hash__

    @property
    def required(self) -> frozenset[Capability]:
        """Capabilities a backend must declare to serve this kind."""
        return _REQUIRED[self]


_REQUIRED: dict[Kind, frozenset[Capability]] = {
    Kind.MUTEX: frozenset({Capability.EXCLUSIVE}),
    Kind.READ: frozenset({Capability.SHARED}),
    Kind.WRITE: frozenset({Capability.SHARED}),
    Kind.SEMAPHORE: frozenset({Capability.COUNTING}),
}


_NOUNS: dict[Kind, str] = {
    Kind.MUTEX: "lock",
    Kind.READ: "read lock",
    Kind.WRITE: "write lock",
    Kind.SEMAPHORE: "semaphore",
}


@dataclass(frozen=True, slots=True)
class LockSpec:
    """Which lock a call is about: the backend derives its keys from ``namespace`` and ``name``.

    Names are opaque: a backend must map every distinct ``(namespace, name)`` to distinct
    storage, whatever characters the name contains.
    """

    namespace: str
    name: str
    kind: Kind
    limit: int = 1
    fair: bool = False

    def describe(self) -> str:
        """``"lock 'x'"``, ``"read lock 'x'"``, ``"semaphore 'x'"``: for messages."""
        return f"{_NOUNS[self.kind]} {self.name!r}"


@dataclass(frozen=True, slots=True)
class Grant:
    """A successful attempt: the lock is ours, with this fencing token.

    ``sent``: for a grant made on the owner's behalf before its attempt (a release of this
    client handed the lock over to it), the loop time that request was sent; the lease is
    timed from it rather than from the attempt. ``None``: timed from the attempt.
    """

    fencing_token: int
    sent: float | None = None


@dataclass(frozen=True, slots=True)
class Busy:
    """A refused attempt.

    ``retry_after`` caps the next wait in seconds: the blocking holder's remaining lease (so an
    expired, crashed holder is replaced within milliseconds of its expiry), or a fair-queue
    heartbeat. ``None`` when the backend's wakeup alone is enough.
    """

    retry_after: float | None


@dataclass(frozen=True, slots=True)
class HolderInfo:
    """One holder of a lock, as the service sees it.

    ``expires_in`` is the lease's remaining seconds, ``None`` for a session lease (ZooKeeper,
    MySQL) that lives as long as its holder's connection. ``identity`` is the holding
    client's ``identity`` option (``host:pid`` by default) as the backend stored it with the
    lock, ``None`` where it was not stored (a holder from an older aiodlock).
    """

    owner: str
    expires_in: float | None
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class LockInfo:
    """What :meth:`Inspector.inspect` reports for one lock in use.

    ``fencing_token`` is the newest token handed out for the name (``None`` if the backend
    cannot tell); ``waiters`` the number of queued or blocked waiters where the backend can
    tell, else ``None``.
    """

    name: str
    kind: Kind
    holders: tuple[HolderInfo, ...]
    fencing_token: int | None
    waiters: int | None


class Waiter(Protocol):
    """A live wakeup subscription for one waiting acquisition."""

    async def wait(self, timeout: float | None) -> None:
        """Return when woken (or a wakeup was banked), or after ``timeout`` seconds."""
        ...


class Backend(Protocol):
    """A coordination service, selected by URL scheme.

    Implementations set ``capabilities`` and ``options`` (the extra keyword options the
    backend accepts, each with a converter used for URL query strings), take the parsed URL
    and the options in ``__init__``, and are opened and closed by the owning client.
    """

    capabilities: ClassVar[frozenset[Capability]]
    options: ClassVar[Mapping[str, type]]
    queues_on_busy: ClassVar[bool]
    """True if every ``Busy`` answer leaves ``owner`` queued, so a caller that will not wait
    must ``release`` to leave the queue; each waiting task then keeps its own place at the
    service. False: the core lets the waiting tasks of one client take turns, and only the
    task whose turn it is asks the service. Fair locks (``spec.fair``) are always treated as
    queueing. A backend that queues on ``Busy`` but removes an entry that no ``waiter()``
    claims in the same loop step itself (ZooKeeper) may declare False."""

    async def open(self, tasks: Tasks) -> None:
        """Connect. Raises :class:`~aiodlock.BackendError` if the service is unreachable.

        ``tasks`` is the backend's share of the client's task group: every background task
        of the backend (read loops, watches, janitors) is started with ``tasks.spawn`` and
        ended by ``await tasks.aclose()`` in :meth:`aclose`; a backend makes no task group
        and no bare task of its own."""
        ...

    async def aclose(self) -> None:
        """Disconnect and drop every subscription. Idempotent."""
        ...

    def check(self, spec: LockSpec) -> None:
        """Raise :class:`~aiodlock.UnsupportedError` if ``spec`` cannot be served."""
        ...

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """One atomic attempt (see the module docstring)."""
        ...

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Release-if-owner, idempotent (see the module docstring)."""
        ...

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Confirm and extend; never resurrects (see the module docstring)."""
        ...

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """An event set when ``owner``'s lease is known lost (see the module docstring)."""
        ...

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """Until when the session holding ``owner``'s lease is surely alive (module docstring)."""
        ...

    def waiter(self, spec: LockSpec, owner: str) -> AbstractAsyncContextManager[Waiter]:
        """Arm a wakeup for one waiting acquisition (see the module docstring)."""
        ...

    @property
    def request_timeout(self) -> float:
        """Seconds one request may take (the ``request_timeout`` option): the core bounds
        ``try_acquire()`` and a release by it, whatever the service does."""
        ...

    def describe(self) -> str:
        """A short, password-free description for ``repr()`` and log lines."""
        ...

    def statistics(self) -> Mapping[str, Any]:
        """Backend counters (connections, subscriptions...) for ``LockClient.statistics()``."""
        ...


@runtime_checkable
class Inspector(Protocol):
    """Optional (``Capability.INSPECT``): list the locks in use now, for operators."""

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every lock of ``namespace`` whose name matches the glob ``pattern`` and that has
        holders, or waiters where the backend can tell."""
        ...


@runtime_checkable
class NamespaceLister(Protocol):
    """Optional for an :class:`Inspector`: name the namespaces that have locks in use now,
    for ``inspect --all-namespaces``.

    Example::

        for namespace in await backend.namespaces():
            print(namespace, len(await backend.inspect(namespace)))
    """

    async def namespaces(self) -> list[str]:
        """The namespaces with a lock held or waited for now, sorted. A backend that keeps
        per-name records (fencing counters) may also name namespaces with nothing in use;
        callers show what :meth:`Inspector.inspect` finds in each."""
        ...


@runtime_checkable
class Settler(Protocol):
    """Optional: a backend whose clean-ups run in the background (giving back a wakeup,
    leaving a wait queue) lets :meth:`LockClient.settle` wait for them."""

    async def settle(self) -> None:
        """Return once the clean-ups running now (and any they start) are done."""
        ...


@runtime_checkable
class TurnObserver(Protocol):
    """Optional for a backend: told when the tasks of its client begin and end taking turns.

    Between the two calls for a lock, some task of the client is at its turn or waiting for
    it. A backend whose queue entry outlives a cancelled turn (a ZooKeeper node and its place
    in the queue) may keep it for the next task, and must give it up when the turns end:
    nobody of this client wants the lock any more.

    Example::

        class Backend:
            def turns_began(self, spec: LockSpec) -> None: ...
            def turns_ended(self, spec: LockSpec) -> None: ...  # drop any entry kept
    """

    def turns_began(self, spec: LockSpec) -> None:
        """The first task of this client wants ``spec``'s lock (no other one does now)."""
        ...

    def turns_ended(self, spec: LockSpec) -> None:
        """The last task of this client that wanted ``spec``'s lock has left its turn."""
        ...


@runtime_checkable
class Breaker(Protocol):
    """Optional (``Capability.BREAK``): force-release a lock, whoever holds it."""

    async def break_lock(self, spec: LockSpec) -> int:
        """Drop every holder of ``spec`` and bump its fencing token so that a broken holder's
        writes are refused; return how many holders were dropped."""
        ...


@runtime_checkable
class Noticeboard(Protocol):
    """Optional: a short note pinned to a held mutex, for anyone to read (a leader's identity).

    The note belongs to the holder that posted it: it can be read only while that holder
    still holds the lock, so a crashed or replaced holder's note is never shown as the new
    holder's. The memory and Redis backends provide it.
    """

    async def post_note(self, spec: LockSpec, owner: str, note: str, ttl: float) -> bool:
        """Pin ``note`` to the mutex ``spec`` if ``owner`` holds it (``False`` if not); it
        lasts at most ``ttl`` seconds unless posted again, and never past the holder's lease."""
        ...

    async def read_note(self, spec: LockSpec) -> str | None:
        """The note of the mutex's current holder; ``None`` if it is free or its holder
        posted none."""
        ...
