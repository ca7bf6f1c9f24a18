"""How a resource uses fencing tokens to refuse a stale holder."""

from __future__ import annotations

from typing import final

from ._exceptions import StaleTokenError

__all__ = ["FencingGuard"]


@final
class FencingGuard:
    """Remembers the newest fencing token seen by a resource and refuses older ones.

    A lease can end while its holder is paused (GC, a stopped process, a slow network): when
    the holder resumes, another holder with a larger token may already have written. Put a
    guard at the resource and pass every write through it, and the stale write is refused.
    Keep the guard where the resource is (the same database transaction, the same process);
    for data in Redis or SQL store the newest token next to the data and compare there.

    Example::

        guard = FencingGuard()
        async with locks.lock("stock") as lease:
            guard.check(lease.fencing_token)   # StaleTokenError if a newer holder wrote
            stock -= 1
    """

    __slots__ = ("_newest",)

    def __init__(self) -> None:
        self._newest = 0

    @property
    def newest(self) -> int:
        """The largest token admitted so far (0 before the first)."""
        return self._newest

    def check(self, token: int) -> None:
        """Admit ``token`` if it is not older than the newest seen, and remember it.

        Raises:
            StaleTokenError: ``token`` is smaller than a token already admitted.
        """
        if token < self._newest:
            raise StaleTokenError(f"fencing token {token} is older than {self._newest}")
        self._newest = token

    def __repr__(self) -> str:
        return f"<FencingGuard newest={self._newest}>"
