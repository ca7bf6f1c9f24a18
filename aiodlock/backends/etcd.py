"""The etcd backend: ``etcd://h1:2379,h2:2379,h3:2379/prefix``.

etcd's own lock recipe (``client/v3/concurrency`` Mutex, Go) ported onto aetcd's gRPC stubs
and messages (connection: :mod:`._etcd_conn`). aetcd's ``Lock`` is not used: it competes by
compare-and-set on one key, wakes every waiter at each release and never renews its lease.

**Session.** One etcd lease per client, granted at ``open()`` with ``session_ttl`` seconds
(default 10; etcd may round it up to its minimum, about 1.5 times its election timeout). The
client's keeper task sends a keep-alive every ``session_ttl / 4``; every lock key of the client
is attached to that lease, so the cluster deletes them all when the process dies and the lease
runs out. Keys never outlive it: the prefix holds only live keys.

**Key layout.** Every lock family of a name is a directory of contenders::

    <prefix>/<namespace>/<name>/mutex/<lease id hex>-<owner>       value b"mutex"
    <prefix>/<namespace>/<name>/rw/<lease id hex>-<owner>          value b"read" / b"write"
    <prefix>/<namespace>/<name>/semaphore/<lease id hex>-<owner>   value b"sema:5" (limit 5)

Namespace and name are percent-encoded UTF-8 (only ``A-Z a-z 0-9 - _`` stay), so any name is
one path segment and distinct names never share a directory. ``owner`` is the core's random
hex per acquisition, so several tasks of one client each have their own key (unlike Go's
Mutex, where two Mutexes of one Session share a key and both "hold" it).

**Acquiring** is one transaction: *if* ``create_revision(key) == 0`` *then* put the key on our
lease and list the directory, *else* only list it (the listing sorted by create revision).
The key is derived from the lease and the owner, so an attempt sent again after a lost reply
(a member went away mid-request, the call was cancelled) finds the key the first one made
rather than queueing a second. The transaction runs in a task of the backend, so a caller
cancelled meanwhile does not lose its reply; the compensating ``release`` waits for it and
deletes the key. Granting (contenders in create-revision order):

* mutex and write lock: ours is the first key; a waiter watches the deletion of the key just
  before its own (no herd);
* read lock: no write key before ours (later writers do not count); a waiter watches the
  closest write key before it;
* semaphore of N: ours is among the first N; a waiter watches deletions in the directory. A
  key with another limit ahead of ours makes the attempt delete its key and raise
  :class:`~aiodlock.LimitMismatchError`.

Watches start at the listing's revision + 1, so a deletion between the listing and the watch
is delivered too; a watch that ends, is cancelled or finds its revision compacted wakes the
waiter, which checks again (level-triggered wakeups, banked). Queues are FIFO by create
revision, so FAIR is declared; as on ZooKeeper, the waiting tasks of one client take turns
and only the one whose turn it is has a key, unless ``fair=True``.

**Fencing token** = the key's create revision: etcd's cluster-wide revision, strictly
increasing, persisted in the raft log, so it never goes back on a leader change or a restart
(unlike a counter in a cache). An exclusive grant's token is larger than every earlier grant's
of that family. A fenced resource can also check ownership itself in an etcd transaction:
``create_revision(key) == token``.

**Losing a lock.** A held key is watched: the moment etcd reports it deleted — an operator's
``break_lock`` or ``etcdctl del``, the lease revoked (``etcdctl lease revoke``) or expired —
the lease is marked lost and the guarded body is cancelled with
:class:`~aiodlock.LockLostError`. The keeper marks every held lock lost when a keep-alive says
the lease is gone, or when no keep-alive was answered for ``0.75 * TTL`` (before the cluster
can expire the lease and hand the lock to someone else); the lease is then revoked in the
background and a new one granted for later acquisitions. A renewal missing for the lock's
``ttl`` (a hung keeper in a live process) deletes the key, as a TTL backend would expire it.

**Members.** The URL may list several members. Calls go to one; a call that finds it down
or silent moves to the next and is sent again (every request is idempotent). The lease lives
in the cluster, so moving keeps it while the cluster has a quorum.

Options (URL query or keyword): ``session_ttl`` (default 10 s), ``connect_timeout`` (default
5 s), ``request_timeout`` (default 5 s); TLS: ``ssl``, ``ssl_ca``, ``ssl_cert``, ``ssl_key``;
credentials in the URL (``etcd://user:password@host:2379``, never printed).

Example::

    async with aiodlock.connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks") as locks:
        async with locks.lock("order:42") as lease:
            print(lease.fencing_token)   # the lock key's create revision
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import functools
import logging
import math
from collections.abc import AsyncIterator, Coroutine, Mapping, Set
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final
from urllib.parse import unquote

from aetcd import rpc

from .._exceptions import BackendError, LimitMismatchError
from .._url import ParsedURL
from .._validate import check_seconds
from ._etcd_conn import EtcdConnection, WatchStream, prefix_end
from ._protocol import (
    Busy,
    Capability,
    Grant,
    HolderInfo,
    Kind,
    LockInfo,
    LockSpec,
    LossSignal,
    Waiter,
)
from ._tls import TLS_OPTIONS
from ._wakeup import BankedWakeup

__all__ = ["EtcdBackend", "encode_segment"]

logger = logging.getLogger("aiodlock.etcd")

_DEFAULT_PORT: Final = 2379
_DEFAULT_SESSION_TTL: Final = 10.0
_DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_DEFAULT_REQUEST_TIMEOUT: Final = 5.0
_GRACE_FRACTION: Final = 0.75
_KEEPALIVE_FRACTION: Final = 0.25
_RETRY_PAUSE: Final = 0.1
_BATCH: Final = 128  # etcd's default --max-txn-ops

_FAMILY: Final = {
    Kind.MUTEX: "mutex",
    Kind.READ: "rw",
    Kind.WRITE: "rw",
    Kind.SEMAPHORE: "semaphore",
}
_KIND_OF_FAMILY: Final = {"mutex": Kind.MUTEX, "rw": Kind.READ, "semaphore": Kind.SEMAPHORE}
_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@functools.lru_cache(maxsize=4096)
def encode_segment(text: str) -> str:
    """One key segment for any string: percent-encoded UTF-8, injective, no ``/``."""
    raw = text.encode("utf-8", "surrogatepass")
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)


def _value(spec: LockSpec) -> bytes:
    if spec.kind is Kind.SEMAPHORE:
        return f"sema:{spec.limit}".encode()
    return str(spec.kind.value).encode()


def _prefix(path: str) -> str:
    parts = [unquote(part) for part in path.split("/") if part]
    return "".join(f"/{encode_segment(part)}" for part in parts) or "/aiodlock"


def _seconds(options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key)
    if value is None:
        return default
    checked = check_seconds(value, argument=key, allow_none=False)
    assert checked is not None
    return checked


@dataclass(frozen=True, slots=True)
class _Verdict:
    granted: bool
    watch: bytes | None = None  # key (or directory, with prefix) whose deletion wakes us
    prefix: bool = False
    conflict: int | None = None  # semaphore: the other limit of a contender ahead of us


def _evaluate(
    key: bytes,
    kind: Kind,
    limit: int,
    kvs: list[Any],
    directory: bytes,
    leaving: Set[bytes] = frozenset(),
) -> _Verdict:
    """Is ``key`` granted, given the directory's keys in create-revision order; if not,
    which deletion to watch.

    ``leaving``: keys of ours whose acquisitions gave up and are being deleted. They will
    never hold the lock, so our other entries queue as if they were gone already, instead of
    waiting for a deletion, its watch event and a new listing each (a storm of cancellations
    makes long chains of them).
    """
    if leaving:
        kvs = [kv for kv in kvs if kv.key == key or kv.key not in leaving]
    index = next(i for i, kv in enumerate(kvs) if kv.key == key)
    ahead = kvs[:index]
    if kind is Kind.READ:
        writers = [kv.key for kv in ahead if kv.value == b"write"]
        return _Verdict(True) if not writers else _Verdict(False, writers[-1])
    if kind is Kind.SEMAPHORE:
        for kv in ahead:
            theirs = int(kv.value.partition(b":")[2] or 0)
            if theirs and theirs != limit:
                return _Verdict(False, conflict=theirs)
        if index < limit:
            return _Verdict(True)
        return _Verdict(False, directory, prefix=True)
    return _Verdict(True) if index == 0 else _Verdict(False, ahead[-1].key)


def _holders(kvs: list[Any]) -> list[Any]:
    """The keys of ``kvs`` (one directory, create-revision order) that hold the lock."""
    if not kvs:
        return []
    first = kvs[0].value
    if first.startswith(b"sema:"):
        limit = int(first.partition(b":")[2] or 1)
        return kvs[:limit]
    if first == b"read":
        held = []
        for kv in kvs:
            if kv.value != b"read":
                break
            held.append(kv)
        return held
    return kvs[:1]


# ---------------------------------------------------------------------- state


class _EtcdWaiter(BankedWakeup):
    """A waiting acquisition's wakeup: banked, armed on at most one watch at a time."""

    __slots__ = ("armed", "task")

    def __init__(self) -> None:
        super().__init__()
        self.armed: tuple[bytes, int] | None = None  # (watched key, from revision)
        self.task: asyncio.Task[None] | None = None

    async def wait(self, timeout: float | None) -> None:
        await self._consume(timeout)


