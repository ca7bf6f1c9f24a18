"""The acquisitions of one SQL client: who owns which session, and who holds which mutex.

An acquisition (one owner asking for one lock) keeps its session from its first attempt, through
its waits, to its release: what the session holds is what the acquisition holds. The table
also answers, without a round trip, an attempt at a mutex that another acquisition of this
client holds (:class:`~aiodlock.backends.LocalHolders`): the server would refuse it too.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from .. import Grant, Kind, LocalHolders, LockSpec
from ._connection import Connection

__all__ = ["Acquisition", "Acquisitions", "Ident", "family", "ident_of"]

C = TypeVar("C", bound=Connection)
H = TypeVar("H")

Ident = tuple[str, str, str, str]


class Shared(Protocol):
    """What the table asks of a shared session (:class:`~._shared.SharedSession`)."""

    def usable(self) -> bool: ...


def family(kind: Kind) -> str:
    """The lock family in server-side names: ``m`` mutex, ``s`` semaphore, ``rw`` readers and
    writers (both sides of one lock)."""
    if kind is Kind.MUTEX:
        return "m"
    if kind is Kind.SEMAPHORE:
        return "s"
    return "rw"


@dataclass(slots=True, eq=False)
class Acquisition(Generic[C, H]):
    """One acquisition (one owner): its connection, and what that session holds."""

    owner: str
    conn: C | None = None
    held: H | None = None
    """What the session holds (a semaphore's slot), or None."""
    granted: bool = False
    """Reported to the core as a Grant (with a fencing token)."""
    lost: bool = False
    """The lock is known gone (keep-alive refused, connection dropped)."""
    event: asyncio.Event | None = None
    claim: Grant | None = None
    """A grant made inside a wait, token included, for the next attempt to report."""
    ttl: float | None = None
    """The lease asked for by the acquisition's attempts (its waits fence with it)."""
    session: Shared | None = None
    """The shared session it holds its mutex on (:mod:`._shared`); None: a session of its
    own (``conn``), or none yet."""
    abandoned: bool = False
    """Released (or given up) while a statement of it on a shared session was under way."""
    start_slot: int = field(init=False)
    """Where a semaphore's waits start (then one slot on per wait): spreads waiters."""
    waits: int = 0

    def __post_init__(self) -> None:
        self.start_slot = zlib.crc32(self.owner.encode())


class Acquisitions(Generic[C, H]):
    """The acquisitions by ``(namespace, family, name, owner)``, and the local holders.

    Example::

        table: Acquisitions[Conn, str] = Acquisitions()
        acq = table.open(ident_of(spec, "me"), "me")
        table.hold(acq, "shop:m:order:42")            # granted: a mutex is held here
        table.held_here("shop:m:order:42")            # True while acq's session has it
    """

    __slots__ = ("_by_ident", "_holders")

    def __init__(self) -> None:
        self._by_ident: dict[Ident, Acquisition[C, H]] = {}
        self._holders: LocalHolders[H, Acquisition[C, H]] = LocalHolders()

    def get(self, ident: Ident) -> Acquisition[C, H] | None:
        return self._by_ident.get(ident)

    def open(self, ident: Ident, owner: str) -> Acquisition[C, H]:
        """A new acquisition for ``owner``, in the table."""
        acq: Acquisition[C, H] = Acquisition(owner)
        self._by_ident[ident] = acq
        return acq

    def pop(self, ident: Ident) -> Acquisition[C, H] | None:
        return self._by_ident.pop(ident, None)

    def drop(self, ident: Ident, acq: Acquisition[C, H]) -> None:
        """Remove ``acq`` if it is still the table's entry for ``ident``."""
        if self._by_ident.get(ident) is acq:
            del self._by_ident[ident]

    @property
    def holding(self) -> bool:
        """Whether any mutex is recorded as held here (else no attempt needs a look-up)."""
        return bool(self._holders)

    def held_count(self) -> int:
        """Acquisitions granted and not known lost."""
        return sum(1 for a in self._by_ident.values() if a.granted and not a.lost)

    def hold(self, acq: Acquisition[C, H], target: H) -> None:
        """``acq``'s session was just granted the mutex ``target``."""
        self._holders.hold(target, acq)

    def unhold(self, acq: Acquisition[C, H]) -> None:
        """``acq`` no longer holds what it held (released, lost, closed)."""
        if acq.held is not None:
            self._holders.unhold(acq.held, acq)

    def held_here(self, target: H) -> bool:
        """Whether a live acquisition of this client holds the mutex ``target`` (its session
        has it: the server would refuse another attempt too)."""

        def alive(holder: Acquisition[C, H]) -> bool:
            conn = holder.conn
            session = holder.session
            live = conn is not None and not conn.closed
            live = live and (session is None or session.usable())
            return live and not holder.lost and holder.held == target

        return self._holders.held(target, alive=alive)

    def clear(self) -> None:
        """The client is closing: its sessions hold nothing any more."""
        self._by_ident.clear()
        self._holders.clear()


def ident_of(spec: LockSpec, owner: str) -> Ident:
    """The table key of ``owner``'s acquisition of ``spec``."""
    return (spec.namespace, family(spec.kind), spec.name, owner)
