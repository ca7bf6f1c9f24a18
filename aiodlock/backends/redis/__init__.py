"""The Redis backends: :class:`RedisBackend` for ``redis://``, ``rediss://`` (TLS),
``unix:///path.sock?db=N``, ``redis+sentinel://`` and ``redis+cluster://``, and
:class:`RedlockBackend` for ``redlock://`` (N independent masters).

Each module owns one piece (the module map and the design are in docs/redis.md, "Design
notes", and docs/redlock.md).

Example::

    async with aiodlock.connect("rediss://:secret@cache.internal:6380/0?wakeup=blpop") as locks:
        async with locks.lock("order:42", ttl=10) as lease:
            print(lease.fencing_token)
"""

from __future__ import annotations

from ._backend import RedisBackend
from ._redlock import RedlockBackend

__all__ = ["RedisBackend", "RedlockBackend"]
