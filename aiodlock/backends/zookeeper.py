"""The ZooKeeper backend: ``zookeeper://host1:2181,host2:2181/chroot``.

A Curator-style lock recipe on aiozk's low-level session (hardened in :mod:`._zk_session`;
aiozk's own Lock/SharedLock recipes are not used — docs/zookeeper.md, "How it is built",
lists their bugs).

**Node layout.** Every lock name is a directory of *contenders*, one per lock family::

    <chroot>/<namespace>/<name>/mutex/_c_<uuid>-lock-0000000007
    <chroot>/<namespace>/<name>/rw/_c_<uuid>-read-0000000003      (read lock)
    <chroot>/<namespace>/<name>/rw/_c_<uuid>-writ-0000000004      (write lock)
    <chroot>/<namespace>/<name>/semaphore/_c_<uuid>-sema5-0000000001   (semaphore, limit 5)

Namespace and name are percent-encoded UTF-8 (only ``A-Z a-z 0-9 - _`` stay as they are; a
segment equal to ``zookeeper`` has its ``z`` encoded), so any name — ``/``, ``..``, ``{``,
unicode, 1024 bytes — is one valid znode name that never leaves its namespace, and distinct
names never share a directory. The directories are CONTAINER nodes (ZooKeeper ≥ 3.5.3): the
server deletes them once their last child is gone, so empty lock parents do not accumulate.
The contenders are EPHEMERAL_SEQUENTIAL nodes; the ``_c_<uuid>-`` prefix is Curator's
protected mode (see *Creating*). The three families of one name are independent locks.

**Granting** (one ``getChildren`` after our node exists; contenders ordered by sequence):

* mutex and write lock: ours is the first node; a waiter watches its immediate predecessor;
* read lock: no write node before ours (kazoo/Curator semantics: later writers do not count);
  a waiter watches the closest write node before it;
* semaphore of N: ours is among the first N; the first waiter (index N) watches the children
  of the directory, every later waiter its immediate predecessor, and a permit granted while
  a successor waits touches its own node (``setData``) so that successor moves up to become
  the first waiter. A release therefore wakes exactly the waiters it can unblock: no herd.
  The node's name carries its limit; a contender that finds a node with another limit ahead
  of it deletes its own and raises :class:`~aiodlock.LimitMismatchError` (see
  :func:`_evaluate`).

The queue of nodes is FIFO by construction, so FAIR is declared. As on every backend, the
waiting tasks of one client take turns for a mutex, a write lock or a semaphore, and only the
one whose turn it is has a node (see ``queues_on_busy``); while a task of ours holds a mutex,
the one whose turn it is waits without a node until that holder lets go (see
:meth:`ZooKeeperBackend._refused_here`). When the task whose turn it is gives up (cancelled,
timed out) while its node queues, the node passes to the next task of ours with its place in
the queue and its armed watch (see :meth:`ZooKeeperBackend._keep`); it is deleted only once no
task of ours wants the lock (the core says so: ``turns_ended``). ``fair=True`` gives every
task its own node, hence strict arrival order across all clients' tasks. A new attempt never
waits for our own pending deletions: a node being deleted merely queues ahead of it until it
is gone.
Watches use ``getData`` (no watch is left behind when the node is already gone, unlike
``exists``); a watch that finds its node gone wakes the waiter at once. Wakeups are banked
(level-triggered), and every waiter is woken to re-check after each reconnect and session
change, because server-side watches do not survive a connection.

**Fencing token** = the czxid of our contender node: a global, strictly increasing zxid, so
it keeps increasing when a container parent is reaped and the sequence numbers restart. An
exclusive grant (mutex, write lock, semaphore of 1) always has a larger token than every
earlier grant of that family; a shared grant's token (read lock, semaphore permit) is larger
than every earlier exclusive grant's, but permits that became grantable together may be
taken in either order. A node passed from task to task (see *Granting*) changes nothing at
the server — it is one contender that waited longer — and is never granted twice (only a
node never granted is passed on), so its token obeys the same rules.

**Creating** a contender is never resent behind our back. The create runs in a task of ours,
so a caller cancelled meanwhile does not lose its reply: giving up waits for it and deletes
the node by name. If the reply is lost with its connection (or times out), the node may or
may not exist: the next step lists the directory, finds nodes carrying our uuid, keeps the
one whose ``ephemeralOwner`` is our session and deletes any other (a duplicate, or a leftover
of an older session); ``release`` does the same sweep, in rounds of one listing per directory
for every entry that needs one. So no acquisition ever leaves an orphan that would block the
queue.

**Lease and session.** A grant lives as long as the session *and* the lease's renewals:

* ``renew`` is one ``getData`` on our node (also arming a watch on it): ``False`` if the node
  is gone or belongs to another session. A renewal missing for ``ttl`` (a hung keeper in a
  live process) deletes the node, as a TTL backend would expire the key.
* The session supervisor tracks the send time of the newest answered request
  (``contact``; the backend pings every ``grace / 3``). The server cannot expire the session
  before ``contact + session timeout``. A late ping proves nothing (under load it queues
  behind every request before it): the connection is dropped and reopened (on the next
  server of the ensemble) only after it has heard nothing at all for two thirds of the
  session timeout, so the session survives a hung server. When ``contact + suspended_grace`` passes
  without an answer — connection suspended, server paused, network cut — every held lease is
  declared lost, *before* the server can expire the session and hand the lock to someone
  else. A server "session expired" answer (LOST) loses them at once. Declared-lost nodes are deleted
  in the background (the janitor, once the connection is back in the same session); their
  ``release`` does not wait for it.
* The loss is pushed: :meth:`ZooKeeperBackend.loss_signal` is an :class:`asyncio.Event` per
  lease, set at that moment (also when a watch reports our node deleted), which the watchdog
  waits on, so the guarded body is cancelled with :class:`~aiodlock.LockLostError` at once,
  not at the next renewal; ``renew`` says ``False`` from then on too.

Waiters survive reconnects (their nodes live as long as the session) and re-queue with a new
node after a session loss. ``aclose`` closes the session, which deletes every node of ours.

**Failures.** Unreachable ensemble: :class:`~aiodlock.BackendError` within
``connect_timeout``. Every aiozk exception is translated to ``BackendError`` (chained).

Options (URL query or keyword): ``session_timeout`` (requested, default 10 s; the server
grants a value within its ``minSessionTimeout``/``maxSessionTimeout``), ``connect_timeout``
(default 5 s), ``suspended_grace`` (default half the granted session timeout, at most 0.9 of
it) and ``request_timeout`` (how long one request may wait for a connection and its reply,
default 10 s).

Example::

    async with aiodlock.connect("zookeeper://zk1:2181,zk2:2181,zk3:2181/apps") as locks:
        async with locks.lock("order:42", ttl=10) as lease:
            print(lease.fencing_token)   # the lock node's czxid
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import functools
import logging
import os
import re
import socket
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Coroutine, Mapping, Set
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from .._exceptions import BackendError, LimitMismatchError
from .._url import ParsedURL
from .._validate import check_seconds
from ._local_holders import LocalHolders
from ._no_tls import NO_TLS_OPTIONS, refuse_tls
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
from ._wakeup import BankedWakeup
from ._zk_session import (
    CONNECTED,
    EVENT_DELETED,
    LOST,
    SUSPENDED,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotConnected,
    ZKTransport,
)

__all__ = [
    "ZooKeeperBackend",
    "decode_segment",
    "encode_segment",
    "lock_directory",
    "namespace_path",
]

logger = logging.getLogger("aiodlock.zookeeper")

_DEFAULT_PORT: Final = 2181
_DEFAULT_SESSION_TIMEOUT: Final = 10.0
_DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_DEFAULT_REQUEST_TIMEOUT: Final = 10.0
_GRACE_FRACTION: Final = 0.5
_MAX_GRACE_FRACTION: Final = 0.9
_SILENCE_FRACTION: Final = 2 / 3
"""A connection silent for this fraction of the session timeout is given up (see _pinger)."""
_MIN_PING_TIMEOUT: Final = 0.05  # the shortest heartbeat
_RETAG_DELAY: Final = 0.1
"""A node taken over names its holder once held this long (see ZooKeeperBackend._retag)."""
_ENQUEUE_ATTEMPTS: Final = 6
_MIN_SERVER_VERSION: Final = (3, 5, 3)

_FAMILY: Final = {
    Kind.MUTEX: "mutex",
    Kind.READ: "rw",
    Kind.WRITE: "rw",
    Kind.SEMAPHORE: "semaphore",
}
_TAG: Final = {Kind.MUTEX: "lock", Kind.READ: "read", Kind.WRITE: "writ", Kind.SEMAPHORE: "sema"}
# "-<tag><limit>-<sequence>": only semaphore nodes carry a limit (nodes made before limits
# were recorded have none, and are not compared).
_CONTENDER: Final = re.compile(r"^_c_[0-9a-f]{32}-(lock|read|writ|sema)(\d*)-(\d{10})$")
_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_ANY_SESSION: Final = -1  # a create was sent while the session was changing: sweep any
_PROTECT_LENGTH: Final = len("_c_") + 32 + len("-")  # "_c_<uuid hex>-"


# ---------------------------------------------------------------------- layout


@functools.lru_cache(maxsize=4096)
def encode_segment(text: str) -> str:
    """One znode name for any string: percent-encoded UTF-8, injective, never ``.``/``..``."""
    raw = text.encode("utf-8", "surrogatepass")
    encoded = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)
    if encoded == "zookeeper":  # reserved at the root; "%7A" never appears otherwise
        encoded = "%7Aookeeper"
    return encoded


def namespace_path(root: str, namespace: str) -> str:
    """The directory of every lock of ``namespace`` (``root`` is the chroot, or ``""``)."""
    return f"{root}/{encode_segment(namespace)}"


def lock_directory(root: str, namespace: str, name: str, kind: Kind) -> str:
    """The directory holding the contenders of one lock family of ``name``."""
    return f"{namespace_path(root, namespace)}/{encode_segment(name)}/{_FAMILY[kind]}"


def _chroot(path: str) -> str:
    parts = [part for part in path.split("/") if part]
    for part in parts:
        if part in (".", "..") or "\x00" in part:
            raise ValueError(f"url has an invalid zookeeper chroot {path!r}")
    if parts and parts[0] == "zookeeper":
        raise ValueError("url chroot must not be under /zookeeper (reserved by ZooKeeper)")
    return "".join(f"/{part}" for part in parts)


def _seq(name: str) -> int:
    return int(name[-10:])


def decode_segment(segment: str) -> str:
    """The string :func:`encode_segment` made ``segment`` from."""
    return urllib.parse.unquote(segment, encoding="utf-8", errors="surrogatepass")


_KIND_OF_FAMILY: Final = {"mutex": Kind.MUTEX, "rw": Kind.READ, "semaphore": Kind.SEMAPHORE}


def _contenders(names: list[str]) -> list[tuple[int, str, int, str]]:
    """``(sequence, tag, limit, name)`` of each contender node, in queue order."""
    return sorted(
        (int(m.group(3)), m.group(1), int(m.group(2) or 0), name)
        for name in names
        if (m := _CONTENDER.match(name))
    )


def _holders(contenders: list[tuple[int, str, int, str]]) -> list[tuple[str, str]]:
    """``(tag, name)`` of the contenders granted now, by the rules of :func:`_evaluate`:
    the first node of a mutex or a writer; the readers before the first writer; the first N
    nodes of a semaphore of N."""
    if not contenders:
        return []
    _, tag, limit, _ = contenders[0]
    if tag == "read":
        readers = []
        for _, t, _, name in contenders:
            if t == "writ":
                break
            readers.append((t, name))
        return readers
    count = max(limit, 1) if tag == "sema" else 1
    return [(t, name) for _, t, _, name in contenders[:count]]


def _node_owner(data: bytes, session: int) -> str:
    """The owner written in a contender's data (``owner=...``), else its session id."""
    for word in data.decode("utf-8", "replace").split():
        if word.startswith("owner="):
            return word.removeprefix("owner=")
    return f"session {session:#x}"


