"""The key layout of the Redis backend: which keys one lock name owns (:class:`Keys`).

Every key of a lock ``name`` in namespace ``ns`` starts with the hash tag ``{ns:name}``, so each
script touches one slot (Redis Cluster). The table of keys, their types and TTLs, and why the
fencing counter outlives its lock, are in docs/redis.md ("The key layout").

Example::

    keys = keys_for("shop", "order:42")
    keys.mutex  # b"{shop:order:42}"
"""

from __future__ import annotations

import functools
from typing import Final

from .. import Kind

__all__ = [
    "ANY_NAMESPACE_MATCH",
    "HELD_SUFFIXES",
    "Keys",
    "break_args",
    "broken_channel",
    "held_key",
    "keys_for",
    "namespace_in_use",
    "namespace_match",
    "split_key",
    "wake_next_keys",
]

HELD_SUFFIXES: Final = frozenset({b"", b":writer", b":readers", b":sem"})
"""Key suffixes of a name whose locks may be held."""

_WAITED_SUFFIXES: Final = frozenset(
    {b":queue", b":waiters", b":rw:waiters", b":sem:waiters", b":clients"}
)
"""Key suffixes of a name with waiters the server knows of (a fair queue, the registries)."""

ANY_NAMESPACE_MATCH: Final = "{*"
"""A SCAN ``MATCH`` pattern for the keys of every namespace (and, alas, any other key that
starts with ``{``: :func:`namespace_in_use` tells them apart)."""


class Keys:
    """The keys of one lock name, encoded once, grouped as each script takes them.

    A group is named after the script it feeds (``mutex_acquire`` for ``MUTEX_ACQUIRE``...);
    the ``_l`` groups are the BLPOP-mode variants, which also carry the waiter registry and
    its lists.
    """

    __slots__ = (
        "break_mutex",
        "break_rw",
        "break_sem",
        "clients",
        "fair_acquire",
        "fair_release",
        "inspect",
        "mutex",
        "mutex_acquire",
        "mutex_acquire_c",
        "mutex_acquire_l",
        "mutex_handoff",
        "mutex_release",
        "mutex_release_c",
        "mutex_waiters",
        "note",
        "read_acquire",
        "read_acquire_l",
        "read_release",
        "readers",
        "rsignal",
        "run",
        "rw_signal",
        "rw_waiters",
        "sem",
        "sem_acquire",
        "sem_acquire_l",
        "sem_limit",
        "sem_release",
        "sem_renew",
        "sem_signal",
        "sem_waiters",
        "signal",
        "wake_next",
        "write_acquire",
        "write_acquire_l",
        "write_release",
        "writer",
        "yield_",
    )

    def __init__(self, namespace: str, name: str) -> None:
        tag = f"{{{namespace}:{name}}}".encode("utf-8", "surrogatepass")
        fence = tag + b":fence"
        self.mutex = tag
        self.note = tag + b":note"
        self.signal = tag + b":signal"
        self.mutex_waiters = tag + b":waiters"
        self.writer = tag + b":writer"
        self.readers = tag + b":readers"
        self.rw_signal = tag + b":rw:signal"
        self.rsignal = tag + b":rw:rsignal"
        self.rw_waiters = tag + b":rw:waiters"
        self.sem = tag + b":sem"
        self.sem_signal = tag + b":sem:signal"
        self.sem_waiters = tag + b":sem:waiters"
        self.sem_limit = tag + b":sem:limit"
        self.yield_ = tag + b":yield"
        self.mutex_acquire = (tag, fence, self.yield_)
        self.mutex_release = (tag, self.signal, self.mutex_waiters, self.yield_)
        queue, qdeadline, qclients = tag + b":queue", tag + b":qdeadline", tag + b":qclients"
        self.fair_acquire = (tag, fence, queue, qdeadline, self.signal, qclients)
        self.fair_release = (tag, queue, qdeadline, self.signal, fence, qclients)
        self.read_acquire = (self.writer, fence, self.readers, self.rsignal, self.rw_waiters)
        self.write_acquire = (self.writer, fence, self.readers)
        self.read_release = (self.readers, self.rw_signal, self.rw_waiters)
        self.write_release = (self.writer, self.rw_signal, self.rsignal, self.rw_waiters)
        self.sem_acquire = (self.sem, fence, self.sem_limit)
        self.sem_release = (self.sem, self.sem_signal, self.sem_waiters, self.sem_limit)
        self.sem_renew = (self.sem, self.sem_limit)
        self.inspect = (
            tag,
            fence,
            queue,
            self.mutex_waiters,
            self.writer,
            self.readers,
            self.rw_waiters,
            self.sem,
            self.sem_waiters,
        )
        # Pub/sub mode: the mutex scripts also take the registry of waiting clients (see
        # _scripts.MUTEX_RELEASE).
        self.clients = tag + b":clients"
        self.run = tag + b":run"
        self.mutex_acquire_c = (*self.mutex_acquire, self.clients, self.run)
        self.mutex_release_c = (*self.mutex_release, self.clients, self.run)
        self.wake_next = (tag, self.clients, self.signal)
        self.mutex_handoff = (tag, fence, self.yield_, self.clients, self.signal, self.run)
        self.break_mutex = (
            tag,
            fence,
            self.note,
            self.signal,
            self.mutex_waiters,
            queue,
            self.clients,
            qclients,
        )
        self.break_rw = (
            self.writer,
            fence,
            self.readers,
            self.rw_signal,
            self.rsignal,
            self.rw_waiters,
        )
        self.break_sem = (self.sem, fence, self.sem_limit, self.sem_signal, self.sem_waiters)
        # BLPOP mode: acquire scripts also take the waiter registry and its lists, which a
        # granted waiter leaves in the same step (see _scripts._LEAVE_ON_GRANT).
        self.mutex_acquire_l = (*self.mutex_acquire, self.mutex_waiters, self.signal)
        self.read_acquire_l = (*self.read_acquire, self.rw_signal)
        self.write_acquire_l = (*self.write_acquire, self.rw_waiters, self.rw_signal, self.rsignal)
        self.sem_acquire_l = (*self.sem_acquire, self.sem_waiters, self.sem_signal)

    def client_signal(self, client: bytes) -> bytes:
        """``T:signal:CLIENT``: the mutex channel of one client's waiters (pub/sub mode).

        The scripts derive the same name (``signal .. ':' .. client``) from ``T:signal``.
        """
        return self.signal + b":" + client

    def owner_signal(self, owner: str) -> bytes:
        """``T:signal:OWNER``: the BLPOP list of one fair waiter (the fair queue guards it).

        The scripts derive the same name (``signal .. ':' .. owner``) from ``T:signal``.
        """
        return self.signal + b":" + owner.encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=4096)
