"""The etcd key layout: a directory per lock family, a key per contender, and its value; a
key per session naming the client's identity.

``<root>/<namespace>/<name>/<family>/<lease id hex>-<owner>``, families ``mutex``, ``rw`` and
``semaphore``, values ``mutex``, ``read``, ``write`` or ``sema:<limit>``, byte for byte those
of every earlier release (docs/etcd.md, "Key layout"). A listing of a directory, sorted by
create revision, becomes the queue engine's contenders (:func:`contenders`), the create
revision being the place in the queue.

``<root>/:identity/<lease id, 16 hex digits>`` holds the identity (UTF-8) of the client whose
session that lease is, on that lease (:func:`identity_key`). The segment ``:identity`` is no
namespace's: :func:`encode_segment` keeps only ``A-Z a-z 0-9 - _`` and writes every other
byte as ``%XX``, so no encoded namespace (nor a prefix segment) has a ``:``.

Example::

    directory(root, spec) + b"1a2b-owner"  # a key; encode_segment("a/b") == "a%2Fb"
    identity_key(root, 0x1A2B)             # b"<root>/:identity/0000000000001a2b"
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Iterable
from typing import Any, Final

from aetcd import rpc

from .. import Kind, LockSpec
from ..queue import FAMILY_OF_KIND, Contender
from ._conn import prefix_end

__all__ = [
    "ASCEND",
    "CREATE",
    "IDENTITY_SEGMENT",
    "contenders",
    "directory",
    "encode_segment",
    "identity_key",
    "identity_prefix",
    "lease_of_identity_key",
    "namespace_of",
    "range_request",
    "value",
]

_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_KIND_OF_VALUE: Final = {b"mutex": Kind.MUTEX, b"read": Kind.READ, b"write": Kind.WRITE}
_NOT_IN_NAMESPACES: Final = frozenset(":{}\x00")  # aiodlock._validate.check_namespace

ASCEND: Final = 1  # RangeRequest.SortOrder.ASCEND
CREATE: Final = 2  # RangeRequest.SortTarget.CREATE

IDENTITY_SEGMENT: Final = ":identity"
"""The segment under the root that holds the session identity keys: it has a ``:``, which
:func:`encode_segment` never leaves in a segment, so no namespace is ever encoded to it."""


@functools.lru_cache(maxsize=4096)
def encode_segment(text: str) -> str:
    """One key segment for any string: percent-encoded UTF-8, injective, no ``/``."""
    raw = text.encode("utf-8", "surrogatepass")
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)


def directory(root: str, spec: LockSpec) -> bytes:
    """The directory of ``spec``'s lock family (with its trailing ``/``)."""
    return (
        f"{root}/{encode_segment(spec.namespace)}/{encode_segment(spec.name)}/{FAMILY_OF_KIND[spec.kind]}/"
    ).encode()


def value(spec: LockSpec) -> bytes:
    """What a contender's key holds: its kind, and a semaphore's limit (the values of every
    release: an older client reads ours, and we read its)."""
    if spec.kind is Kind.SEMAPHORE:
        return f"sema:{spec.limit}".encode()
    return str(spec.kind.value).encode()


def identity_prefix(root: str) -> bytes:
    """Where the session identity keys live: ``<root>/:identity/``."""
    return f"{root}/{IDENTITY_SEGMENT}/".encode()


def identity_key(root: str, lease: int) -> bytes:
    """The key naming the identity of the client whose session ``lease`` is. Sixteen hex
    digits (a lease id is a positive int64), so key order is lease order and the identities
    of a set of leases are one range (:func:`lease_of_identity_key`)."""
    return identity_prefix(root) + f"{lease:016x}".encode()


def lease_of_identity_key(root: str, key: bytes) -> int | None:
    """The lease an identity key is named after; ``None`` for any other key."""
    prefix = identity_prefix(root)
    if not key.startswith(prefix):
        return None
    try:
        return int(key[len(prefix) :], 16)
    except ValueError:
        return None


def contenders(kvs: Iterable[Any]) -> list[Contender[bytes]]:
    """The queue of a directory's listing (key-values in create-revision order)."""
    queue = []
    for kv in kvs:
        kind = _KIND_OF_VALUE.get(kv.value)
        if kind is not None:
            queue.append(Contender(kv.create_revision, kind, 0, kv.key))
        else:  # b"sema:<limit>"
            limit = int(kv.value.partition(b":")[2] or 0)
            queue.append(Contender(kv.create_revision, Kind.SEMAPHORE, limit, kv.key))
    return queue


def namespace_of(segment: bytes) -> str | None:
    """The namespace whose keys start with ``<root>/<segment>/``; ``None`` for a segment no
    namespace encodes to (a key under the prefix that is not ours, or
    :data:`IDENTITY_SEGMENT`: its ``:`` is never left in an encoded segment)."""
    try:
        namespace = urllib.parse.unquote(segment.decode("ascii"), errors="surrogatepass")
    except UnicodeDecodeError:
        return None
    if not namespace or encode_segment(namespace) != segment.decode("ascii"):
        return None
    return None if set(namespace) & _NOT_IN_NAMESPACES else namespace


def range_request(
    key: bytes, *, prefix: bool = False, count_only: bool = False, serializable: bool = False
) -> Any:
    """A read of ``key`` (or of every key under it, in create-revision order)."""
    return rpc.RangeRequest(
        key=key,
        range_end=prefix_end(key) if prefix else b"",
        sort_order=ASCEND if prefix else 0,
        sort_target=CREATE if prefix else 0,
        count_only=count_only,
        serializable=serializable,
    )