def _turn_taking_mutex(entry: _Entry) -> bool:
    """A mutex whose tasks take turns (not fair: a fair waiter keeps its own node)."""
    return entry.kind is Kind.MUTEX and entry.list_on_create


def _holds(entry: _Entry) -> bool:
    return entry.held and entry.lost is None and not entry.gone


# ---------------------------------------------------------------------- state


class _ZKWaiter(BankedWakeup):
    """A waiting acquisition's wakeup: banked, armed on at most one watch at a time."""

    __slots__ = ("arm_error", "armed", "arming", "confirmed", "deleted", "touched")

    def __init__(self) -> None:
        super().__init__()
        self.armed: str | None = None  # path of the watch we are registered on
        self.confirmed: str | None = None  # ...once the server said it exists, watch set
        self.deleted: str | None = None  # the node watch that fired for a deletion (or found none)
        self.touched: str | None = None  # the node watch that fired for a change of data
        self.arming: asyncio.Task[None] | None = None  # the request arming it (see _arm)
        self.arm_error: BackendError | None = None  # how that request failed, for its caller

    async def wait(self, timeout: float | None) -> None:
        await self._consume(timeout)


class _Entry:
    """One acquisition (owner) of one lock family: its contender node and lease state."""

    __slots__ = (
        "abandoning",
        "behind_head",
        "create_error",
        "creating",
        "czxid",
        "directory",
        "gone",
        "held",
        "kept",
        "kind",
        "limit",
        "list_on_create",
        "listing",
        "lock",
        "lost",
        "lost_event",
        "name",
        "owner",
        "prefix",
        "protect",
        "reaper",
        "session_id",
        "stray_session",
        "tagged",
        "target",
        "target_children",
        "uncertain",
        "watching",
    )

    def __init__(self, directory: str, owner: str, spec: LockSpec) -> None:
        self.directory = directory
        self.owner = owner
        self.kind = spec.kind
        self.limit = spec.limit
        self.protect = f"_c_{uuid.uuid4().hex}-"
        limit = spec.limit if spec.kind is Kind.SEMAPHORE else ""
        self.prefix = f"{self.protect}{_TAG[spec.kind]}{limit}-"
        self.tagged = owner  # the owner our node's data names (see ZooKeeperBackend._retag)
        self.name: str | None = None  # our node's name, once known
        self.czxid = 0
        self.listing: list[str] | None = None  # the directory, read with our create
        # The tasks of one client take turns (one node per client at a time), so listing the
        # directory with each create saves a round trip per grant. Fair locks keep a node per
        # waiting task: under a storm of cancelled waiters that would be a listing per create.
        self.list_on_create = not spec.fair
        self.session_id: int | None = None  # the session that owns our node
        self.uncertain = False  # a create's outcome is unknown: adopt, do not create again
        self.creating: asyncio.Task[None] | None = None  # our create, until someone saw it end
        self.create_error: BaseException | None = None  # how it failed, for its caller
        self.stray_session: int | None = None  # session a node of ours may linger in
        self.held = False
        self.lost: str | None = None
        self.lost_event = LossSignal()
        self.lock = asyncio.Lock()
        self.reaper: asyncio.TimerHandle | None = None
        self.target: str | None = None  # what a waiter of ours must watch
        self.target_children = False
        self.behind_head = False  # the target is the head: its deletion makes us the head
        self.watching = False  # a data watch on our own (held) node is registered
        self.gone = False  # released or abandoned: no longer in the table
        self.abandoning: asyncio.Task[None] | None = None
        # Kept for the next task's turn (see ZooKeeperBackend._keep): the cancelled waiter's
        # wakeup, still armed on the node we wait for, with whatever it banked meanwhile.
        self.kept: _ZKWaiter | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.directory, self.owner)

    @property
    def path(self) -> str:
        assert self.name is not None
        return f"{self.directory}/{self.name}"


class _Sweep:
    """One listing of a directory that deletes the stray nodes of every entry that joined
    it (nodes with their uuid whose names are unknown: a create whose reply was lost)."""

    __slots__ = ("done", "prefixes", "wait")

    def __init__(self) -> None:
        self.prefixes: set[str] = set()
        self.wait = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


@dataclass(frozen=True, slots=True)
class _Verdict:
    granted: bool
    target: str | None = None  # path to watch (a node, or the directory for children)
    children: bool = False
    successor: bool = False  # some contender queues right behind us
    behind_head: bool = False  # exclusive, and only the node we watch is ahead of us
    conflict: int | None = None  # semaphore: the other limit of a contender ahead of us


def _evaluate(entry: _Entry, names: list[str], leaving: Set[str] = frozenset()) -> _Verdict:
    """Is ``entry`` granted given the directory's children, and if not, what to watch.

    ``leaving``: nodes of ours whose acquisitions gave up and are being deleted. They will
    never hold the lock, so our other entries queue as if they were gone already, instead of
    waiting a deletion, its watch event and a listing for each (a storm of cancellations
    makes long chains of them).
    """
    contenders = sorted(
        (int(m.group(3)), m.group(1), int(m.group(2) or 0), name)
        for name in names
        if (m := _CONTENDER.match(name)) and name not in leaving
    )
    index = next(i for i, (*_, name) in enumerate(contenders) if name == entry.name)
    successor = index + 1 < len(contenders)
    directory = entry.directory
    if entry.kind is Kind.READ:
        writers = [name for _, tag, _, name in contenders[:index] if tag == "writ"]
        if not writers:
            return _Verdict(True, successor=successor)
        return _Verdict(False, f"{directory}/{writers[-1]}")
    if entry.kind is Kind.SEMAPHORE:
        conflict = _other_limit(contenders[:index], entry.limit)
        if conflict is not None:
            return _Verdict(False, conflict=conflict)
        if index < entry.limit:
            return _Verdict(True, successor=successor)
        if index == entry.limit:
            return _Verdict(False, directory, children=True)
        return _Verdict(False, f"{directory}/{contenders[index - 1][3]}")
    if index == 0:
        return _Verdict(True, successor=successor)
    return _Verdict(False, f"{directory}/{contenders[index - 1][3]}", behind_head=index == 1)


