"""Where a lock's contenders live in the tree, and what their names and data say.

Namespace and name are percent-encoded UTF-8 znode names; a contender is
``_c_<uuid>-<tag><limit>-<sequence>`` in its family's directory (docs/zookeeper.md, "Node
layout"). :func:`contenders` reads a listing as the queue engine's contenders. A contender's
data is words, ``aiodlock owner=<owner> identity=<percent-encoded identity>``
(:func:`node_data`), read back by :func:`node_owner` and :func:`node_identity`.

Example::

    lock_directory("/apps", "shop", "order:42", Kind.MUTEX)  # "/apps/shop/order%3A42/mutex"
"""

from __future__ import annotations

import functools
import operator
import re
import urllib.parse
from collections.abc import Iterable
from typing import Final

from .. import Kind
from ..queue import Contender

__all__ = [
    "CONTENDER",
    "KIND_OF_FAMILY",
    "TAG",
    "chroot",
    "contenders",
    "decode_segment",
    "encode_segment",
    "lock_directory",
    "namespace_of",
    "namespace_path",
    "node_data",
    "node_identity",
    "node_owner",
    "seq",
]

_FAMILY: Final = {
    Kind.MUTEX: "mutex",
    Kind.READ: "rw",
    Kind.WRITE: "rw",
    Kind.SEMAPHORE: "semaphore",
}
KIND_OF_FAMILY: Final = {"mutex": Kind.MUTEX, "rw": Kind.READ, "semaphore": Kind.SEMAPHORE}
TAG: Final = {Kind.MUTEX: "lock", Kind.READ: "read", Kind.WRITE: "writ", Kind.SEMAPHORE: "sema"}
_KIND_OF_TAG: Final = {tag: kind for kind, tag in TAG.items()}
# "-<tag><limit>-<sequence>": only semaphore nodes carry a limit (nodes made before limits
# were recorded have none, and are not compared).
CONTENDER: Final = re.compile(r"^_c_[0-9a-f]{32}-(lock|read|writ|sema)(\d*)-(\d{10})$")
_SEQUENCE: Final = operator.itemgetter(0)  # sequences are unique in a directory
_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
# Kept as they are in an identity, so zkCli shows "host:1234" or "pod/worker" readably; every
# other byte but ASCII letters, digits and "_.-~" becomes %XX (spaces and "%" included).
_IDENTITY_SAFE: Final = ":/@"
_NOT_IN_NAMESPACES: Final = frozenset(":{}\x00")  # aiodlock._validate.check_namespace


@functools.lru_cache(maxsize=4096)
def encode_segment(text: str) -> str:
    """One znode name for any string: percent-encoded UTF-8, injective, never ``.``/``..``."""
    raw = text.encode("utf-8", "surrogatepass")
    encoded = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)
    if encoded == "zookeeper":  # reserved at the root; "%7A" never appears otherwise
        encoded = "%7Aookeeper"
    return encoded


def decode_segment(segment: str) -> str:
    """The string :func:`encode_segment` made ``segment`` from."""
    return urllib.parse.unquote(segment, encoding="utf-8", errors="surrogatepass")


def namespace_of(segment: str) -> str | None:
    """The namespace whose directory is the root's child ``segment``; ``None`` for a node no
    namespace makes (``zookeeper``, another application's node without a chroot)."""
    try:
        namespace = decode_segment(segment)
    except UnicodeDecodeError:  # "%FF": not UTF-8, so not a name we encoded
        return None
    if encode_segment(namespace) != segment or set(namespace) & _NOT_IN_NAMESPACES:
        return None
    return namespace


def namespace_path(root: str, namespace: str) -> str:
    """The directory of every lock of ``namespace`` (``root`` is the chroot, or ``""``)."""
    return f"{root}/{encode_segment(namespace)}"


def lock_directory(root: str, namespace: str, name: str, kind: Kind) -> str:
    """The directory holding the contenders of one lock family of ``name``."""
    return f"{namespace_path(root, namespace)}/{encode_segment(name)}/{_FAMILY[kind]}"


def chroot(path: str) -> str:
    """The URL's path as a chroot (``""`` for none); ValueError for one ZooKeeper refuses."""
    parts = [part for part in path.split("/") if part]
    for part in parts:
        if part in (".", "..") or "\x00" in part:
            raise ValueError(f"url has an invalid zookeeper chroot {path!r}")
    if parts and parts[0] == "zookeeper":
        raise ValueError("url chroot must not be under /zookeeper (reserved by ZooKeeper)")
    return "".join(f"/{part}" for part in parts)


def seq(name: str) -> int:
    """A contender's sequence number."""
    return int(name[-10:])


def contenders(names: Iterable[str]) -> list[Contender[str]]:
    """The contender nodes among ``names``, in queue order, for the queue engine."""
    return sorted(
        (
            Contender(int(m.group(3)), _KIND_OF_TAG[m.group(1)], int(m.group(2) or 0), name)
            for name in names
            if (m := CONTENDER.match(name))
        ),
        key=_SEQUENCE,
    )


def node_data(owner: str, identity: str) -> bytes:
    """A contender's data: its owner, and the identity of the client that made it, as words.
    The identity is percent-encoded, so no space or ``=`` in it can split or fake a word."""
    encoded = urllib.parse.quote(identity, safe=_IDENTITY_SAFE)
    return f"aiodlock owner={owner} identity={encoded}".encode()


def node_owner(data: bytes, session: int) -> str:
    """The owner written in a contender's data (``owner=...``), else its session id."""
    owner = _word(data, "owner=")
    return f"session {session:#x}" if owner is None else owner


def node_identity(data: bytes) -> str | None:
    """The identity written in a contender's data; ``None`` for a node without one (made by
    an aiodlock before identities: ``aiodlock owner=<owner> <host> pid=<pid>``)."""
    encoded = _word(data, "identity=")
    return None if encoded is None else urllib.parse.unquote(encoded, errors="replace")


def _word(data: bytes, key: str) -> str | None:
    """The value of the first ``key=value`` word of a node's data."""
    for word in data.decode("utf-8", "replace").split():
        if word.startswith(key):
            return word.removeprefix(key)
    return None
