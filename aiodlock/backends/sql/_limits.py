"""A semaphore's recorded limit: the check every SQL dialect makes the same way.

Holders of one semaphore must agree on its limit (docs/mysql.md, "Semaphores"). The limit
is recorded in the name's fencing row; a grant checks it, and claims it under the row's lock
when it differs, so two clients cannot both replace it. The dialect supplies the statements
(:class:`~._dialect.Dialect`: ``recorded_limit``, ``record_limit``, ``slots_held_by_others``,
``begin``, ``finish``).

Example (what the engine does after a semaphore grant)::

    in_use = await claim_limit(dialect, spec, conn)  # None: ours; else the limit in use
"""

from __future__ import annotations

from typing import Any

from .. import LockSpec
from ._dialect import Dialect

__all__ = ["claim_limit", "limit_in_use"]


async def limit_in_use(dialect: Dialect[Any, Any], spec: LockSpec, conn: Any) -> int | None:
    """For a refused semaphore attempt: the recorded limit if it differs from ours and holders
    of it are still there, else None (a plain read: it only refuses)."""
    recorded = await dialect.recorded_limit(spec, conn)
    if recorded is None or recorded == spec.limit:
        return None
    if await dialect.slots_held_by_others(spec, conn, recorded):
        return recorded
    return None


async def claim_limit(dialect: Dialect[Any, Any], spec: LockSpec, conn: Any) -> int | None:
    """On the session that just took a slot: None if the recorded limit is ours (now), else
    the limit its holders use. One read when it is ours already (the usual case)."""
    if await dialect.recorded_limit(spec, conn) == spec.limit:
        return None
    await dialect.begin(conn)
    recorded = await dialect.recorded_limit(spec, conn, lock_row=True)
    in_use = spec.limit if recorded is None else recorded
    if in_use != spec.limit and await dialect.slots_held_by_others(spec, conn, in_use):
        await dialect.finish(conn, commit=False)
        return in_use
    await dialect.record_limit(spec, conn)
    await dialect.finish(conn, commit=True)
    return None
