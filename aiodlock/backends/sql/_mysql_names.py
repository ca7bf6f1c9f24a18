"""Server-side names for the MySQL/MariaDB backend: user-lock names and fencing-row keys.

A lock is identified by ``(namespace, family, name)`` plus, for a semaphore, a slot index.
The server-side name must be the same in every process, distinct for every distinct lock, and
acceptable to every server the backend runs on:

* MySQL 5.7+ refuses user-lock names longer than 64 characters (``ER_USER_LOCK_WRONG_NAME``);
  MariaDB accepts any length;
* MariaDB 10.11 compares names as exact strings (``'Abc'`` and ``'abc'`` are two locks, which
  contradicts its own manual), while MySQL's manual and other implementations of the function
  treat them as case-insensitive;
* lock names go into SQL text, so anything outside a small alphabet needs escaping.

So a name is used **verbatim** only when ``"{namespace}:{family}:{name}[#slot]"`` is at most 64
characters of ``[a-z0-9]`` and ``-_.:/@+=,#`` — lowercase ASCII that no server folds and no
quoting can mangle. Everything else is **hashed**: a readable, sanitised prefix of up to 23
characters, ``~``, and 40 base32 characters (200 bits) of SHA-256 over the exact,
NUL-separated components. A verbatim name never contains ``~``, so the two forms cannot meet;
two hashed names meet only on a 200-bit hash collision. The result is always 1 to 64 ASCII
characters that need no escaping::

    lock_name("shop", "m", "order:42")        == "shop:m:order:42"
    lock_name("shop", "s", "api-quota", 3)    == "shop:s:api-quota#3"
    lock_name("shop", "m", "Order:42")        == "shop:m:order:42~<40 base32 chars>"
"""

from __future__ import annotations

import base64
import functools
import hashlib
from typing import Final

__all__ = [
    "HASH_CHARS",
    "MAX_LOCK_NAME",
    "PREFIX_CHARS",
    "fence_key",
    "lock_name",
    "namespace_prefix",
]

MAX_LOCK_NAME: Final = 64
"""MySQL's limit on user-lock names (MariaDB has none; we keep to it everywhere)."""
HASH_CHARS: Final = 40
"""Base32 characters of SHA-256 kept in a hashed name: 200 bits."""
PREFIX_CHARS: Final = MAX_LOCK_NAME - 1 - HASH_CHARS
"""Readable characters before the ``~`` of a hashed name."""

_SAFE: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.:/@+=,#")


def _encode(text: str) -> bytes:
    # Lock names are validated with surrogatepass (lone surrogates are allowed in str).
    return text.encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=1024)  # the same few names, again and again (hashing costs)
def lock_name(namespace: str, family: str, name: str, slot: int | None = None) -> str:
    """The user-lock name for one lock (a semaphore: one of its slots)."""
    plain = f"{namespace}:{family}:{name}"
    if slot is not None:
        plain = f"{plain}#{slot}"
    if len(plain) <= MAX_LOCK_NAME and _SAFE.issuperset(plain):
        return plain
    parts = [_encode(namespace), _encode(family), _encode(name)]
    if slot is not None:
        parts.append(str(slot).encode())
    digest = hashlib.sha256(b"\x00".join(parts)).digest()
    tail = base64.b32encode(digest).decode("ascii").lower()[:HASH_CHARS]
    prefix = "".join(c if c in _SAFE else "_" for c in plain[: PREFIX_CHARS * 2].lower())
    return f"{prefix[:PREFIX_CHARS]}~{tail}"


def namespace_prefix(namespace: str) -> str:
    """What every lock name of ``namespace`` starts with, for listing them (operators, tests).

    Exact when the namespace is in the verbatim alphabet and at most 22 characters long;
    otherwise a best-effort prefix of the sanitised form.
    """
    prefix = "".join(c if c in _SAFE else "_" for c in f"{namespace}:".lower())
    return prefix[:PREFIX_CHARS]


def fence_key(namespace: str, name: str) -> bytes:
    """Primary key of the fencing row of a lock: SHA-256 of ``namespace NUL name``.

    The families of one name (mutex, semaphore) share the row, so their tokens never repeat.
    """
    return hashlib.sha256(_encode(namespace) + b"\x00" + _encode(name)).digest()
