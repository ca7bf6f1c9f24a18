"""What the ZooKeeper backend remembers of one acquisition: its entry, wakeup and sweep.

An :class:`Entry` is one owner's contender in one lock family (its node, lease and queue
state); a :class:`ZKWaiter` the banked wakeup of a waiting acquisition, armed on at most one
watch; a :class:`Sweep` one listing that deletes the stray nodes of several entries.

Example::

    entry = Entry("/apps/shop/order%3A42/mutex", owner, spec)
    entry.prefix  # "_c_<uuid>-lock-": the name its node is created with
"""

from __future__ import annotations

import asyncio
import uuid

from .. import BackendError, BankedWakeup, Kind, LockSpec
from ..queue import Holding
from ._layout import TAG

__all__ = ["Entry", "Sweep", "ZKWaiter", "at_server", "turn_taking_mutex"]


class ZKWaiter(BankedWakeup):
    """A waiting acquisition's wakeup: banked, armed on at most one watch at a time."""

    __slots__ = ("arm_error", "armed", "arming", "confirmed", "deleted", "touched")

    def __init__(self) -> None:
        super().__init__()
        self.armed: str | None = None  # path of the watch we are registered on
        self.confirmed: str | None = None  # ...once the server said it exists, watch set
        self.deleted: str | None = None  # the node watch that fired for a deletion (or found none)
        self.touched: str | None = None  # the node watch that fired for a change of data
        self.arming: asyncio.Task[None] | None = None  # the request arming it (see Watches.arm)
        self.arm_error: BackendError | None = None  # how that request failed, for its caller

    async def wait(self, timeout: float | None) -> None:
        await self._consume(timeout)


class Entry(Holding):
    """One acquisition (owner) of one lock family: its contender node and queue state (its
    lease state is the engine's :class:`Holding`)."""

    __slots__ = (
        "abandoning",
        "behind_head",
        "create_error",
        "creating",
        "czxid",
        "directory",
        "guard",
        "kept",
        "kind",
        "limit",
        "list_on_create",
        "listing",
        "lock",
        "name",
        "owner",
        "prefix",
        "protect",
        "session_id",
        "stray_session",
        "tagged",
        "target",
        "target_children",
        "uncertain",
        "watching",
    )

    def __init__(self, directory: str, owner: str, spec: LockSpec) -> None:
        super().__init__()
        self.directory = directory
        self.owner = owner
        self.kind = spec.kind
        self.limit = spec.limit
        self.protect = f"_c_{uuid.uuid4().hex}-"
        limit = spec.limit if spec.kind is Kind.SEMAPHORE else ""
        self.prefix = f"{self.protect}{TAG[spec.kind]}{limit}-"
        self.tagged = owner  # the owner our node's data names (see Handover.retag)
        self.name: str | None = None  # our node's name, once known
        self.czxid = 0
        self.listing: list[str] | None = None  # the directory, read with our create
        # The tasks of one client take turns (one node per client at a time), so listing the
        # directory with each create saves a round trip per grant. Fair locks keep a node per
        # waiting task: under a storm of cancelled waiters that would be a listing per create.
        self.list_on_create = not spec.fair
        self.session_id: int | None = None  # the session that owns our node
        self.uncertain = False  # a create's outcome is unknown: adopt, do not create again
        self.creating: asyncio.Task[None] | None = None  # our create, until someone saw it end
        self.create_error: BaseException | None = None  # how it failed, for its caller
        self.stray_session: int | None = None  # session a node of ours may linger in
        self.lock = asyncio.Lock()
        self.target: str | None = None  # what a waiter of ours must watch
        self.target_children = False
        self.behind_head = False  # the target is the head: its deletion makes us the head
        self.watching = False  # a data watch on our own (held) node is registered
        self.guard: asyncio.TimerHandle | None = None  # arms that watch soon after the grant
        self.abandoning: asyncio.Task[None] | None = None
        # Kept for the next task's turn (see Handover.keep): the cancelled waiter's wakeup,
        # still armed on the node we wait for, with whatever it banked meanwhile.
        self.kept: ZKWaiter | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.directory, self.owner)

    @property
    def path(self) -> str:
        assert self.name is not None
        return f"{self.directory}/{self.name}"


class Sweep:
    """One listing of a directory that deletes the stray nodes of every entry that joined
    it (nodes with their uuid whose names are unknown: a create whose reply was lost)."""

    __slots__ = ("done", "prefixes", "wait")

    def __init__(self) -> None:
        self.prefixes: set[str] = set()
        self.wait = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


def turn_taking_mutex(entry: Entry) -> bool:
    """A mutex whose tasks take turns (not fair: a fair waiter keeps its own node)."""
    return entry.kind is Kind.MUTEX and entry.list_on_create


def at_server(entry: Entry) -> bool:
    """Whether ``entry`` may have a node: created, being created, or lost in a reply."""
    return (
        entry.name is not None
        or entry.creating is not None
        or entry.uncertain
        or entry.stray_session is not None
    )