def keys_for(namespace: str, name: str) -> Keys:
    """The (cached) :class:`Keys` of ``name`` in ``namespace``."""
    # Bounded: an application locking millions of distinct names must not grow us forever.
    return Keys(namespace, name)


def wake_next_keys(channel: bytes, client: bytes) -> tuple[bytes, bytes, bytes] | None:
    """The keys ``WAKE_NEXT`` takes for ``channel`` if it is one of ``client``'s mutex
    channels (``T:signal:CLIENT``); ``None`` for any other channel."""
    tag = channel[: channel.rfind(b"}") + 1]
    if not tag or channel[len(tag) :] != b":signal:" + client:
        return None
    return (tag, tag + b":clients", tag + b":signal")


def namespace_match(namespace: str) -> str:
    """A SCAN ``MATCH`` pattern for every key of ``namespace`` (glob characters escaped)."""
    escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in namespace)
    return f"{{{escaped}:*"


def split_key(namespace: str, key: bytes) -> tuple[str, bytes] | None:
    """``(name, suffix)`` of a key of ``namespace`` (suffix ``b""`` for the mutex, ``b":fence"``
    ...); ``None`` for a key that is not one of ours. The last ``}`` closes the name."""
    prefix = f"{{{namespace}:".encode("utf-8", "surrogatepass")
    end = key.rfind(b"}")
    if not key.startswith(prefix) or end < len(prefix):
        return None
    return key[len(prefix) : end].decode("utf-8", "surrogatepass"), key[end + 1 :]


def namespace_in_use(key: bytes) -> str | None:
    """The namespace of ``key`` if it is one a lock is held or waited for with (a holder's
    key, a fair queue, a waiter registry); ``None`` for any other key, ours (a fencing
    counter, an identity hash) or not. A namespace holds no ``:``, ``{`` or ``}``: the first
    ``:`` ends it, the last ``}`` closes the name."""
    colon, end = key.find(b":"), key.rfind(b"}")
    if not key.startswith(b"{") or colon < 2 or end < colon:
        return None
    namespace = key[1:colon]
    if b"{" in namespace or b"}" in namespace or key[end + 1 :] not in _IN_USE_SUFFIXES:
        return None
    return namespace.decode("utf-8", "surrogatepass")


_IN_USE_SUFFIXES: Final = HELD_SUFFIXES | _WAITED_SUFFIXES


def break_args(kind: Kind, keys: Keys) -> tuple[str, tuple[bytes, ...]]:
    """What ``BREAK`` takes to break the family of ``kind``: its letter and its keys."""
    if kind is Kind.MUTEX:
        return "m", keys.break_mutex
    if kind is Kind.SEMAPHORE:
        return "s", keys.break_sem
    return "rw", keys.break_rw


@functools.lru_cache(maxsize=64)
def broken_channel(namespace: str) -> bytes:
    """``{ns:}:broken``: where ``BREAK`` publishes the owners it dropped, for their clients.

    One channel per namespace, not per lock: a holder's client listens once (see
    :mod:`._losses`). It starts like every key and channel of the namespace (``{ns:``), so
    an ACL that lets a user at ``{ns:*`` lets it at this channel too.
    """
    return f"{{{namespace}:}}:broken".encode("utf-8", "surrogatepass")


def held_key(kind: Kind, keys: Keys) -> bytes:
    """The key whose deletion ends a lease of ``kind`` (for keyspace notifications)."""
    if kind is Kind.MUTEX:
        return keys.mutex
    if kind is Kind.WRITE:
        return keys.writer
    if kind is Kind.READ:
        return keys.readers
    return keys.sem
