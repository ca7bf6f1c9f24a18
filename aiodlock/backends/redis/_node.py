"""One Redis server as a :class:`~._source.ConnectionSource`: ``redis://``, ``rediss://``,
``unix://``.

:class:`NodeSource` owns the connection settings taken from the URL and the options (host and
port or socket path, TLS, database, username and password, timeouts, client name), the
redis-py client with its pool of command connections, the side connections handed to the
waiters, the deadlines that bound every command, and the translation of driver errors.

redis-py's own retries are off: retrying a non-idempotent acquire whose reply was lost would
make us our own blocker; instead the core compensates with release-if-owner, which the
protocol makes safe.

Each command slot keeps a client with a connection of its own (redis-py's single-connection
client), so a command takes no round through the pool (its lock, its bookkeeping and its check
that the connection has nothing unread cost about a third of a script's client time); the
scripts are sent straight on that connection (:func:`._scripts.run`). With an application's
pool (``redis_client=``), and behind Sentinel (see :mod:`._sentinel`), every command borrows
from the pool instead.

A command that finds a connection free runs inline, at no extra cost. Otherwise it queues, in
one of two lanes (:mod:`._slots`: :meth:`NodeSource.call_first` is served before
:meth:`NodeSource.call`), and a task that holds a connection runs the queued commands back to
back. A queued caller that gives up before its command starts leaves nothing to send; one that
gives up while its command is in flight leaves it to finish, because redis-py drops a
connection whose reply it stops reading, and under a storm of timeouts every command queued
behind it would then wait for reconnects.

**TLS** (``rediss://``) is redis-py's own: the ``ssl_*`` options are :class:`SSLConnection`'s
keyword arguments, passed on as they are, except that certificates and host names are always
checked unless the options say otherwise (redis-py before 6 did not check host names).

**A client of the application's** (``redis_client=``): its connection pool carries the
commands and the side connections are made from that pool's settings; :meth:`NodeSource.aclose`
leaves the pool open, for its owner to close.

Example::

    source = NodeSource(parse_url("rediss://:secret@cache.internal:6380/2"), {"max_connections": 4})
    await source.open()
    source.describe()  # "rediss://:***@cache.internal:6380/2"
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, TypeVar, TypeVarTuple

import redis.asyncio as aioredis
from redis.asyncio.connection import (
    Connection,
    RedisSSLContext,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..._exceptions import BackendError
from ..._validate import check_bool, check_seconds
from .._deadlines import Deadlines
from ._errors import ErrorMap
from ._slots import Slots, wait_outcome

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from ..._url import ParsedURL
    from ._source import Prepare

__all__ = ["TLS_OPTIONS", "NodeSource", "connection_defaults", "refuse_node_options"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_DEFAULT_PORT: Final = 6379
_DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_DEFAULT_SOCKET_TIMEOUT: Final = 5.0
_DEFAULT_MAX_CONNECTIONS: Final = 2
_CLIENT_NAME: Final = "aiodlock"
# rediss:// only. The names are redis-py's SSLConnection keyword arguments, passed on as given.
TLS_OPTIONS: Final[Mapping[str, type]] = {
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": str,
    "ssl_check_hostname": bool,
}
_CERT_REQS: Final = ("none", "optional", "required")


class NodeSource:
    """The connections to one Redis server (see the module docstring).

    Options: ``connect_timeout`` (seconds, default 5; bounds connecting, AUTH and the first
    PING), ``socket_timeout`` (seconds, default 5; bounds each command), ``max_connections``
    (command connections, default 2: commands queue for a free one), ``db`` (for
    ``unix://``; ``redis://host/N`` carries it in the path), the TLS options of ``rediss://``
    (:data:`TLS_OPTIONS`), and ``redis_client``: a ``redis.asyncio.Redis`` of the
    application's, whose pool carries the commands (the URL is then just ``redis://``).
    """

    options: ClassVar[Mapping[str, type]] = {
        "connect_timeout": float,
        "socket_timeout": float,
        "max_connections": int,
        "db": int,
        **TLS_OPTIONS,
        "redis_client": object,
    }

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
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

        self.connect_timeout: float = connect_timeout
        self.socket_timeout: float = socket_timeout
        self._max_connections = max_connections
        # The application's pool, if it gave us a client: used, never closed.
        self._given_pool: aioredis.ConnectionPool | None = None
        given = options.get("redis_client")
        if given is None:
            self._where = url.redacted()
            self._secret = url.password
            self._conn_class, self._conn_kwargs = self._connection_settings(
                url, options, connect_timeout
            )
        else:
            pool = self._given_pool = _given_pool(given, url, options)
            self._where = _pool_where(pool)
            self._secret = pool.connection_kwargs.get("password")
            self._conn_class = pool.connection_class
            self._conn_kwargs = _side_settings(pool, connect_timeout)
        self._client: aioredis.Redis | None = None
        # Clients of command slots that are free now, each with its own connection.
        self._spare: list[aioredis.Redis] = []
        self._closed = False
        self._slots: Slots[_Queued[Any]] = Slots(max_connections)
        self._deadlines = Deadlines(socket_timeout)
        self._clock: Callable[[], float] = time.monotonic  # the loop's clock once open
        self._tg: asyncio.TaskGroup | None = None
        self._errors: dict[str, ErrorMap] = {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._client is not None else "new"
        return f"<NodeSource {self._where} {state}>"

    # ---------------------------------------------------------------- lifetime

    async def open(self, prepare: Prepare | None = None) -> None:
        """Connect and PING, then ``prepare(client)``, all within ``connect_timeout``."""
        if self._client is not None or self._closed:
            raise RuntimeError("a NodeSource is opened once")
        client = self._new_client()
        try:
            with self.errors("connect"):
                async with asyncio.timeout(self.connect_timeout):
                    await client.ping()
                    if prepare is not None:
                        await prepare(client)
        except BaseException:
            await client.aclose()
            raise
        self._clock = asyncio.get_running_loop().time
        self._tg = tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._client = client

    async def aclose(self) -> None:
        """Refuse new commands, wait for those in flight (within ``socket_timeout``), close.

        Idempotent. Commands in flight finish before the pool closes, so no connection is
        reopened behind our back. The pool of a ``redis_client`` is left open.
        """
        if self._closed:
            return
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            # Every slot free means no command is in flight (their deadlines still bound
            # them); commands still queued fail fast on the way: _client is None.
            await self._slots.idle()
        spare, self._spare = self._spare, []
        for held in spare:
            await held.aclose()  # gives its connection back to the pool
        self._deadlines.close()
        tg, self._tg = self._tg, None
        if tg is not None:
            # Commands that outlived their callers have handed back their slots (so they are
            # done); none of them raises, so this is safe from any task (a failing child would
            # cancel the task that entered the group).
            await tg.__aexit__(None, None, None)
        if client is not None:
            await client.aclose()

    # ---------------------------------------------------------------- ConnectionSource

    @property
    def client(self) -> aioredis.Redis:
        """The command client; ``BackendError`` before :meth:`open` and once closed."""
        client = self._client
        if client is None:
            raise self._unavailable()
        return client

    async def call(
        self, fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]], *args: *_Ts
    ) -> _T:
        """``await fn(client, *args)`` on a free command connection, bounded in time."""
        return await self._call(False, fn, args)

    async def call_first(
        self, fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]], *args: *_Ts
    ) -> _T:
        """:meth:`call`, served before every :meth:`call` still waiting for a connection."""
        return await self._call(True, fn, args)

    def submit(
        self,
        fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]],
        *args: *_Ts,
        first: bool = False,
    ) -> asyncio.Future[_T]:
        """Queue ``fn(client, *args)`` as :meth:`call` (``first``: :meth:`call_first`) would,
        but always run it in a task of ours, even if a connection is free now; return the
        future of its outcome at once. Cancelling that future before the command starts
        withdraws it; once started, it runs to its end."""
        outcome: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        tg = self._tg
        if self._client is None or tg is None:
            outcome.set_exception(self._unavailable())
            return outcome
        slots = self._slots
        free = slots.take()
        slots.push(_Queued(fn, args, outcome), outcome, first=first)
        if free:
            tg.create_task(self._run_queued())  # it holds the slot we took
        return outcome

    async def _call(
        self,
        first: bool,
        fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]],
        args: tuple[*_Ts],
    ) -> _T:
        client = self._client
        if client is None:
            raise self._unavailable()
        # At most max_connections commands in flight; the rest queue here, not in the pool
        # (whose own blocking mode costs every command a Condition round).
        slots = self._slots
        if slots.take():
            # The common case: a connection is free, the command runs inline.
            held = self._take_held(client)
            try:
                return await self._bounded(held, fn, args)
            finally:
                if held is not client:
                    self._spare.append(held)
                self._hand_on()
        # Queued: a task holding a slot runs it (see _run_queued) and hands us the outcome.
        # If we stop waiting before it starts, it is never sent; once it has started, it
        # finishes without us: redis-py drops a connection whose reply its reader stops
        # waiting for, and under a storm of timeouts every command queued behind ours would
        # then wait for reconnects.
        outcome: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        slots.push(_Queued(fn, args, outcome), outcome, first=first)
        return await wait_outcome(outcome)

    def _hand_on(self) -> None:
        # The holder of a slot is done: the next queued command gets the slot, in a task
        # that runs queued commands back to back for as long as there are any.
        tg = self._tg
        if tg is not None and self._slots.queued():
            tg.create_task(self._run_queued())
        else:
            self._slots.give_back()

    async def _run_queued(self) -> None:
        # A child of our TaskGroup holding one slot: it raises nothing but its own
        # cancellation, handing every other outcome to the caller (if still waiting).
        slots = self._slots
        held: aioredis.Redis | None = None
        try:
            while (queued := slots.pop()) is not None:
                outcome = queued.outcome
                client = self._client
                if client is None:
                    outcome.set_exception(self._unavailable())
                    continue
                if held is None:
                    held = self._take_held(client)
                try:
                    result = await self._bounded(held, queued.fn, queued.args)
                except Exception as exc:
                    if not outcome.done():
                        outcome.set_exception(exc)
                except BaseException:
                    outcome.cancel()
                    raise
                else:
                    if not outcome.done():
                        outcome.set_result(result)
        finally:
            if held is not None and held is not self._client:
                self._spare.append(held)  # aclose() closes it once every slot is back
            slots.give_back()

    async def _bounded(
        self,
        client: aioredis.Redis,
        fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]],
        args: tuple[*_Ts],
    ) -> _T:
        task = asyncio.current_task()
        assert task is not None
        deadlines = self._deadlines
        deadlines.start(task, self._clock())
        error: BaseException | None = None
        try:
            conn = getattr(client, "connection", None)  # a slot's own (RedisCluster: none)
            if conn is not None and _closed_by_server(conn):
                await conn.disconnect()  # the command connects it again
            return await fn(client, *args)
        except BaseException as exc:
            error = exc
            raise
        finally:
            deadlines.end(task, error)

    async def scan_iter(self, match: str) -> AsyncIterator[bytes]:
        """Every key matching ``match``: ``SCAN`` page by page, each page a bounded command."""
        cursor: int = 0
        while True:
            with self.errors("inspect"):
                cursor, keys = await self.call(_scan_page, cursor, match)
            for key in keys:
                yield key if isinstance(key, bytes) else str(key).encode()
            if cursor == 0:
                return

    def errors(self, action: str) -> ErrorMap:
        """Driver errors -> ``BackendError`` for ``action`` (see :mod:`._errors`)."""
        errors = self._errors.get(action)
        if errors is None:
            limit = self.connect_timeout if action == "connect" else self.socket_timeout
            errors = self._errors[action] = ErrorMap(action, self._where, self._secret, limit)
        return errors

    def route(self, key: bytes) -> str:
        """``""``: one server holds every key."""
        return ""

    def new_connection(self, purpose: str, route: str = "") -> AbstractConnection:
        """A side connection with the pool's settings, named ``aiodlock:<purpose>``."""
        name = f"{_CLIENT_NAME}:{purpose}"
        return self._conn_class(**{**self._side_kwargs(), "client_name": name})

    # ---------------------------------------------------------------- for another topology

    def _connection_settings(
        self, url: ParsedURL, options: Mapping[str, Any], connect_timeout: float
    ) -> tuple[type[AbstractConnection], dict[str, Any]]:
        """The connection class and its keyword arguments for ``url`` (validated now)."""
        return _connection_settings(url, options, connect_timeout)

    def _take_held(self, shared: aioredis.Redis) -> aioredis.Redis:
        """A command slot's client: a spare one, or a new one (:meth:`_command_client`)."""
        return self._spare.pop() if self._spare else self._command_client(shared)

    def _command_client(self, shared: aioredis.Redis) -> aioredis.Redis:
        """The client a command slot keeps: one with a connection of its own from our pool
        (made on its first command), or ``shared`` itself on an application's pool."""
        if self._given_pool is not None:
            return shared
        return aioredis.Redis(connection_pool=shared.connection_pool, single_connection_client=True)

    def _new_client(self) -> aioredis.Redis:
        """The command client (made at :meth:`open`); closing it closes what it owns."""
        if self._given_pool is not None:
            # A client of our own on the application's pool: closing it leaves the pool open.
            return aioredis.Redis(connection_pool=self._given_pool)
        return aioredis.Redis.from_pool(self._new_pool())  # closing it closes the pool

    def _new_pool(self) -> aioredis.ConnectionPool:
        """The pool of command connections (made at :meth:`open`)."""
        return aioredis.ConnectionPool(
            max_connections=self._pool_size(),
            connection_class=self._conn_class,
            **self._conn_kwargs,
        )

    def _pool_size(self) -> int:
        # A slot keeps its connection; a pipeline (wait_replicas) borrows one more meanwhile.
        return 2 * self._max_connections

    def _side_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of a side connection (before its client name)."""
        return self._conn_kwargs

    def describe(self) -> str:
        """The URL without its password."""
        return self._where

    def _unavailable(self) -> BackendError:
        state = "closed" if self._closed else "not open yet"
        return BackendError(f"the redis backend for {self._where} is {state}")


_SCAN_COUNT: Final = 1000


def _closed_by_server(conn: AbstractConnection) -> bool:
    """Whether the server has closed ``conn`` (a restart, a failover, ``CLIENT KILL``, its
    idle ``timeout``), as far as the loop has read already: no round trip. A command written
    to it would fail though nothing is wrong; redis-py's pool makes the same check as it
    lends a connection, which a slot's own connection never goes back to."""
    reader = getattr(conn, "_reader", None)
    return isinstance(reader, asyncio.StreamReader) and reader.at_eof()


async def _scan_page(client: aioredis.Redis, cursor: int, match: str) -> tuple[int, list[Any]]:
    next_cursor, keys = await client.scan(cursor, match=match, count=_SCAN_COUNT)
    return int(next_cursor), list(keys)


class _Queued(Generic[_T]):
    """A command waiting for a connection, and where its outcome goes."""

    __slots__ = ("args", "fn", "outcome")

    def __init__(
        self,
        fn: Callable[[aioredis.Redis, *tuple[Any, ...]], Awaitable[_T]],
        args: tuple[Any, ...],
        outcome: asyncio.Future[_T],
    ) -> None:
        self.fn = fn
        self.args = args
        self.outcome = outcome


def _connection_settings(
    url: ParsedURL,
    options: Mapping[str, Any],
    connect_timeout: float,
) -> tuple[type[AbstractConnection], dict[str, Any]]:
    """redis-py connection class and keyword arguments for ``url`` (validated here)."""
    _refuse_tls_options(url, options)
    if url.scheme == "unix":
        if not url.path:
            raise ValueError("unix:// url needs a socket path: unix:///run/redis.sock?db=0")
        common = connection_defaults(
            url, connect_timeout, db=options.get("db", url.query.get("db", 0))
        )
        common["path"] = url.path
        return UnixDomainSocketConnection, common
    if len(url.hosts) > 1:
        raise ValueError(
            f"{url.scheme}:// takes one host, got {len(url.hosts)}; for several hosts use "
            "redis+sentinel://h1:26379,h2:26379/SERVICE_NAME (Redis Sentinel) or "
            "redis+cluster://h1:7000,h2:7000 (Redis Cluster)"
        )
    host, port = url.hosts[0] if url.hosts else ("localhost", None)
    path = url.path.strip("/")
    if path and options.get("db") is not None:
        raise ValueError("give the database either in the url path or as the db option")
    common = connection_defaults(
        url, connect_timeout, db=path or options.get("db", url.query.get("db", 0))
    )
    common["host"] = host or "localhost"
    common["port"] = port or _DEFAULT_PORT
    common["socket_keepalive"] = True
    if url.scheme == "rediss":
        return SSLConnection, {**common, **_tls_settings(options)}
    return Connection, common


def connection_defaults(url: ParsedURL, connect_timeout: float, *, db: object) -> dict[str, Any]:
    """The keyword arguments every command connection of ours gets, whatever the topology:
    the credentials of ``url``, the database ``db`` (checked), and no retries or timeouts of
    redis-py's own."""
    return {
        "username": url.username,
        "password": url.password,
        # No socket_timeout inside redis-py: with one set, every send goes through
        # asyncio.wait_for, which on Python 3.11 swallows a cancellation that arrives as the
        # send completes -- a cancelled acquire would carry on and take the lock. Commands
        # are bounded by Deadlines instead (side connections by their users' own timers).
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout,
        # Retries off: see the module docstring (a replayed acquire could block ourselves).
        "retry": Retry(NoBackoff(), 0),
        # RESP2: plain arrays for pub/sub, no HELLO/maintenance-notification handshake.
        "protocol": 2,
        "decode_responses": False,
        "client_name": _CLIENT_NAME,
        "db": _check_db(db),
    }


def _tls_settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """SSLConnection's keyword arguments from the TLS options, checked now, not at connect.

    Certificates and host names are checked unless the options say otherwise: redis-py's own
    defaults differ between versions (before 6 it did not check host names).
    """
    settings: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        value = options.get(key)
        if value is not None:
            if not isinstance(value, str | os.PathLike):
                raise TypeError(f"option {key} must be a file path, not {type(value).__name__}")
            path = settings[key] = os.fspath(value)
            # Now rather than as "No such file or directory" at connect, which names no file.
            if not os.path.isfile(path):
                raise ValueError(f"option {key}: no such file: {path!r}")
    if "ssl_keyfile" in settings and "ssl_certfile" not in settings:
        raise ValueError("option ssl_keyfile needs ssl_certfile (the client certificate)")
    reqs = options.get("ssl_cert_reqs")
    if reqs is not None:
        if reqs not in _CERT_REQS:
            raise ValueError(
                f"option ssl_cert_reqs must be one of {', '.join(map(repr, _CERT_REQS))}, "
                f"not {reqs!r}"
            )
        settings["ssl_cert_reqs"] = reqs
    check = options.get("ssl_check_hostname")
    if check is not None:
        settings["ssl_check_hostname"] = check_bool(check, argument="option ssl_check_hostname")
    try:  # what SSLConnection builds from them, so its own checks run now, not at connect
        RedisSSLContext(
            keyfile=settings.get("ssl_keyfile"),
            certfile=settings.get("ssl_certfile"),
            cert_reqs=settings["ssl_cert_reqs"],
            ca_certs=settings.get("ssl_ca_certs"),
            check_hostname=settings["ssl_check_hostname"],
        )
    except RedisError as exc:
        raise ValueError(f"bad TLS options: {exc}") from None
    return settings


def refuse_node_options(url: ParsedURL, options: Mapping[str, Any], why: str) -> None:
    """``ValueError`` for the one-node options a deployment of several cannot take
    (``redis_client``, ``db``, the TLS ones), saying ``why``."""
    given = sorted(
        key for key in ("redis_client", "db", *TLS_OPTIONS) if options.get(key) is not None
    )
    if given:
        raise ValueError(
            f"option {', '.join(given)} is not supported on {url.scheme}:// ({why})"
        )


def _refuse_tls_options(url: ParsedURL, options: Mapping[str, Any]) -> None:
    given = sorted(key for key in TLS_OPTIONS if options.get(key) is not None)
    if given and url.scheme != "rediss":
        raise ValueError(
            f"option {', '.join(given)} is for TLS, which needs a rediss:// url; "
            f"{url.scheme}:// connects without TLS"
        )


def _given_pool(
    client: object, url: ParsedURL, options: Mapping[str, Any]
) -> aioredis.ConnectionPool:
    """The pool of the application's ``client``, once nothing else says how to connect."""
    if not isinstance(client, aioredis.Redis):
        raise TypeError(
            f"option redis_client must be a redis.asyncio.Redis, not {type(client).__name__}"
        )
    if url.hosts or url.username or url.password or url.path.strip("/"):
        raise ValueError(
            f"redis_client comes with its own server, database and credentials: "
            f"give the url as just {url.scheme}://, not {url.redacted()}"
        )
    settings = sorted(key for key in ("db", *TLS_OPTIONS) if options.get(key) is not None)
    if settings:
        raise ValueError(
            f"option {', '.join(settings)} cannot be combined with redis_client: "
            "configure that client instead"
        )
    return client.connection_pool


def _side_settings(pool: aioredis.ConnectionPool, connect_timeout: float) -> dict[str, Any]:
    """Side connections (pub/sub, BLPOP) on the server of ``pool``: its connection settings,
    with what aiodlock's own connections need (see :func:`_connection_settings`)."""
    return {
        **pool.connection_kwargs,
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 2,
        "decode_responses": False,
        "client_name": _CLIENT_NAME,
    }


def _pool_where(pool: aioredis.ConnectionPool) -> str:
    """The server of ``pool`` for messages, without credentials."""
    kwargs = pool.connection_kwargs
    db = kwargs.get("db", 0)
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={db}"
    scheme = "rediss" if issubclass(pool.connection_class, SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', _DEFAULT_PORT)}/{db}"


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


def _seconds(options: Mapping[str, Any], key: str, default: float) -> float:
    value = check_seconds(options.get(key), argument=key)
    return default if value is None else value