class _Line:
    """The transactions of one client for one directory, one at a time."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class _Entry:
    """One acquisition (owner) of one lock family: its key and lease state."""

    __slots__ = (
        "deleted",
        "directory",
        "error",
        "gone",
        "held",
        "inflight",
        "key",
        "kind",
        "kvs",
        "lease_id",
        "limit",
        "listed",
        "lock",
        "lost",
        "lost_event",
        "owner",
        "reaper",
        "revision",
        "sent",
        "since",
        "stale",
        "token",
        "value",
        "verdict",
        "watcher",
    )

    def __init__(self, directory: bytes, owner: str, spec: LockSpec) -> None:
        self.directory = directory
        self.owner = owner
        self.kind = spec.kind
        self.limit = spec.limit
        self.value = _value(spec)
        self.key = b""
        self.lease_id = 0
        self.inflight: asyncio.Task[None] | None = None  # our transaction, until seen to end
        self.sent = False  # a transaction that may have created our key was sent
        self.listed = False  # the last transaction of this entry came back with a listing
        # Our copy of the directory: its listing at ``revision``, minus the keys our watches
        # (all started at revision + 1) saw deleted since. ``stale``: list again.
        self.stale = True
        self.deleted: set[bytes] = set()
        self.since = 0  # a directory watch starts here
        self.error: BaseException | None = None
        self.kvs: list[Any] = []
        self.revision = 0  # the listing's revision
        self.token = 0
        self.held = False
        self.lost: str | None = None
        self.lost_event = LossSignal()
        self.lock = asyncio.Lock()
        self.reaper: asyncio.TimerHandle | None = None
        self.verdict: _Verdict | None = None
        self.watcher: asyncio.Task[None] | None = None  # watches our held key
        self.gone = False


def _left(entry: _Entry) -> bool:
    return entry.gone


def _still_held(entry: _Entry) -> bool:
    return entry.held and entry.lost is None and not entry.gone


# ---------------------------------------------------------------------- the backend


class EtcdBackend:
    """Locks on an etcd v3 cluster (see the module docstring for the recipe and options).

    Example::

        async with aiodlock.connect("etcd://127.0.0.1:2379/apps?session_ttl=5") as locks:
            async with locks.write_lock("catalog"):
                ...
    """

    # As on ZooKeeper: a refused attempt leaves a key, which this backend deletes itself when
    # no waiter claims it in the same loop step, so the core lets a client's tasks take turns.
    queues_on_busy: ClassVar[bool] = False
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.EXCLUSIVE,
            Capability.SHARED,
            Capability.COUNTING,
            Capability.FAIR,
            Capability.FENCING,
            Capability.SESSION_LEASE,
            Capability.SERVER_WAKEUP,
            Capability.INSPECT,
            Capability.BREAK,
        }
    )
    options: ClassVar[Mapping[str, type]] = {
        "session_ttl": float,
        "connect_timeout": float,
        "request_timeout": float,
        **TLS_OPTIONS,
    }

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        if not url.hosts:
            raise ValueError("etcd:// url needs a host: etcd://h1:2379,h2:2379/prefix")
        if (url.username is None) != (url.password is None):
            raise ValueError(f"{url.redacted()}: give both a user name and a password, or neither")
        self._url = url
        self._endpoints = [
            f"{host or 'localhost'}:{port or _DEFAULT_PORT}" for host, port in url.hosts
        ]
        self._root = _prefix(url.path)
        self._session_ttl = _seconds(options, "session_ttl", _DEFAULT_SESSION_TTL)
        self._connect_timeout = _seconds(options, "connect_timeout", _DEFAULT_CONNECT_TIMEOUT)
        self._request_timeout = _seconds(options, "request_timeout", _DEFAULT_REQUEST_TIMEOUT)
        self._credentials = _credentials(options)
        self._state = "new"
        self._conn: EtcdConnection | None = None
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._cleanups: set[asyncio.Task[None]] = set()
        self._entries: dict[tuple[bytes, str], _Entry] = {}
        self._waiters: dict[tuple[bytes, str], _EtcdWaiter] = {}
        self._leaving: set[bytes] = set()  # our keys being deleted that never held
        self._lines: dict[bytes, _Line] = {}  # per directory: our transactions take turns
        self._trash: list[_Entry] = []  # discarded entries whose keys the janitor deletes
        self._janitor: asyncio.Task[None] | None = None
        self._lease_id: int | None = None
        self._lease_ttl = math.ceil(self._session_ttl)
        self._lease_lock = asyncio.Lock()
        self._contact = 0.0
        self._kick = asyncio.Event()
        self._leases = 0
        self._losses = 0

    # ------------------------------------------------------------------ lifetime

    async def open(self) -> None:
        """Connect to a member that answers and grant the session lease; BackendError if no
        member answers within ``connect_timeout``."""
        if self._state != "new":
            raise RuntimeError(f"{self.describe()} backend was already opened")
        self._state = "opening"
        group = asyncio.TaskGroup()
        await group.__aenter__()
        self._group = group
        conn = EtcdConnection(
            self._endpoints,
            request_timeout=self._request_timeout,
            credentials=self._credentials,
            username=self._url.username,
            password=self._url.password,
            describe=self.describe(),
            on_move=self._moved,
        )
        self._conn = conn
        try:
            await conn.open(self._connect_timeout)
            async with asyncio.timeout(self._connect_timeout):
                await self._grant(conn)
        except BaseException as exc:
            self._state = "closed"
            await conn.close()
            await self._stop_tasks()
            if isinstance(exc, TimeoutError):
                raise BackendError(
                    f"could not grant a lease on {self.describe()} "
                    f"within {self._connect_timeout:g} s (connect_timeout)"
                ) from exc
            raise
        self._state = "open"
        self._spawn(self._keeper(), "aiodlock-etcd-keeper")
        self._spawn(self._grace_watch(), "aiodlock-etcd-grace")

    async def aclose(self) -> None:
        """Revoke the lease (etcd deletes every key of ours at once) and stop every task."""
        if self._state in ("closing", "closed"):
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closing"
        for entry in self._entries.values():
            if entry.reaper is not None:
                entry.reaper.cancel()
        for task in list(self._tasks):
            task.cancel()
        conn = self._conn
        try:
            if conn is not None:
                lease, self._lease_id = self._lease_id, None
                if lease is not None:
                    with contextlib.suppress(BackendError):
                        await conn.revoke(lease, timeout=self._request_timeout)
                await conn.close()
        finally:
            await self._stop_tasks()
            for waiter in self._waiters.values():
                waiter.wake()
            self._state = "closed"

    async def _stop_tasks(self) -> None:
        for task in [*self._tasks, *self._cleanups]:
            task.cancel()
        group, self._group = self._group, None
        if group is not None:
            await group.__aexit__(None, None, None)

    def _spawn(
        self, coro: Coroutine[Any, Any, None], name: str, *, cleanup: bool = False
    ) -> asyncio.Task[None]:
        group = self._group
        if group is None:
            coro.close()
            raise BackendError(f"{self.describe()} backend is closed")
        task = group.create_task(_never_fail(coro, name), name=name)
        tasks = self._cleanups if cleanup else self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(lambda _: coro.close())
        return task

    def _require_open(self) -> EtcdConnection:
        if self._state != "open" or self._conn is None:
            raise BackendError(f"{self.describe()} backend is not open")
        return self._conn

    async def settle(self) -> None:
        """Wait for the background deletions running now (and those they start)."""
        while self._cleanups:
            await asyncio.wait(list(self._cleanups))

    # ------------------------------------------------------------------ description

    def check(self, spec: LockSpec) -> None:
        """Every kind is supported (the FIFO queue makes ``fair=True`` a no-op)."""

    def describe(self) -> str:
        """The URL without credentials."""
        return self._url.redacted()

    def statistics(self) -> Mapping[str, Any]:
        """Session and recipe counters."""
        conn = self._conn
        return {
            "state": self._state,
            "endpoint": conn.endpoint if conn is not None else None,
            "lease_id": None if self._lease_id is None else f"{self._lease_id:x}",
            "lease_ttl": self._lease_ttl,
            "entries": len(self._entries),
            "held": sum(1 for e in self._entries.values() if e.held and e.lost is None),
            "waiters": len(self._waiters),
            "leases": self._leases,
            "losses": self._losses,
            "member_moves": conn.moves if conn is not None else 0,
        }

    def _directory(self, spec: LockSpec) -> bytes:
        return (
            f"{self._root}/{encode_segment(spec.namespace)}/{encode_segment(spec.name)}"
            f"/{_FAMILY[spec.kind]}/"
        ).encode()

    @property
    def _grace(self) -> float:
        return self._lease_ttl * _GRACE_FRACTION

    @property
    def _heartbeat(self) -> float:
        return max(self._lease_ttl * _KEEPALIVE_FRACTION, 0.05)

    # ------------------------------------------------------------------ protocol

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """Queue (a key created only if absent) and check our place: Grant or Busy(None)."""
        self._require_open()
        directory = self._directory(spec)
        key = (directory, owner)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(directory, owner, spec)
        async with entry.lock:
            if entry.gone:  # left the queue meanwhile (not through the core): queue anew
                return await self.try_acquire(spec, owner, ttl)
            if entry.held:
                return Grant(entry.token) if entry.lost is None else Busy(None)
            verdict = None
            if not entry.stale and entry.kvs and entry.lease_id == self._lease_id:
                if entry.deleted:
                    await self._relist(entry)
                verdict = self._recheck(entry)
            if verdict is None or verdict.granted or verdict.conflict is not None:
                # A grant (or a refusal) is decided on a fresh listing, never on our copy.
                if not await self._enqueue(entry):
                    return await self.try_acquire(spec, owner, ttl)  # a new entry
                verdict = _evaluate(
                    entry.key, entry.kind, entry.limit, entry.kvs, directory, self._leaving
                )
            if verdict.conflict is not None:
                # Deleted before we answer: a refused key left behind would make the next
                # contender (of the right limit) meet it and be refused too.
                self._retire(entry)
                try:
                    await self._delete_key(entry)
                except BaseException:
                    self._discard(entry)
                    raise
                raise LimitMismatchError(spec.name, verdict.conflict, spec.limit)
            if verdict.granted:
                entry.held = True
                entry.verdict = None
                entry.token = next(kv.create_revision for kv in entry.kvs if kv.key == entry.key)
                self._schedule_reaper(entry, ttl)
                entry.watcher = self._spawn(self._watch_held(entry), "aiodlock-etcd-held")
                return Grant(entry.token)
            entry.verdict = verdict
            waiter = self._waiters.get(key)
            if waiter is None:
                # Lock.try_acquire() will not wait: unless waiter() is entered right away
                # (the core does so in the same step), our key must not stay.
                asyncio.get_running_loop().call_soon(self._drop_if_unwaited, entry)
            else:
                await self._arm(waiter, entry)
            return Busy(None)

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Delete our key (after any transaction still on its way); True if it was held."""
        if self._state != "open":
            return False
        entry = self._entries.get((self._directory(spec), owner))
        if entry is None:
            return False
        if entry.lost is not None or entry.gone:
            if not entry.gone:
                self._retire(entry)
                self._discard(entry)
            return False
        async with entry.lock:
            if _left(entry):  # released by another call meanwhile
                return False
            held = entry.held and entry.lost is None
            self._retire(entry)
            if held:
                try:
                    await self._delete_key(entry)
                except BaseException:
                    self._discard(entry)  # cancelled or failed: finished in the background
                    raise
                return True
            self._discard(entry)  # only queued: nobody waits for the deletion
            return False

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Confirm our key exists on our live lease; False once the lease is lost."""
        conn = self._require_open()
        entry = self._entries.get((self._directory(spec), owner))
        if entry is None or not entry.held or entry.gone or entry.lost is not None:
            return False
        if entry.lease_id != self._lease_id:
            self._mark_lost(entry, "its etcd lease ended")
            return False
        reply = await conn.call(
            "_kv",
            "Range",
            _range_request(entry.key, count_only=True),
            timeout=max(self._heartbeat, min(ttl / 3, self._request_timeout)),
        )
        if entry.lost_event.is_set():
            return False
        if reply.count == 0:
            self._mark_lost(entry, "its lock key was deleted")
            return False
        self._schedule_reaper(entry, ttl)
        return True

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        """Arm the watch our last refused attempt chose; leaving by an error drops our key."""
        self._require_open()
        key = (self._directory(spec), owner)
        waiter = _EtcdWaiter()
        self._waiters[key] = waiter  # before any await: see _drop_if_unwaited
        try:
            entry = self._entries.get(key)
            if entry is not None and not entry.held:
                await self._arm(waiter, entry)
            yield waiter
        except BaseException:
            entry = self._entries.get(key)
            if entry is not None and not entry.held and not entry.gone:
                self._retire(entry)
                self._discard(entry)
            raise
        finally:
            self._disarm(waiter)
            if self._waiters.get(key) is waiter:
                del self._waiters[key]

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """An Event set the moment the held lease of ``owner`` is known to be lost: key
        deleted, lease revoked or expired, keep-alive unanswered for the grace, or ttl passed
        without renewal. ``None`` if ``owner`` holds nothing here."""
        entry = self._entries.get((self._directory(spec), owner))
        if entry is None or not entry.held:
            return None
        return entry.lost_event

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """``contact + grace``: the cluster heard from our lease no earlier than ``contact``
        (the send time of the newest answered keep-alive), and the grace is shorter than the
        lease's TTL. ``None`` if ``owner`` holds nothing here."""
        entry = self._entries.get((self._directory(spec), owner))
        if entry is None or not entry.held:
            return None
        return self._contact + self._grace

    # ------------------------------------------------------------------ inspect / break

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every lock of ``namespace`` with keys whose name matches ``pattern``: holders with
        their lease's TTL left, the number of waiters, the newest holder's create revision."""
        conn = self._require_open()
        base = f"{self._root}/{encode_segment(namespace)}/".encode()
        reply = await conn.range(
            base,
            prefix=True,
            sort_order=_ASCEND,
            sort_target=_CREATE,
        )
        directories: dict[bytes, list[Any]] = {}
        for kv in reply.kvs:
            directory = kv.key.rsplit(b"/", 1)[0]
            directories.setdefault(directory, []).append(kv)
        ttls: dict[int, float | None] = {}
        found = []
        for directory, kvs in sorted(directories.items()):
            encoded_name, _, family = directory[len(base) :].decode().rpartition("/")
            name = unquote(encoded_name, errors="surrogatepass")
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            holders = _holders(kvs)
            for kv in holders:
                if kv.lease not in ttls:
                    ttls[kv.lease] = await self._ttl_left(conn, kv.lease)
            kinds = {kv.value for kv in holders}
            kind = _KIND_OF_FAMILY.get(family, Kind.MUTEX)
            if b"write" in kinds:
                kind = Kind.WRITE
            found.append(
                LockInfo(
                    name,
                    kind,
                    tuple(
                        HolderInfo(kv.key.rsplit(b"-", 1)[1].decode(), ttls[kv.lease])
                        for kv in holders
                    ),
                    max((kv.create_revision for kv in holders), default=None),
                    len(kvs) - len(holders),
                )
            )
        return found

    @staticmethod
    async def _ttl_left(conn: EtcdConnection, lease: int) -> float | None:
        reply = await conn.time_to_live(lease)
        return float(reply.TTL) if reply.TTL >= 0 else None

    async def break_lock(self, spec: LockSpec) -> int:
        """Delete the key of every holder of ``spec``; the next holder's create revision is
        larger anyway, so a broken holder's fenced writes are refused. Returns how many."""
        conn = self._require_open()
        directory = self._directory(spec)
        reply = await conn.range(directory, prefix=True, sort_order=_ASCEND, sort_target=_CREATE)
        holders = _holders(list(reply.kvs))
        for kv in holders:
            await conn.delete(kv.key)
        return len(holders)

    # ------------------------------------------------------------------ queueing

    async def _relist(self, entry: _Entry) -> None:
        """List the directory again with a serializable read (answered by the member
        itself, no consensus round): a waiter woken by a deletion learns at once about
        every other key ahead of it that went meanwhile (in a storm of cancelled waiters,
        walking the queue one watch at a time is far slower)."""
        reply = await self._require_open().call(
            "_kv", "Range", _range_request(entry.directory, prefix=True, serializable=True)
        )
        entry.kvs = list(reply.kvs)
        entry.revision = reply.header.revision
        entry.since = entry.revision + 1
        entry.deleted.clear()

    def _recheck(self, entry: _Entry) -> _Verdict | None:
        """Our place from our copy of the directory, with no request: ``None`` if the copy
        cannot tell (none yet, stale, or our own key is not in it).

        Keys are only ever added *behind* ours (a larger create revision), so the keys ahead
        of ours are those of our listing minus the deletions since; a listing may come from a
        member that lags (a serializable read) because a waiter's watch starts at the
        listing's revision + 1, so a deletion after it is delivered even if it happened
        before the watch existed. A grant is never decided on the copy: it is confirmed by
        the transaction, which reads the leader's state.
        """
        if entry.stale or not entry.kvs or entry.lease_id != self._lease_id:
            return None
        if entry.deleted:
            entry.kvs = [kv for kv in entry.kvs if kv.key not in entry.deleted]
            entry.deleted.clear()
        if not any(kv.key == entry.key for kv in entry.kvs):
            return None  # our own key was deleted: queue again
        return _evaluate(
            entry.key, entry.kind, entry.limit, entry.kvs, entry.directory, self._leaving
        )

    async def _enqueue(self, entry: _Entry) -> bool:
        """Make sure our key exists on the current lease; list the directory (entry.kvs).
        False if the entry left the queue meanwhile (nothing was sent)."""
        for _ in range(4):
            stale = entry.inflight
            if stale is not None:
                # A transaction of an earlier, cancelled call: its listing is old news. Let it
                # end (its key may exist), then send one of our own.
                await asyncio.wait((stale,))
                entry.inflight = None
                entry.error = None
            lease = await self._current_lease()
            if entry.lease_id != lease:
                entry.lease_id = lease
                entry.key = entry.directory + f"{lease:x}-{entry.owner}".encode()
            entry.listed = False
            task = entry.inflight = self._spawn(self._transact(entry), "aiodlock-etcd-txn")
            await asyncio.wait((task,))  # a cancelled caller leaves it running
            entry.inflight = None
            error, entry.error = entry.error, None
            if task.cancelled():
                raise BackendError(f"{self.describe()} backend was closed")
            if error is None:
                # Not sent if the entry left the queue meanwhile: never decide on an old
                # listing, queue anew instead.
                return entry.listed
            if "lease not found" in str(error):
                self._session_ended(lease, "the etcd lease was not found")
                continue
            raise error
        raise BackendError(f"could not queue on {self.describe()}: the lease keeps ending")

    async def _transact(self, entry: _Entry) -> None:
        """Create the key if absent, and list the directory, in one transaction.

        A client sends one transaction per directory at a time; the others wait their turn
        here, in arrival order, and one whose caller gave up meanwhile is never sent. In a
        storm of acquisitions cancelled within milliseconds, most then cost nothing at the
        service (instead of a transaction and a deletion each, which starved the lease's
        keep-alives on a loaded machine).
        """
        line = self._lines.get(entry.directory)
        if line is None:
            line = self._lines[entry.directory] = _Line()
        line.users += 1
        try:
            async with line.lock:
                if entry.gone:
                    return  # given up before it was sent: nothing to create
                await self._send_transaction(entry)
        finally:
            line.users -= 1
            if not line.users and self._lines.get(entry.directory) is line:
                del self._lines[entry.directory]

    async def _send_transaction(self, entry: _Entry) -> None:
        conn = self._require_open()
        entry.sent = True
        listing = rpc.RequestOp(request_range=_range_request(entry.directory, prefix=True))
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    result=rpc.Compare.CompareResult.EQUAL,
                    target=rpc.Compare.CompareTarget.CREATE,
                    key=entry.key,
                    create_revision=0,
                )
            ],
            success=[
                rpc.RequestOp(
                    request_put=rpc.PutRequest(
                        key=entry.key, value=entry.value, lease=entry.lease_id
                    )
                ),
                listing,
            ],
            failure=[listing],
        )
        try:
            reply = await conn.txn(request)
        except BackendError as exc:
            entry.error = exc
            return
        entry.kvs = list(reply.responses[-1].response_range.kvs)
        entry.revision = reply.header.revision
        entry.listed = True
        entry.stale = False
        entry.deleted.clear()
        entry.since = entry.revision + 1

    async def _delete_key(self, entry: _Entry) -> None:
        """Delete our key once the transaction that may create it has ended."""
        task = entry.inflight
        if task is not None:
            await asyncio.wait((task,))
            entry.inflight = None
            entry.error = None
        if entry.key and entry.sent and entry.lease_id == self._lease_id:
            await self._require_open().delete(entry.key)
        entry.sent = False

    def _discard(self, entry: _Entry) -> None:
        """Delete our key in the background (the janitor), retrying until done or the lease
        is gone."""
        if self._state != "open" or not entry.key:
            return
        key = entry.key
        self._trash.append(entry)
        if entry.lost is None:
            # Never to hold the lock: our waiters queued behind it move on now.
            self._leaving.add(key)
            for waiter in self._waiters.values():
                if waiter.armed is not None and waiter.armed[0] == key:
                    self._disarm(waiter)
                    waiter.wake()
        if self._janitor is None or self._janitor.done():
            self._janitor = self._spawn(self._empty_trash(), "aiodlock-etcd-janitor", cleanup=True)

    async def _empty_trash(self) -> None:
        """Delete the discarded keys, many per transaction: a storm of cancelled
        acquisitions costs one request per batch, not one per key."""
        while self._trash and self._state == "open":
            batch, self._trash = self._trash[:_BATCH], self._trash[_BATCH:]
            inflight = [e.inflight for e in batch if e.inflight is not None]
            if inflight:
                await asyncio.wait(inflight)  # their keys exist (or not) once they end
            keys: dict[bytes, None] = {}
            for entry in batch:
                entry.inflight = None
                entry.error = None
                newer = self._entries.get((entry.directory, entry.owner))
                if newer is not None and newer is not entry and newer.key == entry.key:
                    continue  # queued again under the same key: that entry owns it now
                if entry.sent and entry.lease_id == self._lease_id:
                    keys[entry.key] = None
            try:
                if keys:
                    await self._require_open().txn(
                        rpc.TxnRequest(
                            success=[
                                rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=k))
                                for k in keys
                            ]
                        )
                    )
            except BackendError as exc:
                logger.debug("could not delete %d keys yet: %s", len(keys), exc)
                self._trash[:0] = batch
                await asyncio.sleep(_RETRY_PAUSE)
                continue
            # A listing sent before the deletion may still show these keys: they stay
            # skipped until any such listing has surely come back.
            loop = asyncio.get_running_loop()
            for entry in batch:
                entry.sent = False
                loop.call_later(2 * self._request_timeout, self._leaving.discard, entry.key)

    def _retire(self, entry: _Entry) -> None:
        entry.gone = True
        entry.held = False
        entry.verdict = None
        if entry.reaper is not None:
            entry.reaper.cancel()
            entry.reaper = None
        if entry.watcher is not None:
            entry.watcher.cancel()
            entry.watcher = None
        key = (entry.directory, entry.owner)
        if self._entries.get(key) is entry:
            del self._entries[key]

    def _drop_if_unwaited(self, entry: _Entry) -> None:
        if (
            not entry.gone
            and not entry.held
            and (entry.directory, entry.owner) not in self._waiters
        ):
            self._retire(entry)
            self._discard(entry)

    # ------------------------------------------------------------------ watches

    async def _arm(self, waiter: _EtcdWaiter, entry: _Entry) -> None:
        """Watch the deletion the last check chose, from the listing's revision on."""
        verdict = entry.verdict
        if verdict is None or verdict.watch is None:
            return
        # A key is watched from the listing on (a deletion before the watch is still
        # delivered); the directory from after the newest deletion our copy has seen.
        start = entry.since if verdict.prefix else entry.revision + 1
        target = (verdict.watch, start)
        if waiter.armed == target:
            return
        self._disarm(waiter)
        waiter.armed = target
        try:
            stream = await self._require_open().watch(
                verdict.watch, start_revision=start, prefix=verdict.prefix
            )
        except BackendError:
            waiter.armed = None
            entry.stale = True
            waiter.wake()  # check again (that attempt reports a cluster that is gone)
            return
        except BaseException:
            waiter.armed = None
            raise
        waiter.task = self._spawn(
            self._wake_on(stream, waiter, entry, verdict.prefix), "aiodlock-etcd-watch"
        )

    @staticmethod
    async def _wake_on(
        stream: WatchStream, waiter: _EtcdWaiter, entry: _Entry, prefix: bool
    ) -> None:
        try:
            deleted = await stream.wait()
            if deleted is None:
                entry.stale = True  # no telling what changed: list again
            else:
                entry.deleted.update(deleted)
                if prefix:  # it saw every deletion in the directory up to here
                    entry.since = max(entry.since, stream.revision + 1)
            waiter.armed = None
            waiter.wake()
        finally:
            stream.cancel()

    def _disarm(self, waiter: _EtcdWaiter) -> None:
        waiter.armed = None
        task, waiter.task = waiter.task, None
        if task is not None:
            task.cancel()

    async def _watch_held(self, entry: _Entry) -> None:
        """Mark the lease lost the moment etcd reports our held key deleted."""
        conn = self._require_open()
        revision = entry.revision + 1
        while _still_held(entry):
            try:
                stream = await conn.watch(entry.key, start_revision=revision)
                try:
                    await stream.wait()
                finally:
                    stream.cancel()
                reply = await conn.range(entry.key)
            except BackendError:
                await asyncio.sleep(_RETRY_PAUSE)
                continue
            if not _still_held(entry):
                return
            if reply.count == 0:
                self._mark_lost(entry, "its lock key was deleted")
                return
            revision = reply.header.revision + 1

    # ------------------------------------------------------------------ leases

    def _schedule_reaper(self, entry: _Entry, ttl: float) -> None:
        if entry.reaper is not None:
            entry.reaper.cancel()
        entry.reaper = asyncio.get_running_loop().call_later(ttl, self._reap, entry)

    def _reap(self, entry: _Entry) -> None:
        entry.reaper = None
        if entry.held and entry.lost is None and not entry.gone:
            self._mark_lost(entry, "it was not renewed within its ttl")
            self._discard(entry)

    def _mark_lost(self, entry: _Entry, reason: str) -> None:
        """The lease is over: renew says False from now on, the watchdog is told at once."""
        if entry.lost is not None:
            return
        entry.lost = reason
        entry.lost_event.set()
        self._losses += 1
        if entry.reaper is not None:
            entry.reaper.cancel()
            entry.reaper = None
        logger.warning("lost lock key %r: %s", entry.key, reason)

    async def _current_lease(self) -> int:
        lease = self._lease_id
        if lease is not None:
            return lease
        async with self._lease_lock:
            if self._lease_id is None:
                await self._grant(self._require_open())
            assert self._lease_id is not None
            return self._lease_id

    async def _grant(self, conn: EtcdConnection) -> None:
        sent = asyncio.get_running_loop().time()
        reply = await conn.grant(math.ceil(self._session_ttl))
        if reply.error:
            raise BackendError(f"{self.describe()}: lease grant refused: {reply.error}")
        self._lease_id = int(reply.ID)
        self._lease_ttl = int(reply.TTL)
        self._contact = sent
        self._leases += 1
        logger.info("etcd lease %x granted (ttl %d s) on %s", reply.ID, reply.TTL, self.describe())

    def _moved(self) -> None:
        """We talk to another member now: watches on the old one may never fire, so every
        waiter lists again and re-arms (the held keys' watches restart by themselves when
        the old channel closes)."""
        for entry in self._entries.values():
            entry.stale = True
        for waiter in self._waiters.values():
            self._disarm(waiter)
            waiter.wake()

    def _session_ended(self, lease: int | None, reason: str) -> None:
        """Every lock on ``lease`` is lost; waiters queue again on a new lease."""
        if lease is None or lease != self._lease_id:
            return
        self._lease_id = None
        logger.warning("etcd lease %x ended: %s", lease, reason)
        for entry in list(self._entries.values()):
            if entry.lease_id == lease and entry.held:
                self._mark_lost(entry, reason)
        for waiter in self._waiters.values():
            waiter.wake()
        if self._state == "open":
            # If it still lives, its keys must not block anyone: revoke it (deletes them).
            self._spawn(self._revoke(lease), "aiodlock-etcd-revoke", cleanup=True)

    async def _revoke(self, lease: int) -> None:
        conn = self._require_open()
        loop = asyncio.get_running_loop()
        until = loop.time() + self._lease_ttl + self._request_timeout
        while loop.time() < until:  # after that, it expired on its own
            try:
                await conn.revoke(lease)
                return
            except BackendError:
                await asyncio.sleep(_RETRY_PAUSE)

    async def _keeper(self) -> None:
        """Keep the lease alive: a keep-alive every ``ttl / 4``, again at once after a
        failure (on the next member)."""
        conn = self._require_open()
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._heartbeat):
                    await self._kick.wait()
            self._kick.clear()
            while (lease := self._lease_id) is not None:
                sent = loop.time()
                try:
                    left = await conn.keep_alive(lease, timeout=self._grace / 2)
                except BackendError as exc:
                    logger.debug("etcd keep-alive failed: %s", exc)
                    await asyncio.sleep(_RETRY_PAUSE)
                    continue
                if left <= 0:
                    self._session_ended(lease, "the etcd lease expired or was revoked")
                elif lease == self._lease_id:
                    self._contact = max(self._contact, sent)
                break

    async def _grace_watch(self) -> None:
        """Declare the lease lost once no keep-alive was answered for the grace."""
        loop = asyncio.get_running_loop()
        while True:
            delay = self._contact + self._grace - loop.time()
            if delay > 0 or self._lease_id is None:
                await asyncio.sleep(max(delay, self._heartbeat))
                continue
            self._session_ended(
                self._lease_id,
                f"no keep-alive answered for {self._grace:.3g} s "
                "(the lease may expire before we hear from etcd again)",
            )


