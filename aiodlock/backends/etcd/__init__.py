"""The etcd backend: ``etcd://h1:2379,h2:2379,h3:2379/prefix``.

etcd's own lock recipe (``client/v3/concurrency`` Mutex) on the queue engine, for every lock
kind: one key per acquisition on the client's lease, granted in create-revision order, the
create revision as fencing token. Options: ``session_ttl``, ``connect_timeout``,
``request_timeout``, ``tls``/``tls_ca``/``tls_cert``/``tls_key`` (or ``ssl``/``ssl_ca``/...).
The design, what breaks and how the holder learns it: docs/etcd.md.

Example::

    async with aiodlock.connect("etcd://10.0.0.1:2379,10.0.0.2:2379/locks") as locks:
        async with locks.lock("order:42") as lease:
            print(lease.fencing_token)   # the lock key's create revision
"""

from ._backend import EtcdBackend as EtcdBackend
from ._keys import (
    IDENTITY_SEGMENT as IDENTITY_SEGMENT,
    contenders as contenders,
    encode_segment as encode_segment,
    identity_key as identity_key,
    identity_prefix as identity_prefix,
    lease_of_identity_key as lease_of_identity_key,
    namespace_of as namespace_of,
    value as value,
)

__all__ = [
    "IDENTITY_SEGMENT",
    "EtcdBackend",
    "contenders",
    "encode_segment",
    "identity_key",
    "identity_prefix",
    "lease_of_identity_key",
    "namespace_of",
    "value",
]
