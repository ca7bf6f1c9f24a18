"""The fencing table's upkeep: rows unused for ``fence_ttl`` are swept now and then.

Every grant bumps its name's row in the fencing table (the dialect's statement, in the grant's
own round trip). So that the table does not grow with every name ever locked, each client
deletes rows idle for ``fence_ttl`` at most once per ``min(fence_ttl, 1 hour)``, in batches,
through the janitor, on a connection the pool can spare without waiting (else at a later
grant). A new row starts from the server's clock, so the next token of a swept name is still
above every token its old row handed out. The same sweep deletes the identity rows of
sessions that have ended (the dialect's sessions table), once per sweep.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, Generic, TypeVar

from ._connection import Connection
from ._dialect import Dialect
from ._janitor import Janitor
from ._pool import Pool

__all__ = ["SWEEP_BATCH", "Fencing"]

C = TypeVar("C", bound=Connection)

MAX_SWEEP_INTERVAL: Final = 3600.0
"""Seconds between two sweeps of one client (``fence_ttl`` if shorter)."""
SWEEP_BATCH: Final = 1000
"""Rows one sweep statement deletes at most."""
SWEEP_BATCHES: Final = 10  # per sweep: a huge backlog is worked off over several sweeps


class Fencing(Generic[C]):
    """When to sweep the fencing table, and the sweep (see the module docstring).

    Example::

        fencing = Fencing(pool, dialect, janitor, fence_ttl=7 * 86400)
        fencing.maybe_sweep()   # after a grant: sweeps if this client has not lately
    """

    __slots__ = ("_dialect", "_janitor", "_next_sweep", "_pool", "_sweeping", "fence_ttl")

    def __init__(
        self, pool: Pool[C], dialect: Dialect[C, Any], janitor: Janitor[C], *, fence_ttl: float
    ) -> None:
        self._pool = pool
        self._dialect = dialect
        self._janitor = janitor
        self.fence_ttl = fence_ttl
        self._next_sweep = 0.0  # loop time; the first grant sweeps
        self._sweeping = False

    def maybe_sweep(self) -> None:
        """Have the janitor delete idle fencing rows, at most once per sweep interval (with
        ``fence_ttl=0``, which keeps them, only the rows of ended sessions, where the dialect
        needs a sweep for those: see ``Dialect.sessions_outgrow``)."""
        if self._sweeping or (self.fence_ttl == 0 and not self._dialect.sessions_outgrow):
            return
        now = asyncio.get_running_loop().time()
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(self.fence_ttl or MAX_SWEEP_INTERVAL, MAX_SWEEP_INTERVAL)
        self._sweeping = True
        self._janitor.later(self._sweep)

    async def _sweep(self) -> None:
        """Delete the identity rows of ended sessions, then fencing rows idle for
        ``fence_ttl``, a batch at a time, until a batch comes back short."""
        try:
            conn = await self._pool.try_checkout()
            if conn is None:  # every connection is busy: the next grant tries again
                self._next_sweep = 0.0
                return
            try:
                await self._dialect.sweep_sessions(conn)
                for _ in range(SWEEP_BATCHES if self.fence_ttl else 0):
                    if await self._dialect.sweep_batch(conn) < SWEEP_BATCH:
                        break
            finally:
                self._pool.checkin(conn)
        finally:
            self._sweeping = False