_ASCEND: Final = 1  # RangeRequest.SortOrder.ASCEND
_CREATE: Final = 2  # RangeRequest.SortTarget.CREATE


def _range_request(
    key: bytes, *, prefix: bool = False, count_only: bool = False, serializable: bool = False
) -> Any:
    return rpc.RangeRequest(
        key=key,
        range_end=prefix_end(key) if prefix else b"",
        sort_order=_ASCEND if prefix else 0,
        sort_target=_CREATE if prefix else 0,
        count_only=count_only,
        serializable=serializable,
    )


def _credentials(options: Mapping[str, Any]) -> Any:
    """gRPC channel credentials for the TLS options, or None for plaintext."""
    files = {name: options.get(name) for name in ("ssl_ca", "ssl_cert", "ssl_key")}
    wanted = options.get("ssl")
    if wanted is False:
        if any(files.values()):
            raise ValueError("ssl=false contradicts the other ssl_ options: drop one of them")
        return None
    if not wanted and not any(files.values()):
        return None
    if files["ssl_key"] and not files["ssl_cert"]:
        raise ValueError("ssl_key needs ssl_cert (the client certificate it belongs to)")
    blobs: dict[str, bytes | None] = {}
    for name, path in files.items():
        if path is None:
            blobs[name] = None
            continue
        if not isinstance(path, str) or not path:
            raise TypeError(f"option {name} must be a non-empty str (a file path)")
        try:
            blobs[name] = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"etcd:// option {name}={path!r}: {exc}") from None
    cert, key = blobs["ssl_cert"], blobs["ssl_key"]
    if cert is not None and key is None:
        key = cert  # one PEM file holding the certificate and its key
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=blobs["ssl_ca"], private_key=key, certificate_chain=cert
    )


async def _never_fail(coro: Coroutine[Any, Any, None], name: str) -> None:
    """A TaskGroup child must not fail (that would cancel the task that opened the client)."""
    try:
        await coro
    except Exception:
        logger.exception("aiodlock etcd task %s failed", name)
