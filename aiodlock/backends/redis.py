"""The Redis backend: ``redis://``, ``rediss://`` (TLS) and ``unix:///path.sock?db=N``.

Every lock step is one Lua script (:mod:`._redis_scripts`), atomic on the server and one
round trip: acquire, release-if-owner, renew-if-owner (which never resurrects an expired
lease). Waiting is done by server wakeups, not by polling (:mod:`._redis_wakeup`).

**Keys.** A lock ``name`` in namespace ``ns`` owns keys that all start with the hash tag
``{ns:name}``, so each script touches a single slot and works on Redis Cluster. Names are
opaque: ``{``, ``}``, spaces and unicode are fine, because every suffix below is free of
``}`` -- the last ``}`` of a key always closes the name, so two names never share a key::

    {ns:name}               mutex: the owner, PX = lease
    {ns:name}:fence         fencing-token counter, INCR on every grant; the only key kept
                            forever (so tokens never restart), one small string per name
    {ns:name}:queue         fair mutex: LIST of waiting owners in arrival order
    {ns:name}:qdeadline     fair mutex: ZSET owner -> liveness deadline (server ms)
    {ns:name}:signal        mutex wakeup channel (BLPOP mode: token list;
                            ``:signal:<owner>`` for one fair waiter)
    {ns:name}:waiters       BLPOP mode: ZSET of the owners blocked on ``:signal``
    {ns:name}:writer        read-write lock: the writer, PX = lease
    {ns:name}:readers       read-write lock: ZSET reader owner -> lease expiry (server ms)
    {ns:name}:rw:signal     read-write wakeups (BLPOP mode: writers' token list)
    {ns:name}:rw:rsignal    BLPOP mode: the readers' token list
    {ns:name}:rw:waiters    BLPOP mode: ZSET of blocked readers and writers
    {ns:name}:sem           semaphore: ZSET permit owner -> lease expiry (server ms)
    {ns:name}:sem:signal    semaphore wakeups (BLPOP mode: token list)
    {ns:name}:sem:waiters   BLPOP mode: ZSET of the owners blocked on ``:sem:signal``

The mutex, the read-write lock and the semaphore of one name are independent families (as on
every backend), sharing only the fencing counter. Everything but ``:fence`` has a TTL or is
deleted when it empties.

**Waiting.** A refused attempt returns ``Busy(retry_after)`` with the blocking lease's
remaining time (+1 ms), so a crashed holder is replaced right after its key expires even
though nobody publishes anything. Otherwise the release script notifies: by pub/sub
(default; one connection per backend for all waiters) or by BLPOP signal lists
(``wakeup="blpop"``; one connection per waiting acquisition, and a token is pushed only while
the list's waiter registry says someone waits).

**Fair mode** (``locks.lock(name, fair=True)``) keeps a queue. A lock is granted only to the
head of the queue; each refused attempt is also the waiter's *heartbeat*, refreshing its
liveness deadline to now + ttl, and ``retry_after`` is at most ttl/3 so a live waiter never
misses its deadline. A waiter that stops trying (crashed, partitioned) is purged when its
deadline passes, so a dead process can stall the queue for one lease at most. A release wakes
only the new head (its owner id is the pub/sub payload): no thundering herd.

**Failures.** Every redis-py exception is translated to :class:`~aiodlock.BackendError` with
the driver's exception chained. redis-py's own retries are off: retrying a non-idempotent
acquire whose reply was lost would make us our own blocker; instead the core compensates
with release-if-owner, which the protocol makes safe. The password never appears in
``describe()``, ``repr()`` or messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Final

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from .._exceptions import BackendError, LockError, UnsupportedError
from .._validate import check_seconds
from . import _redis_scripts as lua
from ._protocol import Busy, Capability, Grant, Kind, LockSpec
from ._redis_wakeup import BlockingSignals, BlpopWaiter, PubSubHub, PubSubWaiter

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from .._url import ParsedURL

__all__ = ["RedisBackend"]

_DEFAULT_PORT: Final = 6379
_DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_DEFAULT_SOCKET_TIMEOUT: Final = 5.0
_DEFAULT_MAX_CONNECTIONS: Final = 2
_WAKEUP_MODES: Final = ("pubsub", "blpop")
_CLIENT_NAME: Final = "aiodlock"


class _Script:
    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


_MUTEX_ACQUIRE: Final = _Script(lua.MUTEX_ACQUIRE)
_MUTEX_RELEASE: Final = _Script(lua.MUTEX_RELEASE)
_MUTEX_RENEW: Final = _Script(lua.MUTEX_RENEW)
_READ_ACQUIRE: Final = _Script(lua.READ_ACQUIRE)
_WRITE_ACQUIRE: Final = _Script(lua.WRITE_ACQUIRE)
_READ_RELEASE: Final = _Script(lua.READ_RELEASE)
_WRITE_RELEASE: Final = _Script(lua.WRITE_RELEASE)
_SEM_ACQUIRE: Final = _Script(lua.SEM_ACQUIRE)
_SEM_RELEASE: Final = _Script(lua.SEM_RELEASE)
_ZSET_RENEW: Final = _Script(lua.ZSET_RENEW)
_FAIR_ACQUIRE: Final = _Script(lua.FAIR_ACQUIRE)
_FAIR_RELEASE: Final = _Script(lua.FAIR_RELEASE)
_SIGNAL_PUSH: Final = _Script(lua.SIGNAL_PUSH)
_WAIT_ARM: Final = _Script(lua.WAIT_ARM)
_WAIT_LEAVE: Final = _Script(lua.WAIT_LEAVE)
_ALL_SCRIPTS: Final = (
    _MUTEX_ACQUIRE,
    _MUTEX_RELEASE,
    _MUTEX_RENEW,
    _READ_ACQUIRE,
    _WRITE_ACQUIRE,
    _READ_RELEASE,
    _WRITE_RELEASE,
    _SEM_ACQUIRE,
    _SEM_RELEASE,
    _ZSET_RENEW,
    _FAIR_ACQUIRE,
    _FAIR_RELEASE,
    _SIGNAL_PUSH,
    _WAIT_ARM,
    _WAIT_LEAVE,
)


class _Keys:
    """The keys of one lock name, encoded once, grouped as each script takes them."""

    __slots__ = (
        "fair_acquire",
        "fair_release",
        "mutex",
        "mutex_acquire",
        "mutex_acquire_l",
        "mutex_release",
        "mutex_waiters",
        "read_acquire",
        "read_acquire_l",
        "read_release",
        "readers",
        "rsignal",
        "rw_signal",
        "rw_waiters",
        "sem",
        "sem_acquire",
        "sem_acquire_l",
        "sem_release",
        "sem_signal",
        "sem_waiters",
        "signal",
        "write_acquire",
        "write_acquire_l",
        "write_release",
        "writer",
    )

    def __init__(self, namespace: str, name: str) -> None:
        tag = f"{{{namespace}:{name}}}".encode("utf-8", "surrogatepass")
        fence = tag + b":fence"
        self.mutex = tag
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
        self.mutex_acquire = (tag, fence)
        self.mutex_release = (tag, self.signal, self.mutex_waiters)
        self.fair_acquire = (tag, fence, tag + b":queue", tag + b":qdeadline", self.signal)
        self.fair_release = (tag, tag + b":queue", tag + b":qdeadline", self.signal)
        self.read_acquire = (self.writer, fence, self.readers, self.rsignal, self.rw_waiters)
        self.write_acquire = (self.writer, fence, self.readers)
        self.read_release = (self.readers, self.rw_signal, self.rw_waiters)
        self.write_release = (self.writer, self.rw_signal, self.rsignal, self.rw_waiters)
        self.sem_acquire = (self.sem, fence)
        self.sem_release = (self.sem, self.sem_signal, self.sem_waiters)
        # BLPOP mode: acquire scripts also take the waiter registry and its lists, which a
        # granted waiter leaves in the same step (see _redis_scripts._LEAVE_ON_GRANT).
        self.mutex_acquire_l = (*self.mutex_acquire, self.mutex_waiters, self.signal)
        self.read_acquire_l = (*self.read_acquire, self.rw_signal)
        self.write_acquire_l = (*self.write_acquire, self.rw_waiters, self.rw_signal, self.rsignal)
        self.sem_acquire_l = (*self.sem_acquire, self.sem_waiters, self.sem_signal)


@functools.lru_cache(maxsize=4096)
def _keys_for(namespace: str, name: str) -> _Keys:
    # Bounded: an application locking millions of distinct names must not grow us forever.
    return _Keys(namespace, name)


def _lease_ms(ttl: float) -> int:
    # Round up: the server must never expire a lease before the client thinks it could.
    return max(1, math.ceil(ttl * 1000.0))


def _busy(ms: int) -> Busy:
    # -1: the blocking key has no TTL (not written by us); only a release can free it.
    if ms == -1:
        return Busy(None)
    # +1 ms so the retry lands after the expiry, never at it; never 0 or negative.
    return Busy(max(ms + 1, 1) / 1000.0)


class _ErrorMap:
    """``with``-block that turns driver exceptions into :class:`BackendError` (reusable)."""

    __slots__ = ("_action", "_limit", "_secret", "_where")

    def __init__(self, action: str, where: str, secret: str | None, limit: float) -> None:
        self._action = action
        self._where = where
        self._secret = secret
        self._limit = limit

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or isinstance(exc, LockError):
            return
        if isinstance(exc, RedisError | OSError):  # OSError includes TimeoutError
            detail = str(exc)
            if not detail and isinstance(exc, TimeoutError):
                detail = f"no reply within {self._limit} s"
            if self._secret:
                detail = detail.replace(self._secret, "***")
            raise BackendError(
                f"redis {self._action} failed on {self._where}: {type(exc).__name__}: {detail}"
            ) from exc


class _Deadlines:
    """Bounds every command by ``socket_timeout`` for ~0.2 us a call.

    ``asyncio.timeout`` costs ~6 us a call (a timer handle in the loop's heap, per command),
    which alone would be a tenth of the uncontended acquire+release budget. Instead each
    command notes its deadline in a dict, and one sweeper task (in the backend's TaskGroup)
    cancels the commands that overran, every ``limit / 4`` -- so a command is cut off between
    ``limit`` and ``1.25 * limit``. ``end()`` turns that cancellation into ``TimeoutError``
    exactly as ``asyncio.timeout`` would (``uncancel``), and lets any other one through.
    """

    __slots__ = ("_inflight", "_limit", "_overdue")

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._inflight: dict[asyncio.Task[Any], float] = {}
        self._overdue: set[asyncio.Task[Any]] = set()

    def start(self, task: asyncio.Task[Any], now: float) -> None:
        self._inflight[task] = now + self._limit

    def end(self, task: asyncio.Task[Any], exc: BaseException | None) -> None:
        """Forget ``task``'s command; raise ``TimeoutError`` if we cancelled it."""
        del self._inflight[task]
        if self._overdue and task in self._overdue:
            self._overdue.discard(task)
            if isinstance(exc, asyncio.CancelledError) and task.uncancel() == 0:
                raise TimeoutError(f"no reply within {self._limit} s") from None

    async def sweep(self) -> None:
        loop = asyncio.get_running_loop()
        period = self._limit / 4
        while True:
            # Housekeeping on a fixed period (not a lock poll): cheaper than a timer per call.
            await asyncio.sleep(period)
            now = loop.time()
            for task, deadline in list(self._inflight.items()):
                if deadline <= now and task not in self._overdue:
                    self._overdue.add(task)
                    task.cancel()


def _connection_settings(
    url: ParsedURL,
    options: Mapping[str, Any],
    connect_timeout: float,
) -> tuple[type[AbstractConnection], dict[str, Any]]:
    """redis-py connection class and keyword arguments for ``url`` (validated here)."""
    common: dict[str, Any] = {
        "username": url.username,
        "password": url.password,
        # No socket_timeout inside redis-py: with one set, every send goes through
        # asyncio.wait_for, which on Python 3.11 swallows a cancellation that arrives as the
        # send completes -- a cancelled acquire would carry on and take the lock. Commands
        # are bounded by _Deadlines instead (side connections by their own timers).
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout,
        # Retries off: see the module docstring (a replayed acquire could block ourselves).
        "retry": Retry(NoBackoff(), 0),
        # RESP2: plain arrays for pub/sub, no HELLO/maintenance-notification handshake.
        "protocol": 2,
        "decode_responses": False,
        "client_name": _CLIENT_NAME,
    }
    if url.scheme == "unix":
        if not url.path:
            raise ValueError("unix:// url needs a socket path: unix:///run/redis.sock?db=0")
        db_text = options.get("db", url.query.get("db", 0))
        common["db"] = _check_db(db_text)
        common["path"] = url.path
        return UnixDomainSocketConnection, common
    if len(url.hosts) > 1:
        raise ValueError(
            f"{url.scheme}:// takes one host, got {len(url.hosts)}; "
            "use redlock:// for several independent masters"
        )
    host, port = url.hosts[0] if url.hosts else ("localhost", None)
    path = url.path.strip("/")
    if path and options.get("db") is not None:
        raise ValueError("give the database either in the url path or as the db option")
    common["db"] = _check_db(path or options.get("db", url.query.get("db", 0)))
    common["host"] = host or "localhost"
    common["port"] = port or _DEFAULT_PORT
    common["socket_keepalive"] = True
    if url.scheme == "rediss":
        return SSLConnection, common
    return Connection, common


def _check_db(value: object) -> int:
    if isinstance(value, bool):
        raise TypeError("db must be an int")
    try:
        db = int(str(value))
    except ValueError:
        raise ValueError(f"the redis database must be a number >= 0, not {value!r}") from None
    if db < 0:
        raise ValueError(f"the redis database must be a number >= 0, not {db}")
    return db


class RedisBackend:
    """Locks on one Redis server (see the module docstring for keys, scripts and waiting).

    Options (URL query or keyword): ``wakeup`` (``"pubsub"`` default, or ``"blpop"``),
    ``connect_timeout`` (seconds, default 5; bounds connecting, AUTH and the first PING),
    ``socket_timeout`` (seconds, default 5; bounds each command), ``max_connections``
    (command connections, default 2: commands queue for a free one, so 1000 waiters cost 2
    command connections plus the one pub/sub connection; raise it for a high-latency link),
    and ``db`` (for ``unix://``; ``redis://host/N`` carries it in the path).

    Example::

        async with aiodlock.connect("redis://localhost:6379/0?wakeup=pubsub") as locks:
            async with locks.lock("order:42", ttl=10) as lease:
                print(lease.fencing_token)
    """

    queues_on_busy: ClassVar[bool] = False  # only fair locks queue, and spec.fair says so
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.EXCLUSIVE,
            Capability.SHARED,
            Capability.COUNTING,
            Capability.FAIR,
            Capability.FENCING,
            Capability.TTL_LEASE,
            Capability.SERVER_WAKEUP,
        }
    )
    options: ClassVar[Mapping[str, type]] = {
        "wakeup": str,
        "connect_timeout": float,
        "socket_timeout": float,
        "max_connections": int,
        "db": int,
    }

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        wakeup = options.get("wakeup")
        if wakeup is None:
            wakeup = "pubsub"
        if not isinstance(wakeup, str):
            raise TypeError(f"option wakeup must be a str, not {type(wakeup).__name__}")
        if wakeup not in _WAKEUP_MODES:
            raise ValueError(
                f"option wakeup must be one of {', '.join(map(repr, _WAKEUP_MODES))}, "
                f"not {wakeup!r}"
            )
        connect_timeout = _seconds(options, "connect_timeout", _DEFAULT_CONNECT_TIMEOUT)
        socket_timeout = _seconds(options, "socket_timeout", _DEFAULT_SOCKET_TIMEOUT)
        max_connections = options.get("max_connections")
        if max_connections is None:
            max_connections = _DEFAULT_MAX_CONNECTIONS
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise TypeError(
                f"option max_connections must be an int, not {type(max_connections).__name__}"
            )
        if max_connections < 1:
            raise ValueError(f"option max_connections must be >= 1, not {max_connections}")

        self._url = url
        self._where = url.redacted()
        self._wakeup = wakeup
        self._mode = "l" if wakeup == "blpop" else "p"
        self._connect_timeout = connect_timeout
        self._socket_timeout = socket_timeout
        self._max_connections = max_connections
        self._conn_class, self._conn_kwargs = _connection_settings(url, options, connect_timeout)
        self._client: aioredis.Redis | None = None
        self._slots = asyncio.Semaphore(max_connections)
        self._deadlines = _Deadlines(socket_timeout)
        self._tg: asyncio.TaskGroup | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._clock: Callable[[], float] = time.monotonic  # the loop's clock once open
        self._hub: PubSubHub | None = None
        self._signals: BlockingSignals | None = None
        self._closed = False
        self._errors = {
            action: _ErrorMap(
                action,
                self._where,
                url.password,
                connect_timeout if action == "connect" else socket_timeout,
            )
            for action in ("connect", "acquire", "release", "renew", "wakeup")
        }

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._client is not None else "new"
        return f"<RedisBackend {self._where} wakeup={self._wakeup} {state}>"

    # ---------------------------------------------------------------- lifetime

    async def open(self) -> None:
        """Connect and PING (bounded by ``connect_timeout``), load the scripts, start waking."""
        if self._client is not None or self._closed:
            raise RuntimeError("a RedisBackend is opened once")
        pool = aioredis.ConnectionPool(
            max_connections=self._max_connections,
            connection_class=self._conn_class,
            **self._conn_kwargs,
        )
        client = aioredis.Redis.from_pool(pool)
        try:
            with self._errors["connect"]:
                async with asyncio.timeout(self._connect_timeout):
                    await client.ping()
                    async with client.pipeline(transaction=False) as pipe:
                        for script in _ALL_SCRIPTS:
                            pipe.script_load(script.text)
                        await pipe.execute()
        except BaseException:
            await client.aclose()
            raise
        self._client = client
        self._clock = asyncio.get_running_loop().time
        self._tg = tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._sweeper = tg.create_task(self._deadlines.sweep())
        confirm = self._connect_timeout + self._socket_timeout
        if self._wakeup == "pubsub":
            self._hub = PubSubHub(
                self._side_connection(f"{_CLIENT_NAME}:pubsub"),
                connect_timeout=self._connect_timeout,
                confirm_timeout=confirm,
                where=self._where,
            )
            self._hub.start(tg.create_task)
        else:
            self._signals = BlockingSignals(
                self._side_connection(f"{_CLIENT_NAME}:blpop"),
                self,
                connect_timeout=self._connect_timeout,
                grace=self._socket_timeout,
                spawn=self._spawn,
                where=self._where,
            )

    async def aclose(self) -> None:
        """Close the pub/sub connection, its tasks, BLPOP connections and the pool.

        Idempotent. Waiters are woken and their next attempt fails with ``BackendError``;
        commands already in flight finish (within ``socket_timeout``) before the pool closes,
        so no connection is reopened behind our back.
        """
        if self._closed:
            return
        self._closed = True
        client, self._client = self._client, None
        if self._hub is not None:
            self._hub.close()
        idle: list[AbstractConnection] = []
        if self._signals is not None:
            idle = self._signals.close()
        if client is not None:
            # Holding every slot means no command is in flight (the sweeper still bounds them).
            for _ in range(self._max_connections):
                await self._slots.acquire()
            for _ in range(self._max_connections):
                self._slots.release()  # whoever still queues fails fast: _client is None
        if self._sweeper is not None:
            self._sweeper.cancel()
        tg, self._tg = self._tg, None
        if tg is not None:
            for conn in idle:
                tg.create_task(_quiet_disconnect(conn))
            # Every task in it ends on cancellation and never raises, so this is safe from
            # any task (a failing child would cancel the task that entered the group).
            await tg.__aexit__(None, None, None)
        if client is not None:
            await client.aclose()

    def _side_connection(self, name: str) -> Callable[[], AbstractConnection]:
        kwargs = {**self._conn_kwargs, "client_name": name}
        conn_class = self._conn_class

        def make() -> AbstractConnection:
            return conn_class(**kwargs)

        return make

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        # Background work belongs to our TaskGroup, never to a bare task; once closing,
        # nothing new starts.
        tg = self._tg
        if tg is None or self._closed:
            coro.close()
            return None
        return tg.create_task(coro)

    # BLPOP mode: the commands BlockingSignals needs (see _redis_wakeup.SignalCommands).

    async def _arm_waiter(self, registry: bytes, owner: str) -> None:
        with self._errors["wakeup"]:
            await self._eval(_WAIT_ARM, (registry,), owner, lua.WAITERS_TTL_MS)

    async def _leave_waiter(self, registry: bytes, lists: tuple[bytes, ...], owner: str) -> None:
        # Best effort: the registry's TTL bounds what a failed deregistration leaves.
        with contextlib.suppress(BackendError, RedisError, OSError):
            await self._eval(_WAIT_LEAVE, (registry, *lists), owner)

    async def _push_back(self, key: bytes, registry: bytes, cap: int) -> None:
        # Best effort: the waiters' caps bound what a lost token costs.
        with contextlib.suppress(BackendError, RedisError, OSError):
            await self._eval(_SIGNAL_PUSH, (key, registry), cap)

    # ---------------------------------------------------------------- protocol

    def check(self, spec: LockSpec) -> None:
        """Fairness is offered for the mutex only."""
        if spec.fair and spec.kind is not Kind.MUTEX:
            raise UnsupportedError(
                f"redis offers fair=True for locks.lock() only, not for {spec.kind.value} locks"
            )

    def describe(self) -> str:
        """The URL without its password."""
        return self._where

    def statistics(self) -> Mapping[str, Any]:
        """``pubsub_connections``, ``subscribed_channels``, ``waiters`` and friends."""
        stats: dict[str, Any] = {"wakeup": self._wakeup}
        if self._hub is not None:
            stats.update(self._hub.statistics())
        elif self._signals is not None:
            stats.update(self._signals.statistics())
        else:
            stats.update(pubsub_connections=0, subscribed_channels=0, waiters=0)
        return stats

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """One attempt; ``Busy.retry_after`` is the blocking lease's remaining time + 1 ms."""
        keys = _keys_for(spec.namespace, spec.name)
        ms = _lease_ms(ttl)
        kind = spec.kind
        signals = self._signals  # BLPOP mode: pass the keys a granted waiter leaves
        with self._errors["acquire"]:
            if kind is Kind.MUTEX:
                if spec.fair:
                    reply = await self._eval(
                        _FAIR_ACQUIRE, keys.fair_acquire, owner, ms, self._mode
                    )
                else:
                    mutex_keys = keys.mutex_acquire if signals is None else keys.mutex_acquire_l
                    reply = await self._eval(_MUTEX_ACQUIRE, mutex_keys, owner, ms)
            elif kind is Kind.READ:
                chain = "0"
                read_keys: tuple[bytes, ...] = keys.read_acquire
                if signals is not None:
                    read_keys = keys.read_acquire_l
                    if owner in signals.woken_readers:
                        # Woken by a token: if we get in, pass one on to the next reader.
                        signals.woken_readers.discard(owner)
                        chain = "1"
                reply = await self._eval(_READ_ACQUIRE, read_keys, owner, ms, chain)
            elif kind is Kind.WRITE:
                write_keys = keys.write_acquire if signals is None else keys.write_acquire_l
                reply = await self._eval(_WRITE_ACQUIRE, write_keys, owner, ms)
            else:
                sem_keys = keys.sem_acquire if signals is None else keys.sem_acquire_l
                reply = await self._eval(_SEM_ACQUIRE, sem_keys, owner, ms, spec.limit)
        if reply[0] == 1:
            return Grant(reply[1])
        return _busy(reply[1])

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Release-if-owner (also: leave the fair queue); notifies waiters."""
        keys = _keys_for(spec.namespace, spec.name)
        kind = spec.kind
        with self._errors["release"]:
            if kind is Kind.MUTEX:
                if spec.fair:
                    done = await self._eval(_FAIR_RELEASE, keys.fair_release, owner, self._mode)
                else:
                    done = await self._eval(_MUTEX_RELEASE, keys.mutex_release, owner, self._mode)
            elif kind is Kind.READ:
                done = await self._eval(_READ_RELEASE, keys.read_release, owner, self._mode)
            elif kind is Kind.WRITE:
                done = await self._eval(_WRITE_RELEASE, keys.write_release, owner, self._mode)
            else:
                done = await self._eval(
                    _SEM_RELEASE, keys.sem_release, owner, self._mode, spec.limit
                )
        return bool(done == 1)

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Compare-and-extend to ``ttl`` from now; ``False`` (nothing recreated) if not held."""
        keys = _keys_for(spec.namespace, spec.name)
        ms = _lease_ms(ttl)
        kind = spec.kind
        with self._errors["renew"]:
            if kind is Kind.MUTEX:
                done = await self._eval(_MUTEX_RENEW, (keys.mutex,), owner, ms)
            elif kind is Kind.WRITE:
                done = await self._eval(_MUTEX_RENEW, (keys.writer,), owner, ms)
            elif kind is Kind.READ:
                done = await self._eval(_ZSET_RENEW, (keys.readers,), owner, ms)
            else:
                done = await self._eval(_ZSET_RENEW, (keys.sem,), owner, ms)
        return bool(done == 1)

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """``None``: a Redis lease ends by expiry or deletion, which only ``renew`` can see."""
        return None

    def waiter(self, spec: LockSpec, owner: str) -> PubSubWaiter | BlpopWaiter:
        """Arm a wakeup for one waiting acquisition (see :mod:`._redis_wakeup`)."""
        self._require()
        keys = _keys_for(spec.namespace, spec.name)
        kind = spec.kind
        hub = self._hub
        if hub is not None:
            if kind is Kind.MUTEX:
                return hub.waiter(keys.signal, owner)
            if kind is Kind.SEMAPHORE:
                return hub.waiter(keys.sem_signal, owner)
            return hub.waiter(keys.rw_signal, owner)
        signals = self._signals
        assert signals is not None
        if kind is Kind.MUTEX:
            if spec.fair:
                own = keys.signal + b":" + owner.encode("utf-8", "surrogatepass")
                return signals.waiter(own, owner, registry=None)
            return signals.waiter(
                keys.signal, owner, registry=keys.mutex_waiters, lists=(keys.signal,)
            )
        if kind is Kind.SEMAPHORE:
            return signals.waiter(
                keys.sem_signal,
                owner,
                registry=keys.sem_waiters,
                lists=(keys.sem_signal,),
                cap=spec.limit,
            )
        rw_lists = (keys.rw_signal, keys.rsignal)
        if kind is Kind.READ:
            return signals.waiter(
                keys.rsignal, owner, registry=keys.rw_waiters, lists=rw_lists, reader=True
            )
        return signals.waiter(keys.rw_signal, owner, registry=keys.rw_waiters, lists=rw_lists)

    # ---------------------------------------------------------------- internals

    def _require(self) -> aioredis.Redis:
        client = self._client
        if client is None:
            state = "closed" if self._closed else "not open yet"
            raise BackendError(f"the redis backend for {self._where} is {state}")
        return client

    async def _eval(self, script: _Script, keys: tuple[bytes, ...], *args: Any) -> Any:
        if self._client is None:
            self._require()
        # At most max_connections commands in flight; the rest queue here, not in the pool
        # (whose own blocking mode costs every command a Condition round).
        async with self._slots:
            # Again once we have a slot: aclose() may have closed the pool meanwhile.
            client = self._client or self._require()
            task = asyncio.current_task()
            assert task is not None
            deadlines = self._deadlines
            deadlines.start(task, self._clock())
            error: BaseException | None = None
            try:
                try:
                    return await client.execute_command(  # type: ignore[no-untyped-call]
                        "EVALSHA", script.sha, len(keys), *keys, *args
                    )
                except NoScriptError:
                    # The server lost its script cache (restart, failover, SCRIPT FLUSH):
                    # nothing ran, so running it again is safe.
                    await client.script_load(script.text)
                    return await client.execute_command(  # type: ignore[no-untyped-call]
                        "EVALSHA", script.sha, len(keys), *keys, *args
                    )
            except BaseException as exc:
                error = exc
                raise
            finally:
                deadlines.end(task, error)


def _seconds(options: Mapping[str, Any], key: str, default: float) -> float:
    value = check_seconds(options.get(key), argument=key)
    return default if value is None else value


async def _quiet_disconnect(conn: AbstractConnection) -> None:
    # A broken socket may fail to close in many ways; it is being dropped anyway.
    with contextlib.suppress(Exception):
        await conn.disconnect(nowait=True)
