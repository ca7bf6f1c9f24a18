"""Advisory-lock keys and fencing-row keys for the postgres backend.

PostgreSQL's advisory locks are named by one 64-bit integer. A lock is identified by
``(namespace, family, name)`` plus, for a semaphore, a slot number, so each needs a key that
is the same in every process and distinct for every distinct lock. The key is the first 64
bits of SHA-256 over the NUL-separated parts (family ``m``: mutex, ``rw``: read/write, ``s``:
semaphore slot)::

    advisory_key("shop", "m", "order:42")      # a signed 64-bit int
    advisory_key("shop", "s", "api-quota", 3)  # slot 3 of a semaphore

**Collisions.** Two locks share a key only on a 64-bit hash collision: about one chance in
2**64 per pair of names, so under one in ten million even for a million names in use. Even
then exclusion holds — two names sharing a key only ever wait for each other, never run
together — and the backend *verifies* the names it grants: the fencing row of a name is keyed
by :func:`fence_key` and stores the namespace and the name; a grant whose row belongs to
another name is refused with a ``BackendError`` naming both, instead of sharing a counter.

The alternative, a registry table handing out a serial id per name, costs a table row per
name forever (or a delete protocol that must never hand out a second id for a live name) and
a round trip per new name per client; the hash costs neither.
"""

from __future__ import annotations

import functools
import hashlib

__all__ = ["advisory_key", "fence_key", "split_key"]


# Cached: the same few names are locked again and again, and SHA-256 plus the encoding is
# most of the client's own work on an uncontended grant.
@functools.lru_cache(maxsize=4096)
def _hash64(*parts: str) -> int:
    # Lock names are validated with surrogatepass (lone surrogates are allowed in str).
    data = b"\x00".join(p.encode("utf-8", "surrogatepass") for p in parts)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big", signed=True)


def advisory_key(namespace: str, family: str, name: str, slot: int | None = None) -> int:
    """The advisory-lock key of one lock (a semaphore: one of its slots)."""
    if slot is None:
        return _hash64(namespace, family, name)
    return _hash64(namespace, family, name, str(slot))


def fence_key(namespace: str, name: str) -> int:
    """Primary key of the fencing row of a name: 64 bits of SHA-256 of ``namespace NUL name``.

    The families of one name (mutex, read/write, semaphore) share the row, so their tokens
    never repeat.
    """
    return _hash64(namespace, name)


def split_key(key: int) -> tuple[int, int]:
    """``(classid, objid)``: how ``pg_locks`` shows a 64-bit advisory key (high, low 32 bits)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF
