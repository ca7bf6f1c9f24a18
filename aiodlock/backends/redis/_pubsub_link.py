"""The one connection of a pub/sub hub: :class:`HubLink`, the base of
:class:`~._pubsub.PubSubHub` that connects (lazily, with capped backoff), runs one writer and
one reader task over the connection, and tears both down on any failure. The hub decides what
the messages mean (its ``_route`` and ``_on_*`` hooks).

Example::

    class PubSubHub(HubLink):
        def _route(self, name: bytes, data: bytes) -> None: ...
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Final, Protocol

from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    MovedError,
    ResponseError,
)

from ._pubsub_channel import ABSENT, SUBSCRIBED, SUBSCRIBING, UNSUBSCRIBING, Channel
from ._source import disconnect_quietly

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

__all__ = ["PLAIN", "SHARDED", "HubLink", "SideConnections"]

_log = logging.getLogger("aiodlock.redis")

_PING_INTERVAL: Final = 15.0
"""An idle pub/sub connection is PINGed this often; no reply within another interval means it
is dead (a silent partition would otherwise leave every waiter on its cap)."""
_MIN_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 2.0

# Message kinds and commands: plain pub/sub, and sharded pub/sub (Redis >= 7).
PLAIN: Final = (b"message", b"subscribe", b"unsubscribe", "SUBSCRIBE", "UNSUBSCRIBE")
SHARDED: Final = (b"smessage", b"ssubscribe", b"sunsubscribe", "SSUBSCRIBE", "SUNSUBSCRIBE")


class SideConnections(Protocol):
    """Where a hub gets its connection: a :class:`~._source.ConnectionSource`, or one master
    of a cluster."""

    @property
    def connect_timeout(self) -> float: ...

    @property
    def request_timeout(self) -> float: ...

    def new_connection(self, purpose: str) -> AbstractConnection: ...

    def describe(self) -> str: ...


class HubLink:
    """The connection tasks of a hub (see the module docstring); the hub sets the state."""

    _channels: dict[bytes, Channel]
    _dirty: set[bytes]
    _kick: asyncio.Event
    _needed: asyncio.Event
    _conn: AbstractConnection | None
    _ping_due: bool
    _sharded: bool
    _kinds: tuple[bytes, bytes, bytes, str, str]
    _source: SideConnections
    _connect_timeout: float
    _where: str
    closed: bool
    connects: int

    def _route(self, name: bytes, data: bytes) -> None:
        raise NotImplementedError

    def _on_subscribe(self, name: bytes) -> None:
        raise NotImplementedError

    def _on_unsubscribe(self, name: bytes) -> None:
        raise NotImplementedError

    def _on_disconnect(self) -> None:
        raise NotImplementedError

    def _evict_all(self, *, subscribing_only: bool = False) -> None:
        raise NotImplementedError

    def _fail_pending(self, error: BaseException) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        """Supervise the pub/sub connection until cancelled; never raises otherwise."""
        loop = asyncio.get_running_loop()
        delay = 0.0
        while not self.closed:
            if not self._channels:
                self._needed.clear()
                await self._needed.wait()
                continue
            conn = self._source.new_connection("pubsub")
            try:
                async with asyncio.timeout(self._connect_timeout):
                    await conn.connect()  # type: ignore[no-untyped-call]
            except Exception as exc:
                await disconnect_quietly(conn)
                # Warn once per outage; the retries after it are routine.
                _log.log(
                    logging.DEBUG if delay else logging.WARNING,
                    "redis pub/sub connect to %s failed: %s: %s",
                    self._where,
                    type(exc).__name__,
                    exc,
                )
                if self._sharded:
                    self._evict_all()  # the master may be gone: find each slot anew
                else:
                    self._fail_pending(exc)
                delay = min(_MAX_BACKOFF, max(_MIN_BACKOFF, delay * 2))
                # Reconnect backoff (jittered), not a lock poll: waiters are capped anyway.
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                continue
            started = loop.time()
            self.connects += 1
            self._conn = conn
            for ch in self._channels.values():
                ch.state = ABSENT
                self._dirty.add(ch.name)
            self._kick.set()
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._read_loop(conn))
                    tg.create_task(self._write_loop(conn))
            except Exception as exc:
                cause = _find(exc, Exception)
                _log.warning(
                    "redis pub/sub connection to %s lost: %s: %s",
                    self._where,
                    type(cause).__name__,
                    cause,
                )
                refused = _find(exc, ResponseError)
                if refused is not None:
                    # The server refused a SUBSCRIBE (ACL?): retrying will not help them.
                    self._fail_pending(refused)
            finally:
                self._conn = None
                self._on_disconnect()
                await disconnect_quietly(conn)
            delay = 0.0 if loop.time() - started > 5.0 else max(_MIN_BACKOFF, delay * 2)
            if delay:
                await asyncio.sleep(min(delay, _MAX_BACKOFF) * random.uniform(0.5, 1.0))

    async def _read_loop(self, conn: AbstractConnection) -> None:
        ping_sent = False
        message, subscribed, unsubscribed = self._kinds[:3]
        while True:
            try:
                reply = await conn.read_response(timeout=_PING_INTERVAL, disconnect_on_error=False)
            except MovedError:
                if not self._sharded:
                    raise
                # An SSUBSCRIBE refused: its slot is served elsewhere (one SSUBSCRIBE per
                # channel, but which one is not said): every channel still waiting for its
                # confirmation looks for its master again; those that were right come back.
                self._evict_all(subscribing_only=True)
                continue
            if reply is None:  # nothing for a whole interval
                if ping_sent:
                    raise RedisConnectionError("the pub/sub connection stopped answering PING")
                ping_sent = self._ping_due = True
                self._kick.set()
                continue
            ping_sent = False
            if type(reply) is not list:
                continue  # +PONG while nothing is subscribed
            kind = reply[0]
            if kind == message:
                self._route(reply[1], reply[2])
            elif kind == subscribed:
                self._on_subscribe(reply[1])
            elif kind == unsubscribed:
                self._on_unsubscribe(reply[1])

    async def _write_loop(self, conn: AbstractConnection) -> None:
        kick = self._kick
        while True:
            await kick.wait()
            kick.clear()
            subscribe: list[bytes] = []
            unsubscribe: list[bytes] = []
            for name in self._dirty:
                ch = self._channels.get(name)
                if ch is None:
                    continue
                if ch.state == ABSENT:
                    if ch.wanted:
                        ch.state = SUBSCRIBING
                        subscribe.append(name)
                    else:
                        del self._channels[name]
                elif ch.state == SUBSCRIBED and not ch.wanted:
                    ch.state = UNSUBSCRIBING
                    unsubscribe.append(name)
            self._dirty.clear()
            sub, unsub = self._kinds[3:]
            if self._sharded:
                # One channel per command: the channels of one SSUBSCRIBE must share a slot.
                commands = [(sub, name) for name in subscribe]
                commands += [(unsub, name) for name in unsubscribe]
                if commands:
                    await conn.send_packed_command(conn.pack_commands(commands), False)
            else:
                if subscribe:
                    await conn.send_command(sub, *subscribe, check_health=False)
                if unsubscribe:
                    await conn.send_command(unsub, *unsubscribe, check_health=False)
            if self._ping_due:
                self._ping_due = False
                await conn.send_command("PING", check_health=False)


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of ``kind`` in ``exc``, looking inside exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
        return None
    return exc if isinstance(exc, kind) else None