def _other_limit(ahead: list[tuple[int, str, int, str]], limit: int) -> int | None:
    """The limit of a semaphore contender ahead of ours that differs from ``limit``, if any.

    Only nodes *ahead* count: they were all in the first listing after our node was created
    (the ones before us are committed first), and later listings only lose some, so a node
    that passes this check once passes it for good, and a granted node has only nodes of its
    own limit ahead. Every holder at any moment therefore shares the limit of the newest
    holder, and no more than that many hold. A node with another limit that queues *behind*
    ours is refused by its own check. The price: while a refused node is being deleted, a node
    behind it (even one of the right limit) is refused too.
    """
    for _, _, theirs, _ in ahead:
        if theirs and theirs != limit:  # 0: a node that records no limit
            return theirs
    return None


def _seconds(options: Mapping[str, Any], key: str, default: float | None) -> float | None:
    value = options.get(key)
    if value is None:
        return default
    return check_seconds(value, argument=key)


# ---------------------------------------------------------------------- the backend


class ZooKeeperBackend:
    """Locks on a ZooKeeper ensemble (see the module docstring for the recipe and options).

    Example::

        async with aiodlock.connect("zookeeper://127.0.0.1:2181/apps?session_timeout=6") as locks:
            async with locks.read_lock("catalog"):
                ...
    """

    # A refusal leaves a node in the queue, but this backend removes it itself whenever no
    # waiter claims it in the same step or the waiter is left by an error (see try_acquire
    # and waiter). So the core treats ZooKeeper as it does Redis: the tasks of one client
    # take turns for an exclusive lock, and only the one whose turn it is has a node — N
    # local waiters cost one node, and a storm of cancelled acquisitions stays in the process
    # (one node per task made 0-7 grants in 15 s under it). The node even outlives a
    # cancelled turn: the next task takes it over (turns_began/turns_ended, _keep), where
    # deleting it and queueing anew at the back made 24-35 grants in 10 s under a loaded
    # storm. ``fair=True`` (``spec.fair``) gives every task its own node: strict arrival
    # order across every client's tasks.
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
        "session_timeout": float,
        "connect_timeout": float,
        "suspended_grace": float,
        "request_timeout": float,
        **NO_TLS_OPTIONS,  # refused: aiozk has no TLS
    }

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        refuse_tls(url.scheme, options, "docs/zookeeper.md")
        if url.username or url.password:
            raise ValueError(
                f"{url.redacted()}: zookeeper:// URLs take no credentials "
                "(ZooKeeper authentication is not supported yet)"
            )
        if not url.hosts:
            raise ValueError("zookeeper:// url needs a host: zookeeper://h1:2181,h2:2181/chroot")
        self._url = url
        self._hosts = [(host or "localhost", port or _DEFAULT_PORT) for host, port in url.hosts]
        self._root = _chroot(url.path)
        session_timeout = _seconds(options, "session_timeout", _DEFAULT_SESSION_TIMEOUT)
        connect_timeout = _seconds(options, "connect_timeout", _DEFAULT_CONNECT_TIMEOUT)
        request_timeout = _seconds(options, "request_timeout", _DEFAULT_REQUEST_TIMEOUT)
        assert session_timeout is not None
        assert connect_timeout is not None
        assert request_timeout is not None
        self._session_timeout = session_timeout
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._grace_option = _seconds(options, "suspended_grace", None)
        self._grace = session_timeout * _GRACE_FRACTION
        self._node_data = f"{socket.gethostname()} pid={os.getpid()}"

        self._state = "new"
        self._transport: ZKTransport | None = None
        self._group: asyncio.TaskGroup | None = None
        self._leaving: dict[str, set[str]] = {}  # per directory: our nodes being deleted (unheld)
        self._tasks: set[asyncio.Task[None]] = set()  # ours (supervisor, cleanups)
        self._leaves: set[asyncio.Task[None]] = set()  # of them, nodes being left (settle)
        self._io_tasks: set[asyncio.Task[None]] = set()  # the transport's (repair, read loops)
        self._session_id: int | None = None
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._waiters: dict[tuple[str, str], _ZKWaiter] = {}
        # A mutex held by one of our acquisitions, and per directory the waiters it refused
        # without a node (see _refused_here): its release or loss wakes them.
        self._holders: LocalHolders[str, _Entry] = LocalHolders()
        self._refused: dict[str, set[tuple[str, str]]] = {}
        # Per directory whose lock our tasks take turns for (see turns_began): the queued
        # entry a cancelled turn left for the next task, with its node and place (see _keep).
        self._turning: set[str] = set()
        self._kept: dict[str, _Entry] = {}
        self._watches: dict[str, set[_ZKWaiter | _Entry]] = {}
        self._doomed: dict[tuple[str, str], _Entry] = {}
        self._sweeps: dict[str, _Sweep] = {}  # per directory: the round still taking entries
        self._sweepers: set[str] = set()  # directories whose sweeper task is running
        self._janitor: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._waiting = 0
        self._sessions = 0
        self._reconnects = 0
        self._losses = 0
        self._adopted = 0
        self._handed = 0

    # ------------------------------------------------------------------ lifetime

    async def open(self) -> None:
        """Connect and start a session; BackendError if no server answers in time."""
        if self._state != "new":
            raise RuntimeError(f"{self.describe()} backend was already opened")
        self._state = "opening"
        group = asyncio.TaskGroup()
        await group.__aenter__()
        self._group = group
        transport = ZKTransport(
            self._hosts,
            session_timeout=self._session_timeout,
            io_timeout=self._connect_timeout,
            spawn=self._spawn_io,
            on_state=self._on_state,
            on_event=self._on_event,
        )
        self._transport = transport
        try:
            await transport.start(self._connect_timeout)
            version = transport.server_version
            if version is not None and version < _MIN_SERVER_VERSION:
                raise BackendError(
                    f"{self.describe()} runs ZooKeeper {'.'.join(map(str, version))}; "
                    "aiodlock needs 3.5.3 or later (container nodes)"
                )
        except BaseException as exc:
            self._state = "closed"
            with contextlib.suppress(Exception):
                await transport.close()
            await self._stop_tasks()
            if isinstance(exc, TimeoutError):
                raise BackendError(
                    f"could not connect to {self.describe()} "
                    f"within {self._connect_timeout:g} s (connect_timeout)"
                ) from exc
            raise
        self._new_session(transport.session_id)
        self._state = "open"
        self._spawn(self._pinger(), "aiodlock-zk-pinger")
        self._spawn(self._grace_watch(), "aiodlock-zk-grace")

    async def aclose(self) -> None:
        """Close the session (the server deletes all our nodes) and stop every task."""
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
        transport = self._transport
        try:
            if transport is not None:
                await transport.close()
        finally:
            await self._stop_tasks()
            for waiter in self._waiters.values():
                waiter.wake()
            self._watches.clear()
            self._doomed.clear()
            self._holders.clear()
            self._refused.clear()
            self._kept.clear()  # their nodes went with the session
            self._state = "closed"

    async def _stop_tasks(self) -> None:
        for task in [*self._tasks, *self._io_tasks]:
            task.cancel()
        group, self._group = self._group, None
        if group is not None:
            await group.__aexit__(None, None, None)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._spawn_into(self._tasks, coro, name)

    def _spawn_io(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._spawn_into(self._io_tasks, coro, name)

    def _spawn_into(
        self, tasks: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None], name: str
    ) -> asyncio.Task[None]:
        group = self._group
        if group is None:
            coro.close()
            raise BackendError(f"{self.describe()} backend is closed")
        task = group.create_task(_never_fail(coro, name), name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        # Cancelled before it ever ran, the wrapper never awaited ``coro``: close it (a no-op
        # once it has finished), or Python warns that it was never awaited.
        task.add_done_callback(lambda _: coro.close())
        return task

    def _require_open(self) -> ZKTransport:
        if self._state != "open" or self._transport is None:
            raise BackendError(f"{self.describe()} backend is not open")
        return self._transport

    async def settle(self) -> None:
        """Wait for the queue nodes being left in the background: a node kept for a next
        turn that never came, an abandoned wait (:class:`~aiodlock.backends.Settler`). Each
        deletion is bounded by ``request_timeout`` and never waits for a lost connection (the
        janitor takes over)."""
        while self._leaves:
            await asyncio.wait(list(self._leaves))

    # ------------------------------------------------------------------ description

    def check(self, spec: LockSpec) -> None:
        """Every kind is supported (the FIFO queue makes ``fair=True`` a no-op)."""

    def describe(self) -> str:
        """The URL without credentials."""
        return self._url.redacted()

    def statistics(self) -> Mapping[str, Any]:
        """Session, connection and recipe counters; ``requests``: those the server answered,
        by kind (``create``, ``children``, ``get``, ``delete``, ``ping``...). ``kept``: queue
        nodes a cancelled turn left for the next task (counted in ``entries`` too);
        ``handed``: how often a task took such a node over."""
        transport = self._transport
        sid = transport.session_id if transport is not None else None
        return {
            "state": transport.state if transport is not None else self._state,
            "server": transport.server if transport is not None else None,
            "session_id": None if sid is None else f"{sid:#x}",
            "session_timeout": transport.negotiated_timeout if transport is not None else None,
            "suspended_grace": self._grace,
            "entries": len(self._entries) + len(self._kept),
            "kept": len(self._kept),
            "handed": self._handed,
            "held": sum(1 for e in self._entries.values() if e.held and e.lost is None),
            "waiters": self._waiting,
            "watches": sum(len(w) for w in self._watches.values()),
            "doomed": len(self._doomed),
            "sessions": self._sessions,
            "reconnects": self._reconnects,
            "losses": self._losses,
            "adopted": self._adopted,
            "requests": dict(transport.answered) if transport is not None else {},
        }

    # ------------------------------------------------------------------ operators

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern``, sorted by name.

        Lists the namespace's directories, and each family's contenders: the holders are the
        nodes the recipe grants (see :func:`_holders`), the rest wait. A holder's owner is in
        its node's data (``owner=...``); its token is its node's czxid, and the lock's
        fencing token the newest holder's. ``expires_in`` is ``None``: the lease lives as long
        as the holder's session.
        """
        transport = self._require_open()
        base = namespace_path(self._root, namespace)
        found: list[LockInfo] = []
        encoded = {decode_segment(e): e for e in await self._children(transport, base)}
        for name in sorted(n for n in encoded if fnmatch.fnmatchcase(n, pattern)):
            for family in ("mutex", "rw", "semaphore"):
                directory = f"{base}/{encoded[name]}/{family}"
                contenders = _contenders(await self._children(transport, directory))
                holders: list[HolderInfo] = []
                tokens: list[int] = []
                kind = _KIND_OF_FAMILY[family]
                for tag, node in _holders(contenders):
                    try:
                        data, stat = await transport.get(
                            f"{directory}/{node}", timeout=self._request_timeout
                        )
                    except NoNodeError:
                        continue  # released meanwhile
                    holders.append(HolderInfo(_node_owner(data, stat.ephemeral_owner), None))
                    tokens.append(stat.czxid)
                    if family == "rw":
                        kind = Kind.WRITE if tag == "writ" else Kind.READ
                if holders:
                    waiters = len(contenders) - len(holders)
                    found.append(LockInfo(name, kind, tuple(holders), max(tokens), waiters))
        return found

    async def break_lock(self, spec: LockSpec) -> int:
        """Delete the holders' nodes of ``spec``'s family (waiters keep their place). Each
        holder's watch on its node reports the deletion, so its lease is lost at once; the
        next grant is a node created later, so its token (czxid) is larger."""
        transport = self._require_open()
        directory = self._directory(spec)
        # Our server may not have applied a grant the leader committed a moment ago (another
        # session's, on another member of an ensemble): catch up before listing.
        with contextlib.suppress(NoNodeError):
            await transport.sync(directory, timeout=self._request_timeout)
        dropped = 0
        for _, node in _holders(_contenders(await self._children(transport, directory))):
            try:
                await transport.delete(f"{directory}/{node}", timeout=self._request_timeout)
            except NoNodeError:
                continue  # released meanwhile
            dropped += 1
        return dropped

    def _data_of(self, entry: _Entry) -> bytes:
        """A contender node's data: who made it, for operators (``inspect`` reads the owner)."""
        return f"aiodlock owner={entry.owner} {self._node_data}".encode()

    def _directory(self, spec: LockSpec) -> str:
        return lock_directory(self._root, spec.namespace, spec.name, spec.kind)

    # ------------------------------------------------------------------ protocol

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """Queue (once per owner) and check our place: Grant(czxid) or Busy(None)."""
        transport = self._require_open()
        directory = self._directory(spec)
        key = (directory, owner)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._take_kept(directory, owner, spec) or _Entry(directory, owner, spec)
            self._entries[key] = entry
        async with entry.lock:
            if entry.gone:  # left the queue meanwhile (not through the core): queue anew
                return await self.try_acquire(spec, owner, ttl)
            try:
                return await self._check(entry, spec, ttl, transport)
            except asyncio.CancelledError:
                # Cancelled with our node on its way or queued: the next task of ours to
                # take its turn gets it, place and all, instead of a new node at the back.
                self._keep(entry)
                raise

    async def _check(
        self, entry: _Entry, spec: LockSpec, ttl: float, transport: ZKTransport
    ) -> Grant | Busy:
        """The step of :meth:`try_acquire`, under the entry's lock."""
        if entry.held:
            if entry.lost is None:
                return Grant(entry.czxid)
            return Busy(None)
        if self._refused_here(entry):
            return Busy(None)
        known = self._known_place(entry, transport)
        if known is None and await self._rewatch(entry, transport):
            known = self._known_place(entry, transport)
        if known is not None:
            return self._grant(entry, ttl) if known else self._busy(entry)
        names = await self._enqueue(entry, transport)
        while entry.session_id != transport.session_id:
            # The session changed while the listing was on its way: queue again.
            names = await self._enqueue(entry, transport)
        verdict = _evaluate(entry, names, self._leaving.get(entry.directory, set()))
        if verdict.conflict is not None:
            await self._refuse(entry, transport)
            raise LimitMismatchError(spec.name, verdict.conflict, spec.limit)
        if verdict.granted:
            if verdict.successor and entry.kind is Kind.SEMAPHORE:
                grant = self._grant(entry, ttl)
                await self._poke(entry, transport)
                return grant
            return self._grant(entry, ttl)
        entry.target = verdict.target
        entry.target_children = verdict.children
        entry.behind_head = verdict.behind_head
        waiter = self._waiters.get(entry.key)
        if waiter is not None:
            await self._arm(waiter, entry, transport)
        return self._busy(entry)

    def _busy(self, entry: _Entry) -> Busy:
        """Refuse ``entry``, which queues on: its node stays only if a waiter claims it."""
        if entry.key not in self._waiters:
            # Lock.try_acquire() will not wait: unless waiter() is entered right away
            # (the core does so in the same step), our queue node must not stay.
            asyncio.get_running_loop().call_soon(self._drop_if_unwaited, entry)
        return Busy(None)

    def _grant(self, entry: _Entry, ttl: float) -> Grant:
        entry.held = True
        entry.target = None
        if _turn_taking_mutex(entry):
            self._holders.hold(entry.directory, entry)
        self._schedule_reaper(entry, ttl)
        if entry.kept is not None:  # granted before its next waiter came: nothing to wake
            self._disarm(entry.kept)
            entry.kept = None
        if entry.tagged != entry.owner:
            asyncio.get_running_loop().call_later(_RETAG_DELAY, self._retag_later, entry)
        return Grant(entry.czxid)

    def _refused_here(self, entry: _Entry) -> bool:
        """Refuse ``entry`` without a node while another acquisition of ours holds its mutex.

        The server would queue the node behind our holder's, and the create, the listing and
        the watch would all be answered during the holder's critical section: under the
        default event loop each reply wakes the loop, which rounds the rest of a ``sleep`` up
        to a whole millisecond. Refused here, the waiter is woken when our holder releases
        (or loses the lock), and its create follows the holder's delete on the same session,
        so the server applies the two in that order. Nodes of other clients created meanwhile
        are ahead of it, in their arrival order.
        """
        if not _turn_taking_mutex(entry) or self._at_server(entry):
            return False
        if not self._holders.held(entry.directory, alive=_holds):
            return False
        if entry.key in self._waiters:
            self._refused.setdefault(entry.directory, set()).add(entry.key)
        else:  # Lock.try_acquire() will not wait: nothing of it may stay (see try_acquire)
            asyncio.get_running_loop().call_soon(self._drop_if_unwaited, entry)
        return True

    def _unhold(self, entry: _Entry) -> None:
        """``entry`` no longer holds its mutex: wake the waiters it refused."""
        if not _turn_taking_mutex(entry):
            return
        self._holders.unhold(entry.directory, entry)
        for key in self._refused.pop(entry.directory, ()):
            waiter = self._waiters.get(key)
            if waiter is not None:
                waiter.wake()

    def _known_place(self, entry: _Entry, transport: ZKTransport) -> bool | None:
        """Our place in the queue when no listing can tell more, else None (list it).

        False: the watch on the node we wait for is set and has not fired — the server
        confirmed that node exists after our last listing, and any change since would have
        fired the watch (the core's re-check after arming asks exactly this). True: that node
        was the head, only it was ahead of us, and the server told us it was deleted — a node
        created later gets a higher sequence than ours, so we are the head now. The watch may
        be one a cancelled turn armed, which came with its node (see _keep): the first attempt
        of the task that took it over then asks nothing either.

        Not for semaphores: a waiter's place there also moves when nodes ahead of the one it
        watches leave (the first waiter's permit, handed on by a touch that may have come
        before the watch was set), so it lists.
        """
        waiter = self._placed(entry, transport)
        if waiter is None:
            return None
        target = entry.target
        if waiter.armed == target and waiter.confirmed == target:
            return False
        if entry.behind_head and waiter.deleted == target:
            waiter.deleted = None
            return True
        return None

    def _placed(self, entry: _Entry, transport: ZKTransport) -> _ZKWaiter | None:
        """The wakeup of an entry whose last listing still tells its place if its watch
        says nothing moved (see _known_place), else None."""
        waiter = self._waiters.get(entry.key) or entry.kept
        if (
            entry.kind is Kind.SEMAPHORE
            or waiter is None
            or entry.target is None
            or entry.name is None
            or entry.creating is not None
            or entry.uncertain
            or entry.stray_session is not None
            or entry.session_id != transport.session_id
        ):
            return None
        return waiter

    async def _rewatch(self, entry: _Entry, transport: ZKTransport) -> bool:
        """Finish arming the watch on the node we wait for (a cancelled turn's request, still
        on its way), or arm it again if it fired for a change of its data only (a holder that
        took its node over naming itself, see _retag): nobody left the queue, so our place is
        what the watch finds, without a listing. True if it did either."""
        waiter = self._placed(entry, transport)
        if waiter is None:
            return False
        target = entry.target
        pending = waiter.armed == target and waiter.arming is not None
        touched = waiter.armed is None and waiter.touched == target
        if not (pending or touched):
            return False
        await self._arm(waiter, entry, transport)
        return True

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Delete our node (and any stray one with our uuid); True if it was held."""
        if self._state != "open" or self._transport is None:
            return False
        key = (self._directory(spec), owner)
        entry = self._entries.get(key) or self._doomed.get(key)
        if entry is None:
            return False
        if entry.held and entry.lost is None and self._silent_past_grace():
            # The core's session deadline and our grace watch fall due in the same instant:
            # when the core's runs first, the lease is lost all the same (and a request on
            # the silent connection would only wait out its timeout).
            self._mark_lost(entry, self._silence_reason())
        if entry.lost is not None:
            # Lost: nobody waits for us to confirm, and the connection that lost it may be
            # silent. The janitor deletes the node (or the session ends with it).
            if not entry.gone:
                self._retire(entry)
                self._doomed[key] = entry
                self._kick_janitor()
            return False
        if entry.gone and self._doomed.get(key) is not entry:
            return False  # released already, or its node is being deleted
        # Held, queued, or left with its node still to delete (a release cancelled midway:
        # this is the compensating one, which finishes the job).
        async with entry.lock:
            held = entry.held and entry.lost is None and not entry.gone
            self._retire(entry)
            if held:
                await self._remove_nodes(entry, self._transport)
                return True
            # Only queued: nobody waits for us to confirm. If the connection is down the
            # janitor deletes the node when it is back (or the session ends with it).
            with contextlib.suppress(NotConnected):
                await self._remove_nodes(entry, self._transport, wait=False)
            return False

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Confirm our node exists in our live session; False once the lease is lost."""
        transport = self._require_open()
        entry = self._entries.get((self._directory(spec), owner))
        if entry is None or not entry.held or entry.gone or entry.lost is not None:
            return False
        if entry.session_id != transport.session_id:
            self._mark_lost(entry, "the zookeeper session ended", doom=False)
            return False
        path = entry.path
        if not entry.watching:
            self._watches.setdefault(path, set()).add(entry)
            entry.watching = True
        try:
            _, stat = await transport.get(
                path, watch=True, wait=False, timeout=self._heartbeat
            )
        except NoNodeError:
            self._mark_lost(entry, "its lock node was deleted", doom=False)
            return False
        if entry.lost_event.is_set():  # declared lost while we were asking
            return False
        if stat.ephemeral_owner != entry.session_id:
            self._mark_lost(entry, "its lock node belongs to another session", doom=False)
            return False
        self._schedule_reaper(entry, ttl)
        return True

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        """Arm the watch our last refused attempt chose; leaving by an error keeps our node
        for the next task's turn (see _keep), or drops it."""
        transport = self._require_open()
        key = (self._directory(spec), owner)
        entry = self._entries.get(key)
        # A node taken over from a cancelled turn comes with its armed wakeup.
        waiter = (entry.kept if entry is not None else None) or _ZKWaiter()
        if entry is not None:
            entry.kept = None
        self._waiters[key] = waiter  # before any await: see _drop_if_unwaited
        self._waiting += 1
        try:
            if entry is not None and not entry.held:
                await self._arm(waiter, entry, transport)
            yield waiter
        except BaseException:
            # Timed out, cancelled or failed while queued: our node must not stay behind,
            # unless another task of ours takes its turn next and keeps it. A deletion takes
            # a round trip; on a connection gone silent it is left to the background (and the
            # janitor) after a heartbeat rather than holding the caller.
            entry = self._entries.get(key)
            if entry is not None and not self._keep(entry):
                task = self._abandon(entry)
                if task is not None:
                    await asyncio.wait((task,), timeout=self._heartbeat)
            raise
        finally:
            self._keep_waiter(waiter, key)
            if self._waiters.get(key) is waiter:
                del self._waiters[key]
            refused = self._refused.get(key[0])
            if refused is not None:
                refused.discard(key)
                if not refused:
                    del self._refused[key[0]]
            self._waiting -= 1

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """An Event set the moment the held lease of ``owner`` is known to be lost.

        Session expired, grace timer run out, node deleted, or ttl passed without renewal.
        ``None`` if ``owner`` holds nothing here. The watchdog waits on it between renewals.
        """
        entry = self._entries.get((self._directory(spec), owner))
        if entry is None or not entry.held:
            return None
        return entry.lost_event

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """``contact + suspended_grace``: the server heard from our session no earlier than
        ``contact`` (the send time of the newest answered request), and the grace is shorter
        than the negotiated session timeout. With a ttl longer than the session (the defaults:
        30 s against 10 s), this is what keeps a paused holder from trusting its lease.
        ``None`` if ``owner`` holds nothing here."""
        entry = self._entries.get((self._directory(spec), owner))
        transport = self._transport
        if entry is None or not entry.held or transport is None:
            return None
        return transport.contact + self._grace

    # ------------------------------------------------------------------ queueing

    @property
    def _heartbeat(self) -> float:
        """How often the session is pinged; also how long a renewal may take."""
        return max(self._grace / 3, _MIN_PING_TIMEOUT)

    async def _children(
        self, transport: ZKTransport, directory: str, *, wait: bool = True
    ) -> list[str]:
        try:
            return await transport.children(directory, wait=wait, timeout=self._request_timeout)
        except NoNodeError:
            return []

    async def _enqueue(self, entry: _Entry, transport: ZKTransport) -> list[str]:
        """Make sure our node exists in the current session; return the directory listing."""
        for _ in range(_ENQUEUE_ATTEMPTS):
            if entry.name is not None and entry.creating is None:
                names = entry.listing
                entry.listing = None
                if names is None or entry.name not in names:
                    names = await self._children(transport, entry.directory)
                if entry.name in names and entry.session_id == transport.session_id:
                    await self._drop_strays(entry, transport, names)
                    return names
                entry.name = None  # deleted under us, or gone with an ended session
            if entry.uncertain and entry.creating is None:
                names = await self._children(transport, entry.directory)
                if await self._adopt(entry, transport, names):
                    return [n for n in names if n == entry.name or not n.startswith(entry.protect)]
            try:  # (a create still on its way, from a cancelled call, is waited for instead)
                await self._create(entry, transport)
            except ConnectionLoss:
                # The create may have happened: find it by our uuid once we are back,
                # instead of creating a second node that would block our own queue.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._request_timeout):
                        await transport.wait_connected()
        raise BackendError(
            f"could not queue for {entry.directory!r} on {self.describe()} "
            f"after {_ENQUEUE_ATTEMPTS} attempts"
        )

    async def _create(self, entry: _Entry, transport: ZKTransport) -> None:
        """Create our node (never resent), in a task of ours: a caller cancelled while the
        request is on its way does not lose the reply, so whoever removes the entry waits
        for it and deletes the node by name — no listing of the directory. Only a reply lost
        with its connection leaves the node unknown (``uncertain``: found by uuid later)."""
        task = entry.creating
        if task is None:
            task = self._spawn(self._create_node(entry, transport), "aiodlock-zk-create")
            entry.creating = task
        await self._created(entry)

    async def _created(self, entry: _Entry) -> None:
        """Wait for the entry's create to end (not cancelling it) and take its outcome."""
        task = entry.creating
        if task is None:
            return
        await asyncio.wait((task,))  # a cancelled caller leaves the create running
        entry.creating = None
        error, entry.create_error = entry.create_error, None
        if task.cancelled():  # the backend is closing
            raise BackendError(f"{self.describe()} backend was closed")
        if error is not None:
            raise error

    async def _create_node(self, entry: _Entry, transport: ZKTransport) -> None:
        base = f"{entry.directory}/{entry.prefix}"
        try:
            for _ in range(_ENQUEUE_ATTEMPTS):
                was_uncertain, stray = entry.uncertain, entry.stray_session
                # From here until the reply, a node of ours may exist that we cannot name.
                entry.uncertain = True
                sid = transport.session_id
                connected = transport.connected and sid is not None
                entry.stray_session = sid if connected else _ANY_SESSION
                try:
                    # Listed in the same round trip (see _enqueue), unless a fair lock's.
                    entry.tagged = entry.owner
                    created, stat, listing = await transport.create_listed(
                        base,
                        self._data_of(entry),
                        directory=entry.directory if entry.list_on_create else None,
                        timeout=self._request_timeout,
                    )
                except NotConnected:
                    entry.uncertain, entry.stray_session = was_uncertain, stray  # never sent
                    raise
                except NoNodeError:
                    entry.uncertain, entry.stray_session = was_uncertain, stray
                    await self._make_parents(entry.directory, transport)
                    continue
                entry.uncertain = False
                entry.stray_session = stray  # a clean create leaves no stray (earlier ones might)
                entry.name = created.rsplit("/", 1)[1]
                entry.czxid = stat.czxid
                entry.session_id = stat.ephemeral_owner
                entry.listing = listing
                return
            raise BackendError(f"could not create a node in {entry.directory!r}")
        except BackendError as exc:
            entry.create_error = exc

    async def _make_parents(self, directory: str, transport: ZKTransport) -> None:
        path = ""
        for part in directory.strip("/").split("/"):
            path = f"{path}/{part}"
            with contextlib.suppress(NodeExistsError):
                await transport.create(path, container=True, timeout=self._request_timeout)

    async def _adopt(self, entry: _Entry, transport: ZKTransport, names: list[str]) -> bool:
        """After an unknown create outcome: keep our node of this session, delete the rest."""
        mine = sorted((n for n in names if n.startswith(entry.protect)), key=_seq)
        kept = False
        for name in mine:
            path = f"{entry.directory}/{name}"
            try:
                _, stat = await transport.get(path, timeout=self._request_timeout)
            except NoNodeError:
                continue
            if not kept and stat.ephemeral_owner == transport.session_id:
                entry.name = name
                entry.czxid = stat.czxid
                entry.session_id = stat.ephemeral_owner
                kept = True
                self._adopted += 1
                continue
            with contextlib.suppress(NoNodeError):
                await transport.delete(path, timeout=self._request_timeout)
        entry.uncertain = False
        return kept

    async def _drop_strays(self, entry: _Entry, transport: ZKTransport, names: list[str]) -> None:
        """Delete nodes with our uuid that are not our node: a create that landed late, or
        our node of an ended session the server has not expired yet (it would queue ahead
        of us: we would wait for ourselves)."""
        for name in [n for n in names if n != entry.name and n.startswith(entry.protect)]:
            with contextlib.suppress(NoNodeError):
                await transport.delete(f"{entry.directory}/{name}", timeout=self._request_timeout)
            names.remove(name)

    async def _poke(self, entry: _Entry, transport: ZKTransport) -> None:
        """Touch our node so the waiter watching it re-checks (semaphore handover)."""
        entry.tagged = entry.owner  # (which also names its holder, see _retag)
        try:
            await transport.set(entry.path, self._data_of(entry), timeout=self._request_timeout)
        except NoNodeError:
            pass  # gone already: its deletion woke the successor
        except BackendError as exc:
            logger.debug("could not touch %s for its successor: %s", entry.path, exc)

    # ------------------------------------------------------------------ watches

    async def _arm(self, waiter: _ZKWaiter, entry: _Entry, transport: ZKTransport) -> None:
        """Register ``waiter`` on the watch ``entry``'s last check chose, then arm it.

        The request runs in a task of ours, as a create does: a caller cancelled while it is
        on its way leaves the watch arming, and the task that takes the node over (see _keep)
        waits for the same reply instead of asking again — under load, when a reply takes
        longer than an attempt lives, asking again would never get one.
        """
        target = entry.target
        if target is None:
            return
        if waiter.armed != target:
            self._disarm(waiter)
            self._watches.setdefault(target, set()).add(waiter)
            waiter.armed = target
            waiter.confirmed = waiter.deleted = waiter.touched = waiter.arm_error = None
            watch = self._set_watch(waiter, entry, target, transport)
            waiter.arming = self._spawn(watch, "aiodlock-zk-watch")
        task = waiter.arming
        if task is None:
            return  # armed before
        if not task.done():
            await asyncio.wait((task,))  # a cancelled caller leaves the request running
        if waiter.arming is task:
            waiter.arming = None
            error, waiter.arm_error = waiter.arm_error, None
            if error is not None:
                raise error

    async def _set_watch(
        self, waiter: _ZKWaiter, entry: _Entry, target: str, transport: ZKTransport
    ) -> None:
        """The request of :meth:`_arm`: what it finds goes to ``waiter`` (if it still arms
        that watch with this request)."""
        me = asyncio.current_task()
        try:
            if entry.target_children:
                names = await transport.children(
                    target, watch=True, timeout=self._request_timeout
                )
                if waiter.arming is me and self._moved(entry, names, target):
                    waiter.wake()  # changed since the check: check again at once
            else:
                await transport.get(target, watch=True, timeout=self._request_timeout)
                if waiter.arming is me and waiter.armed == target:  # (not fired meanwhile)
                    waiter.confirmed = target
        except NoNodeError:
            if waiter.arming is me:
                self._disarm(waiter)
                if not entry.target_children:
                    # Gone since our listing, as if its watch had fired (see _known_place).
                    waiter.deleted = target
                waiter.wake()  # already gone: that is the wakeup
        except (ConnectionLoss, NotConnected):
            # The connection dropped under the watch: check again, which waits for the
            # reconnection (the watch would not have survived it anyway).
            if waiter.arming is me:
                self._disarm(waiter)
                waiter.wake()
        except BackendError as exc:
            if waiter.arming is me:
                self._disarm(waiter)
                waiter.arm_error = exc

    def _moved(self, entry: _Entry, names: list[str], target: str) -> bool:
        """Whether a listing shows ``entry`` somewhere its last check did not leave it."""
        if entry.name not in names:
            return True
        verdict = _evaluate(entry, names, self._leaving.get(entry.directory, set()))
        return verdict.granted or verdict.target != target or verdict.conflict is not None

    def _disarm(self, waiter: _ZKWaiter) -> None:
        target, waiter.armed = waiter.armed, None
        if target is not None:
            registered = self._watches.get(target)
            if registered is not None:
                registered.discard(waiter)
                if not registered:
                    del self._watches[target]

    def _unwatch_held(self, entry: _Entry) -> None:
        if entry.watching and entry.name is not None:
            registered = self._watches.get(entry.path)
            if registered is not None:
                registered.discard(entry)
                if not registered:
                    del self._watches[entry.path]
        entry.watching = False

    def _on_event(self, event_type: int, path: str) -> None:
        """A node watch fired: server watches are one-shot, so every registration goes."""
        registered = self._watches.pop(path, None)
        if not registered:
            return
        for item in registered:
            if isinstance(item, _Entry):
                item.watching = False
                if event_type == EVENT_DELETED and item.held and item.lost is None:
                    self._mark_lost(item, "its lock node was deleted", doom=False)
            else:
                item.armed = None
                if event_type == EVENT_DELETED:
                    item.deleted = path
                else:
                    item.touched = path
                item.wake()

    def _reset_watches(self) -> None:
        """Server watches did not survive the connection: forget them, re-check everyone."""
        for registered in self._watches.values():
            for item in registered:
                if isinstance(item, _Entry):
                    item.watching = False
                else:
                    item.armed = None
        self._watches.clear()
        for waiter in self._waiters.values():
            waiter.wake()

    # ------------------------------------------------------------------ turns

    def turns_began(self, spec: LockSpec) -> None:
        """The core's TurnObserver: our tasks take turns for ``spec``'s lock from now on,
        so a cancelled turn may keep its node for the next one (see :meth:`_keep`)."""
        self._turning.add(self._directory(spec))

    def turns_ended(self, spec: LockSpec) -> None:
        """No task of ours wants ``spec``'s lock any more: a node kept for the next turn goes
        (in the background: an attempt made meanwhile queues as if it were gone already)."""
        directory = self._directory(spec)
        self._turning.discard(directory)
        kept = self._kept.pop(directory, None)
        if kept is not None:
            self._drop_kept(kept)

    def _keep(self, entry: _Entry) -> bool:
        """Keep the node of a cancelled, queued turn for the next task of ours; True if kept.

        The next task to take its turn (the core hands it on at once) takes the entry over in
        its first :meth:`try_acquire`, with its node, its place in the queue and its armed
        wakeup (see :meth:`_keep_waiter`): a cancellation then costs no request, where
        deleting the node and queueing a new one behind everybody else cost three round
        trips and the place — under a storm of cancelled attempts, nearly every grant.

        Safe because nothing changes at the server: a node handed on is, to ZooKeeper, one
        contender that waits longer; a node is never granted twice (only one never granted
        is kept), so its czxid stays a valid fencing token (see the module docstring). Kept
        only while our tasks take turns for the lock, and only if no other entry of ours
        queues in the directory: the next entry we make takes it over, so no entry of ours
        ever waits behind a kept node that nobody will take; when the turns end it is deleted.
        """
        directory = entry.directory
        if (
            self._state != "open"
            or directory not in self._turning
            or directory in self._kept
            or not entry.list_on_create  # a fair waiter keeps its own place in arrival order
            or entry.kind is Kind.READ
            or entry.held
            or entry.gone
            or entry.lost is not None
            or entry.abandoning is not None
            or not self._at_server(entry)
            or self._entries.get(entry.key) is not entry
            or any(
                self._queues_beside(entry, other)
                for other in self._entries.values()
                if other.directory == directory
            )
        ):
            return False
        self._remove_entry(entry)
        self._kept[directory] = entry
        return True

    @staticmethod
    def _queues_beside(entry: _Entry, other: _Entry) -> bool:
        """Whether ``other``, an entry of ours in ``entry``'s directory, waits in its queue."""
        return other is not entry and not other.held and other.abandoning is None

    def _keep_waiter(self, waiter: _ZKWaiter, key: tuple[str, str]) -> None:
        """``waiter`` leaves: if its node was kept, the wakeup goes with it, still armed on the
        node waited for (what it banks meanwhile is kept too); else it is disarmed."""
        kept = self._kept.get(key[0])
        if kept is not None and kept.owner == key[1] and kept.kept is None:
            kept.kept = waiter
        else:
            self._disarm(waiter)

    def _take_kept(self, directory: str, owner: str, spec: LockSpec) -> _Entry | None:
        """The entry a cancelled turn kept in ``directory``, now ``owner``'s; None if none
        fits (a fair lock or a reader queues on its own; another limit drops it)."""
        kept = self._kept.get(directory)
        if kept is None or spec.fair or kept.kind is not spec.kind:
            return None  # (a reader queues behind a kept writer, which the next turn takes)
        del self._kept[directory]
        if kept.limit != spec.limit:
            self._drop_kept(kept)  # ahead of ours, it would refuse our limit
            return None
        kept.owner = owner
        self._handed += 1
        return kept

    def _drop_kept(self, entry: _Entry) -> None:
        """Delete a kept node nobody takes over, in the background (see _abandon)."""
        if entry.kept is not None:
            self._disarm(entry.kept)
            entry.kept = None
        self._abandon(entry)

    def _remove_entry(self, entry: _Entry) -> None:
        """Take ``entry`` out of the table (nothing if it is not there)."""
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]

    def _retag_later(self, entry: _Entry) -> None:
        """Name the holder in its node's data if it still holds (see :meth:`_retag`)."""
        if self._state == "open" and _holds(entry) and entry.tagged != entry.owner:
            self._spawn(self._retag(entry), "aiodlock-zk-retag")

    async def _retag(self, entry: _Entry) -> None:
        """A node taken over names its first owner in its data: name the holder's, for
        operators (``inspect``). In the background, and only once the holder has held for
        ``_RETAG_DELAY``: the grant waits for nothing, and the touch (a request, and a
        wakeup and a request of the successor watching the node) is saved on the short
        holds of a storm of cancelled turns — where it cost a third of the throughput."""
        if entry.tagged == entry.owner or not _holds(entry):
            return
        entry.tagged = entry.owner
        with contextlib.suppress(NoNodeError, BackendError):  # released, or lost: no one asks
            transport = self._require_open()
            await transport.set(entry.path, self._data_of(entry), timeout=self._request_timeout)

    # ------------------------------------------------------------------ leaving the queue

    def _retire(self, entry: _Entry) -> None:
        self._unhold(entry)
        entry.gone = True
        entry.held = False
        entry.target = None
        if entry.reaper is not None:
            entry.reaper.cancel()
            entry.reaper = None
        self._unwatch_held(entry)
        self._remove_entry(entry)
        if entry.kept is not None:
            self._disarm(entry.kept)
            entry.kept = None
        self._doomed.pop(entry.key, None)

    async def _remove_nodes(
        self, entry: _Entry, transport: ZKTransport, *, wait: bool = True
    ) -> None:
        """Delete our node and, after an unknown create outcome, any node with our uuid.

        If that cannot be done now, the entry is kept for the janitor, which retries when the
        connection is back in the same session (a node of an ended session is gone already).
        ``wait=False``: do not wait for a suspended connection to come back (NotConnected).
        """
        try:
            creating = entry.creating
            if creating is not None:
                if not wait and not creating.done() and not transport.connected:
                    raise NotConnected("not connected to zookeeper (connection suspended)")
                # Its reply names our node. A create that failed left the entry uncertain
                # (or, never sent, with nothing to delete).
                with contextlib.suppress(BackendError):
                    await self._created(entry)
            sid = transport.session_id
            if entry.name is not None and entry.session_id == sid:
                with contextlib.suppress(NoNodeError):
                    await transport.delete(entry.path, wait=wait, timeout=self._request_timeout)
            entry.name = None
            if entry.stray_session in (sid, _ANY_SESSION):
                await self._sweep(entry, transport, wait=wait)
            entry.uncertain = False
            entry.stray_session = None  # a stray of an ended session ended with it
        except BaseException:
            if self._state == "open":
                self._doomed[entry.key] = entry
            raise

    async def _sweep(self, entry: _Entry, transport: ZKTransport, *, wait: bool) -> None:
        """Delete every node carrying ``entry``'s uuid, found by listing its directory.

        Entries join the directory's next round: one listing serves all that joined before
        it started (a storm of cancelled creates would otherwise list the directory once per
        entry: entries times directory size). Raises if the round failed.
        """
        directory = entry.directory
        sweep = self._sweeps.get(directory)
        if sweep is None:
            sweep = self._sweeps[directory] = _Sweep()
            if directory not in self._sweepers:
                self._sweepers.add(directory)
                self._spawn(self._sweeper(directory, transport), "aiodlock-zk-sweeper")
        sweep.prefixes.add(entry.protect)
        sweep.wait = sweep.wait or wait
        await asyncio.shield(sweep.done)

    async def _sweeper(self, directory: str, transport: ZKTransport) -> None:
        """Run the rounds of one directory, one at a time, until no entry waits for one."""
        try:
            while (sweep := self._sweeps.pop(directory, None)) is not None:
                try:
                    names = await self._children(transport, directory, wait=sweep.wait)
                    strays = [n for n in names if n[:_PROTECT_LENGTH] in sweep.prefixes]
                    if strays:
                        paths = [f"{directory}/{name}" for name in strays]
                        await asyncio.gather(
                            *(self._delete(path, transport, wait=sweep.wait) for path in paths)
                        )
                except asyncio.CancelledError:
                    sweep.done.cancel()
                    raise
                except BaseException as exc:
                    sweep.done.set_exception(exc)
                else:
                    sweep.done.set_result(None)
        finally:
            self._sweepers.discard(directory)
            sweep = self._sweeps.pop(directory, None)
            if sweep is not None:  # closing: nobody will run it
                sweep.done.cancel()

    async def _delete(self, path: str, transport: ZKTransport, *, wait: bool) -> None:
        with contextlib.suppress(NoNodeError):
            await transport.delete(path, wait=wait, timeout=self._request_timeout)

    async def _refuse(self, entry: _Entry, transport: ZKTransport) -> None:
        """Leave the queue at once, under the entry's lock: a refused node (another
        semaphore limit ahead) must not stay behind to hold up the contenders after it."""
        self._retire(entry)
        with contextlib.suppress(BackendError):  # kept for the janitor
            await self._remove_nodes(entry, transport, wait=False)

    def _abandon(self, entry: _Entry) -> asyncio.Task[None] | None:
        """Leave the queue in the background (shielded from the caller's cancellation)."""
        if entry.gone:
            return None
        if entry.abandoning is not None:
            return entry.abandoning
        if self._state != "open":
            return None
        if not self._at_server(entry) and not entry.lock.locked():
            self._retire(entry)  # it only waited for its local turn: nothing to delete
            return None
        task = self._spawn(self._leave(entry), "aiodlock-zk-leave")
        entry.abandoning = task
        self._leaves.add(task)
        task.add_done_callback(self._leaves.discard)
        if entry.name is not None and not entry.held:
            self._note_leaving(entry.directory, entry.name, task)
        return task

    def _note_leaving(self, directory: str, name: str, task: asyncio.Task[None]) -> None:
        """Our node ``name`` is being deleted by ``task`` and will never hold the lock: our
        waiters that watch it move on now (see :func:`_evaluate`)."""
        leaving = self._leaving.setdefault(directory, set())
        leaving.add(name)

        def done(_: asyncio.Task[None]) -> None:
            leaving.discard(name)
            if not leaving and self._leaving.get(directory) is leaving:
                del self._leaving[directory]

        task.add_done_callback(done)
        for item in list(self._watches.get(f"{directory}/{name}", ())):
            if isinstance(item, _ZKWaiter):
                self._disarm(item)
                item.wake()

    async def _leave(self, entry: _Entry) -> None:
        transport = self._require_open()
        async with entry.lock:
            if entry.gone and self._doomed.get(entry.key) is not entry:
                return
            self._retire(entry)
            with contextlib.suppress(BackendError):  # kept for the janitor
                await self._remove_nodes(entry, transport, wait=False)

    @staticmethod
    def _at_server(entry: _Entry) -> bool:
        """Whether ``entry`` may have a node: created, being created, or lost in a reply."""
        return (
            entry.name is not None
            or entry.creating is not None
            or entry.uncertain
            or entry.stray_session is not None
        )

    def _drop_if_unwaited(self, entry: _Entry) -> None:
        if not entry.gone and not entry.held and entry.key not in self._waiters:
            self._abandon(entry)

    # ------------------------------------------------------------------ leases

    def _schedule_reaper(self, entry: _Entry, ttl: float) -> None:
        if entry.reaper is not None:
            entry.reaper.cancel()
        entry.reaper = asyncio.get_running_loop().call_later(ttl, self._reap, entry)

    def _reap(self, entry: _Entry) -> None:
        entry.reaper = None
        if entry.held and entry.lost is None and not entry.gone:
            self._mark_lost(entry, "it was not renewed within its ttl")

    def _mark_lost(self, entry: _Entry, reason: str, *, doom: bool = True) -> None:
        """The lease is over: renew says False from now on; our node goes when it can."""
        if entry.lost is not None:
            return
        entry.lost = reason
        self._unhold(entry)
        entry.lost_event.set()
        self._losses += 1
        if entry.reaper is not None:
            entry.reaper.cancel()
            entry.reaper = None
        logger.warning("lost lock node %s: %s", entry.directory, reason)
        transport = self._transport
        if doom and transport is not None and entry.session_id == transport.session_id:
            self._doomed[entry.key] = entry
            self._kick_janitor()

    def _kick_janitor(self) -> None:
        transport = self._transport
        if not self._doomed or self._state != "open" or transport is None:
            return
        if not transport.connected:
            return  # the reconnect kicks it again
        if self._janitor is None or self._janitor.done():
            self._janitor = self._spawn(self._clean_doomed(transport), "aiodlock-zk-janitor")

    async def _clean_doomed(self, transport: ZKTransport) -> None:
        """Remove the nodes of every doomed entry, all at once: known nodes are deleted by
        name, and the unknown ones (lost create replies) by one listing per directory."""
        sid = transport.session_id
        work = []
        for key, entry in list(self._doomed.items()):
            if (
                entry.creating is None
                and (entry.name is None or entry.session_id != sid)
                and entry.stray_session not in (sid, _ANY_SESSION)
            ):
                self._doomed.pop(key, None)  # nothing of it is left in this session
            else:
                work.append(self._clean_one(key, entry, transport))
        # Still unreachable: the next reconnect or ping retries what is left.
        await asyncio.gather(*work, return_exceptions=True)

    async def _clean_one(self, key: tuple[str, str], entry: _Entry, transport: ZKTransport) -> None:
        async with entry.lock:
            if self._doomed.get(key) is entry:
                await self._remove_nodes(entry, transport)
                self._doomed.pop(key, None)

    # ------------------------------------------------------------------ session supervisor

    def _on_state(self, old: str, new: str) -> None:
        """aiozk's session moved (called synchronously from the transport)."""
        if self._state != "open" or self._transport is None:
            return
        if new == CONNECTED:
            sid = self._transport.session_id
            if sid != self._session_id:
                self._new_session(sid)
            else:
                self._reconnects += 1
            self._reset_watches()
            self._kick.set()  # ping now (fresh contact), then clean up
        elif new == LOST:
            self._session_ended("the zookeeper session expired")
            self._reset_watches()
        elif new == SUSPENDED:
            logger.info("zookeeper connection suspended (%s)", self.describe())

    def _new_session(self, sid: int | None) -> None:
        if self._session_id is not None:
            self._session_ended("the zookeeper session ended")
        self._session_id = sid
        self._sessions += 1
        transport = self._transport
        if transport is not None:
            granted = transport.negotiated_timeout
            grace = granted * _GRACE_FRACTION
            if self._grace_option is not None:
                grace = min(self._grace_option, granted * _MAX_GRACE_FRACTION)
            self._grace = grace

    def _session_ended(self, reason: str) -> None:
        for entry in list(self._entries.values()):
            if entry.held and entry.lost is None:
                self._mark_lost(entry, reason, doom=False)
        self._doomed.clear()

    async def _pinger(self) -> None:
        """Keep the session alive and ``contact`` fresh; give up a connection gone silent.

        A ping goes out every ``suspended_grace / 3`` (and at once after a reconnection). Its
        reply may come late without anything being wrong: it queues behind every request
        sent before it, and under load (a cancellation storm) that took more than a second.
        So lateness proves nothing, and the connection is given up only when it has heard
        nothing at all — no reply to any request, no event — for two thirds of the
        negotiated session timeout (ZooKeeper's own client does the same): early enough to
        reach another server of the ensemble while the session still lives there, so that
        our waiters keep their places. (Held leases do not wait for that: the grace watch
        declares them lost after ``suspended_grace``.)
        """
        transport = self._require_open()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._heartbeat):
                    await self._kick.wait()
            self._kick.clear()
            if not transport.connected:
                continue
            limit = transport.negotiated_timeout * _SILENCE_FRACTION
            # Wait for the reply until the connection has been silent for ``limit``, counted
            # from the last thing it heard (not from this ping, which may go out up to a
            # heartbeat later): the time left to reach another server is what keeps the session.
            wait = max(limit - transport.silence(), _MIN_PING_TIMEOUT)
            try:
                await transport.ping(timeout=wait)
            except ConnectionLoss:
                if transport.connected and transport.silence() >= limit:
                    logger.info(
                        "nothing heard from zookeeper in %.3g s (2/3 of the session "
                        "timeout): reconnecting",
                        limit,
                    )
                    transport.drop_connection()
            except BackendError:
                pass
            self._kick_janitor()

    async def _grace_watch(self) -> None:
        """Declare every held lease lost once no answer came for ``suspended_grace``."""
        transport = self._require_open()
        loop = asyncio.get_running_loop()
        while True:
            transport.contact_changed.clear()
            delay = transport.contact + self._grace - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            held = [e for e in self._entries.values() if e.held and e.lost is None]
            for entry in held:
                self._mark_lost(entry, self._silence_reason())
            await transport.contact_changed.wait()

    def _silent_past_grace(self) -> bool:
        """Whether nothing was answered for ``suspended_grace``: held leases are lost."""
        transport = self._transport
        return (
            transport is not None
            and transport.contact + self._grace <= asyncio.get_running_loop().time()
        )

    def _silence_reason(self) -> str:
        return (
            f"no answer from zookeeper for {self._grace:.3g} s "
            "(the session may expire before we hear from it again)"
        )


async def _never_fail(coro: Coroutine[Any, Any, None], name: str) -> None:
    """A TaskGroup child must not fail (that would cancel the task that opened the client)."""
    try:
        await coro
    except Exception:
        logger.exception("aiodlock zookeeper task %s failed", name)
