"""The ZooKeeper backend: ``zookeeper://host1:2181,host2:2181/chroot``.

A Curator-style lock recipe (one EPHEMERAL_SEQUENTIAL contender node per acquisition, in a
directory per lock family) on aiozk's low-level session, hardened. docs/zookeeper.md has the
node layout, the granting rules, fencing tokens, leases and sessions, the options and how
each part is built; each module of this package does one part of it.

Example::

    async with aiodlock.connect("zookeeper://zk1:2181,zk2:2181,zk3:2181/apps") as locks:
        async with locks.lock("order:42", ttl=10) as lease:
            print(lease.fencing_token)   # the lock node's czxid

With credentials (``zookeeper://alice:s3cret@zk1/apps``) every node the backend makes is
alice's alone (the world may read); ``acl=`` names others, e.g. an operator who may break
locks: ``acl="auth::cdrwa,world:anyone:r,digest:" + digest("ops", "pw") + ":rd"``.
"""

from ._auth import digest
from ._by_ttl import ZooKeeperBackend, session_timeout_for
from ._layout import (
    decode_segment,
    encode_segment,
    lock_directory,
    namespace_of,
    namespace_path,
    node_data,
    node_identity,
    node_owner,
)

__all__ = [
    "ZooKeeperBackend",
    "decode_segment",
    "digest",
    "encode_segment",
    "lock_directory",
    "namespace_of",
    "namespace_path",
    "node_data",
    "node_identity",
    "node_owner",
    "session_timeout_for",
]
