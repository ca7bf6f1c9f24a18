"""The Redis backend: ``redis://``, ``rediss://`` (TLS), ``unix:///path.sock?db=N``,
``redis+sentinel://`` (Sentinel) and ``redis+cluster://`` (Redis Cluster).

The entry point is :class:`RedisBackend` (``aiodlock.backends.redis:RedisBackend``). It is
built from separate pieces, each module owning one of them; imports run one way, top to
bottom::

    _redlock   RedlockBackend: redlock://, N independent masters, one NodeSource each
    _redlock_inspect  what its inspect() reads on one master
    _quorum_waiter    its waiter: one pub/sub waiter per master, armed on a majority
    _quorum    Round: one request fanned out to every master, replies collected
    _backend   RedisBackend: the backend protocol, composing the pieces below
    _sharded   sharded pub/sub wakeups on a cluster: one _pubsub hub per master
    _pubsub    pub/sub wakeups: one connection for every waiter (the default)
    _blpop     BLPOP wakeups: a signal list and a connection per waiting acquisition
    _wait      the rules both wakeup mechanisms follow, and their timed sleep
    _cluster   ClusterSource: Redis Cluster, routed by slot (a NodeSource otherwise)
    _sentinel  SentinelSource: the master behind Sentinel (a NodeSource otherwise)
    _node      NodeSource: one server (URL -> settings, pool, side connections)
    _source    ConnectionSource: how the other modules reach the server(s)
    _errors    redis-py exceptions -> BackendError, password-free
    _slots     which queued command gets the next connection (releases first)
    _scripts   the Lua scripts, one named constant per atomic step, and EVALSHA dispatch
    _keys      the key layout of one lock name (the ``{ns:name}`` hash tag)

Example::

    async with aiodlock.connect("rediss://:secret@cache.internal:6380/0?wakeup=blpop") as locks:
        async with locks.lock("order:42", ttl=10) as lease:
            print(lease.fencing_token)
"""

from __future__ import annotations

from ._backend import RedisBackend
from ._redlock import RedlockBackend

__all__ = ["RedisBackend", "RedlockBackend"]
