"""What an operator sees and does: the locks in use under a namespace, the namespaces in
use, and breaking a lock.

Holders are decided by the queue engine's rules (:func:`~..queue.holders`) on one listing;
a holder's TTL left is its lease's, its identity is its lease's identity key (one range read
for every holder of the call). Breaking deletes the holders' keys: they learn it from their
key watches, and the next holder's create revision (its token) is larger anyway.

Example::

    [info] = await inspect(conn, "/aiodlock", "shop", "order:*")
"""

from __future__ import annotations

import fnmatch
from typing import Any, Final
from urllib.parse import unquote

from aetcd import rpc

from .. import HolderInfo, Kind, LockInfo
from ..queue import KIND_OF_FAMILY, holders
from ._conn import EtcdConnection, prefix_end
from ._keys import (
    ASCEND,
    CREATE,
    contenders,
    encode_segment,
    identity_key,
    lease_of_identity_key,
    namespace_of,
)

__all__ = ["break_holders", "inspect", "namespaces"]

_PAGE: Final = 1000
"""Keys (names only) read per request by :func:`namespaces`."""


async def inspect(conn: EtcdConnection, root: str, namespace: str, pattern: str) -> list[LockInfo]:
    """Every lock of ``namespace`` whose name matches ``pattern``, with keys now."""
    base = f"{root}/{encode_segment(namespace)}/".encode()
    reply = await conn.range(base, prefix=True, sort_order=ASCEND, sort_target=CREATE)
    directories: dict[bytes, list[Any]] = {}
    for kv in reply.kvs:
        directory = kv.key.rsplit(b"/", 1)[0]
        directories.setdefault(directory, []).append(kv)
    ttls: dict[int, float | None] = {}
    found: list[tuple[str, Kind, list[Any], int]] = []
    for directory, kvs in sorted(directories.items()):
        encoded_name, _, family = directory[len(base) :].decode().rpartition("/")
        name = unquote(encoded_name, errors="surrogatepass")
        if not fnmatch.fnmatchcase(name, pattern):
            continue
        by_key = {kv.key: kv for kv in kvs}
        granted = holders(contenders(kvs))
        held = [by_key[c.id] for c in granted]
        for kv in held:
            if kv.lease not in ttls:
                ttls[kv.lease] = await _ttl_left(conn, kv.lease)
        kind = KIND_OF_FAMILY.get(family, Kind.MUTEX)
        if any(c.kind is Kind.WRITE for c in granted):
            kind = Kind.WRITE
        found.append((name, kind, held, len(kvs) - len(held)))
    identities = await _identities(conn, root, {kv.lease for _, _, held, _ in found for kv in held})
    return [
        LockInfo(
            name,
            kind,
            tuple(_holder(kv, ttls[kv.lease], identities.get(kv.lease)) for kv in held),
            max((kv.create_revision for kv in held), default=None),
            waiters,
        )
        for name, kind, held, waiters in found
    ]


def _holder(kv: Any, expires_in: float | None, identity: str | None) -> HolderInfo:
    """The holder a key names: its owner after the lease id."""
    return HolderInfo(kv.key.rsplit(b"-", 1)[1].decode(), expires_in, identity)


async def _identities(conn: EtcdConnection, root: str, leases: set[int]) -> dict[int, str]:
    """The identity of the client of each of ``leases`` that has one: ONE range read over
    the identity keys from the smallest lease's to the largest's (their 16-digit hex names
    sort as the leases do). A lease with no identity key (a client of an aiodlock before
    identities, a key put by hand) is left out."""
    leases.discard(0)  # a key on no lease (put by hand): no session
    if not leases:
        return {}
    first, last = identity_key(root, min(leases)), identity_key(root, max(leases))
    reply = await conn.call("_kv", "Range", rpc.RangeRequest(key=first, range_end=last + b"\0"))
    found = {}
    for kv in reply.kvs:
        lease = lease_of_identity_key(root, kv.key)
        if lease in leases:
            found[lease] = kv.value.decode("utf-8", "replace")
    return found


async def namespaces(conn: EtcdConnection, root: str) -> list[str]:
    """The namespaces with keys under ``root``, sorted.

    Keys only, :data:`_PAGE` at a time, in key order: each page's last namespace is skipped
    to its end (``prefix_end(<root>/<namespace>/)``), so a namespace with a million keys costs
    a page, not a thousand, and a request names at least one namespace or ends the scan. A
    key lives only as long as its contender (docs/etcd.md, "Key layout"), so every namespace
    found has a lock held or waited for, or had one a moment ago. The session identity keys
    (``<root>/:identity/``) are skipped like any segment no namespace encodes to.
    """
    base = f"{root}/".encode()
    end = prefix_end(base)
    start = base
    found: set[str] = set()
    while True:
        request = rpc.RangeRequest(key=start, range_end=end, keys_only=True, limit=_PAGE)
        reply = await conn.call("_kv", "Range", request)
        for kv in reply.kvs:
            segment, slash, _ = kv.key[len(base) :].partition(b"/")
            namespace = namespace_of(segment) if slash else None
            if namespace is not None:
                found.add(namespace)
        if not reply.more or not reply.kvs:
            return sorted(found)
        # Past the last key's namespace (or, for a stray key with no "/" after it, the key).
        last = reply.kvs[-1].key[len(base) :]
        segment, slash, _ = last.partition(b"/")
        start = prefix_end(base + segment + b"/") if slash else base + last + b"\0"


async def _ttl_left(conn: EtcdConnection, lease: int) -> float | None:
    reply = await conn.time_to_live(lease)
    return float(reply.TTL) if reply.TTL >= 0 else None


async def break_holders(conn: EtcdConnection, directory: bytes) -> int:
    """Delete the key of every holder in ``directory``; how many there were."""
    reply = await conn.range(directory, prefix=True, sort_order=ASCEND, sort_target=CREATE)
    held = holders(contenders(reply.kvs))
    for contender in held:
        await conn.delete(contender.id)
    return len(held)
