"""One Redis server as a :class:`~._source.ConnectionSource`: ``redis://``, ``rediss://``,
``unix://``.

:class:`NodeSource` owns the redis-py client with its pool of command connections (one kept
per command slot), the side connections handed to the waiters, the deadlines that bound every
command, and the translation of driver errors; :mod:`._node_settings` reads the URL and the
options. A command that finds a connection free runs inline; otherwise it queues in one of
two lanes (:mod:`._slots`). docs/redis.md explains the slots, the lanes and the TLS defaults.

Example::

    source = NodeSource(parse_url("rediss://:secret@cache.internal:6380/2"), {"max_connections": 4})
    await source.open(tasks)
    source.describe()  # "rediss://:***@cache.internal:6380/2"
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, TypeVar, TypeVarTuple

import redis.asyncio as aioredis

from .. import BackendError, Deadlines, Tasks, with_aliases
from ._errors import ErrorMap
from ._node_settings import (
    CLIENT_NAME,
    NODE_ALIASES,
    TLS_OPTIONS,
    connection_settings,
    given_pool,
    node_options,
    pool_where,
    seconds,
    side_settings,
)
from ._slots import Slots, wait_outcome

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from .. import Options, ParsedURL
    from ._source import Prepare

__all__ = ["NodeSource"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_DEFAULT_REQUEST_TIMEOUT: Final = 5.0
_DEFAULT_MAX_CONNECTIONS: Final = 2


class NodeSource:
    """The connections to one Redis server (see the module docstring).

    Options: ``connect_timeout`` (seconds, default 5; bounds connecting, AUTH and the first
    PING), ``request_timeout`` (alias ``socket_timeout``; seconds, default 5; bounds each
    command), ``max_connections``
    (command connections, default 2: commands queue for a free one), ``db`` (for
    ``unix://``; ``redis://host/N`` carries it in the path), the TLS options of ``rediss://``
    (:data:`TLS_OPTIONS`), and ``redis_client``: a ``redis.asyncio.Redis`` of the
    application's, whose pool carries the commands (the URL is then just ``redis://``).
    """

    options: ClassVar[Mapping[str, type]] = {
        **with_aliases(
            {"connect_timeout": float, "request_timeout": float},
            {"socket_timeout": NODE_ALIASES["socket_timeout"]},
        ),
        "max_connections": int,
        "db": int,
        **TLS_OPTIONS,
        "redis_client": object,
    }

    def __init__(self, url: ParsedURL, given: Mapping[str, Any]) -> None:
        options = node_options(given)
        connect_timeout = seconds(options, "connect_timeout", _DEFAULT_CONNECT_TIMEOUT)
        request_timeout = seconds(options, "request_timeout", _DEFAULT_REQUEST_TIMEOUT)
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
        self.request_timeout: float = request_timeout
        self._max_connections = max_connections
        # The application's pool, if it gave us a client: used, never closed.
        self._given_pool: aioredis.ConnectionPool | None = None
        app_client = options.get("redis_client")
        if app_client is None:
            self._where = url.redacted()
            self._secret = url.password
            self._conn_class, self._conn_kwargs = self._connection_settings(
                url, options, connect_timeout
            )
        else:
            pool = self._given_pool = given_pool(app_client, url, options)
            self._where = pool_where(pool)
            self._secret = pool.connection_kwargs.get("password")
            self._conn_class = pool.connection_class
            self._conn_kwargs = side_settings(pool, connect_timeout)
        self._client: aioredis.Redis | None = None
        # Clients of command slots that are free now, each with its own connection.
        self._spare: list[aioredis.Redis] = []
        self._closed = False
        self._slots: Slots[_Queued[Any]] = Slots(max_connections)
        self._deadlines = Deadlines(request_timeout)
        self._clock: Callable[[], float] = time.monotonic  # the loop's clock once open
        # The backend's share of the client's tasks: queued commands run there (once open).
        self._tasks: Tasks | None = None
        self._run_name = f"aiodlock-redis-commands {self._where}"
        self._errors: dict[str, ErrorMap] = {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._client is not None else "new"
        return f"<NodeSource {self._where} {state}>"

    # ---------------------------------------------------------------- lifetime

    async def open(self, tasks: Tasks, prepare: Prepare | None = None) -> None:
        """Connect and PING, then ``prepare(client)``, all within ``connect_timeout``; queued
        commands will run in tasks of ``tasks``."""
        if self._client is not None or self._closed:
            raise RuntimeError("a NodeSource is opened once")
        client = self._new_client()
        try:
            with self.errors("connect"):
                async with asyncio.timeout(self.connect_timeout):
                    await self._handshake(client, prepare, tasks)
        except BaseException:
            await client.aclose()
            raise
        self._clock = asyncio.get_running_loop().time
        self._tasks = tasks
        self._client = client

    async def aclose(self) -> None:
        """Refuse new commands, wait for those in flight (within ``request_timeout``), close.

        Idempotent. Commands in flight finish before the pool closes, so no connection is
        reopened behind our back (the tasks that ran queued commands have handed back their
        slots, so they are done). The pool of a ``redis_client`` is left open.
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
        self._tasks = None
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

    async def call(self, fn: Callable[[aioredis.Redis, *_Ts], Awaitable[_T]], *args: *_Ts) -> _T:
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
        tasks = self._tasks
        if self._client is None or tasks is None or tasks.closed:
            outcome.set_exception(self._unavailable())
            return outcome
        slots = self._slots
        free = slots.take()
        slots.push(_Queued(fn, args, outcome), outcome, first=first)
        if free:
            tasks.spawn(self._run_queued(), self._run_name)  # it holds the slot we took
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
        tasks = self._tasks
        if (
            tasks is None
            or not self._slots.queued()
            or tasks.try_spawn(self._run_queued(), self._run_name) is None
        ):
            self._slots.give_back()

    async def _run_queued(self) -> None:
        # A task of ours holding one slot: it raises nothing but its own
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
            limit = self.connect_timeout if action == "connect" else self.request_timeout
            errors = self._errors[action] = ErrorMap(action, self._where, self._secret, limit)
        return errors

    def route(self, key: bytes) -> str:
        """``""``: one server holds every key."""
        return ""

    def new_connection(self, purpose: str, route: str = "") -> AbstractConnection:
        """A side connection with the pool's settings, named ``aiodlock:<purpose>``."""
        name = f"{CLIENT_NAME}:{purpose}"
        return self._conn_class(**{**self._side_kwargs(), "client_name": name})

    # ---------------------------------------------------------------- for another topology

    def _connection_settings(
        self, url: ParsedURL, options: Options, connect_timeout: float
    ) -> tuple[type[AbstractConnection], dict[str, Any]]:
        """The connection class and its keyword arguments for ``url`` (validated now)."""
        return connection_settings(url, options, connect_timeout)

    async def _handshake(
        self, client: aioredis.Redis, prepare: Prepare | None, tasks: Tasks
    ) -> None:
        """What :meth:`open` does within ``connect_timeout``: PING, then ``prepare``."""
        await client.ping()
        if prepare is not None:
            await prepare(client)

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
