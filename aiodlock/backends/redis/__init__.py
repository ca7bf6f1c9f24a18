"""The Redis backend: ``redis://``, ``rediss://`` (TLS) and ``unix:///path.sock?db=N``.

The entry point is :class:`RedisBackend` (``aiodlock.backends.redis:RedisBackend``). It is
built from separate pieces, each module owning one of them; imports run one way, top to
bottom::

    _backend   RedisBackend: the backend protocol, composing the pieces below
    _pubsub    pub/sub wakeups: one connection for every waiter (the default)
    _blpop     BLPOP wakeups: a signal list and a connection per waiting acquisition
    _wait      the rules both wakeup mechanisms follow, and their timed sleep
    _node      NodeSource: one server (URL -> settings, pool, side connections)
    _source    ConnectionSource: how the other modules reach the server(s)
    _errors    redis-py exceptions -> BackendError, password-free
    _slots     which queued command gets the next connection (releases first)
    _deadlines the per-command time limit (one sweeper task instead of a timer per call)
    _scripts   the Lua scripts, one named constant per atomic step, and EVALSHA dispatch
    _keys      the key layout of one lock name (the ``{ns:name}`` hash tag)

Example::

    async with aiodlock.connect("rediss://:secret@cache.internal:6380/0?wakeup=blpop") as locks:
        async with locks.lock("order:42", ttl=10) as lease:
            print(lease.fencing_token)
"""

from __future__ import annotations

from ._backend import RedisBackend

__all__ = ["RedisBackend"]
