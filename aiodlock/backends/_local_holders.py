"""Which acquisition of this client holds a session-owned mutex (the SQL backends).

On MySQL and PostgreSQL a lock belongs to a database session. While one acquisition of a client
holds a mutex, the server would refuse every other acquisition of the same client too: the
client can answer them itself, with no round trip, and nothing answers those tasks during the
holder's critical section (under the default event loop, every wake-up rounds the rest of a
``sleep`` up to a whole millisecond).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LocalHolders"]

K = TypeVar("K", bound=Hashable)
A = TypeVar("A")


class LocalHolders(Generic[K, A]):
    """Per lock key, the acquisition of this client whose session holds it.

    A record is dropped when its acquisition releases or loses the lock; one that went stale
    unnoticed (``alive`` says no) is dropped when it is next looked at, so a stale record never
    refuses anyone, and nothing is kept per name once its holder is gone.

    Example::

        holders: LocalHolders[str, Acquisition] = LocalHolders()
        holders.hold("m:order:42", acquisition)
        holders.held("m:order:42", alive=lambda a: not a.lost)  # True: refuse, unsent
        holders.unhold("m:order:42", acquisition)
    """

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[K, A] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def hold(self, key: K, acquisition: A) -> None:
        """``acquisition``'s session has just been granted ``key``."""
        self._by_key[key] = acquisition

    def unhold(self, key: K, acquisition: A) -> None:
        """``acquisition`` no longer holds ``key`` (released, lost, closed)."""
        if self._by_key.get(key) is acquisition:
            del self._by_key[key]

    def held(self, key: K, *, alive: Callable[[A], bool]) -> bool:
        """Whether a live acquisition of this client holds ``key``."""
        holder = self._by_key.get(key)
        if holder is None:
            return False
        if not alive(holder):
            del self._by_key[key]
            return False
        return True

    def clear(self) -> None:
        """The client is closing: its sessions hold nothing any more."""
        self._by_key.clear()
