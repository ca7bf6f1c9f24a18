"""The key layout of the Redis backend: which keys one lock name owns, and what each holds.

A lock ``name`` in namespace ``ns`` owns keys that all start with the hash tag ``{ns:name}``
(``T`` below), so each script touches a single slot and works on Redis Cluster::

    T                STRING  mutex owner                                     (PX = lease)
    T:fence          STRING  INCR counter of fencing tokens, all families    (PX = fence_ttl)
    T:queue          LIST    fair mutex: waiting owners, arrival order       (PEXPIREAT)
    T:qdeadline      ZSET    fair mutex: owner -> liveness deadline, ms      (PEXPIREAT)
    T:qclients       HASH    fair mutex, pub/sub mode: owner -> client id    (PEXPIREAT)
    T:note           STRING  mutex: "OWNER\nNOTE", a holder's note (leader)  (PX = ttl given)
    T:yield          STRING  mutex: client that released it to waiting others (PX 30 ms)
    T:run            STRING  pub/sub mode: client taking a mutex in a run        (PX 10 ms)
    T:signal         mutex pub/sub channel; BLPOP mode: LIST of wake tokens  (PEXPIRE)
    T:signal:OWNER   BLPOP mode: the wake token of one fair waiter           (PEXPIRE)
    T:signal:CLIENT  pub/sub mode: the mutex channel of one client's waiters (fair ones too)
    T:clients        pub/sub mode: ZSET client id -> when it registered, ms  (PEXPIRE)
    T:waiters        BLPOP mode: ZSET of owners blocked on T:signal          (PEXPIRE)
    T:writer         STRING  read-write lock: the writer                     (PX = lease)
    T:readers        ZSET    read-write lock: owner -> lease expiry, ms      (PEXPIREAT)
    T:rw:signal      read-write channel; BLPOP mode: the writers' tokens     (PEXPIRE)
    T:rw:rsignal     BLPOP mode: the readers' tokens                         (PEXPIRE)
    T:rw:waiters     BLPOP mode: ZSET of blocked readers and writers         (PEXPIRE)
    T:sem            ZSET    semaphore: permit owner -> lease expiry, ms     (PEXPIREAT)
    T:sem:limit      STRING  semaphore: the limit its holders use            (PEXPIREAT of T:sem)
    T:sem:signal     semaphore channel; BLPOP mode: LIST of wake tokens      (PEXPIRE)
    T:sem:waiters    BLPOP mode: ZSET of owners blocked on T:sem:signal      (PEXPIRE)

Times in ZSET scores are server milliseconds. The mutex, the read-write lock and the semaphore
of one name are independent families (as on every backend), sharing only the fencing counter.
``T:sem:limit`` always expires with ``T:sem`` (and is deleted with its last permit): while
permits are held, an acquire asking for another limit is refused; once none is, any limit is
accepted.

Names are opaque: ``{``, ``}``, spaces and unicode are fine. No suffix contains ``}``, so the
last ``}`` of any key closes the name: two different names can never produce the same key,
however odd the names are.

``T:fence`` outlives its lock by ``fence_ttl`` (default 7 days, refreshed on every grant; 0:
forever). A missing counter -- expired, or lost with a restart or failover -- starts again from
the server clock in microseconds (see :mod:`._scripts`), so tokens keep increasing and a fenced
resource keeps accepting new holders. Every other key carries a TTL or is deleted when it
empties, so nothing is orphaned once holders and waiters are gone, and nothing per lock name
lives forever.
"""

from __future__ import annotations

import functools

__all__ = ["Keys", "keys_for", "namespace_match", "split_key", "wake_next_keys"]


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
            tag, fence, self.note, self.signal, self.mutex_waiters, queue, self.clients, qclients
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
