"""Redis behind Sentinel as a :class:`~._source.ConnectionSource`:
``redis+sentinel://[[user]:password@]h1:p1[,h2:p2...]/SERVICE_NAME[/DB]``.

Everything but *where the master is* comes from :class:`~._node.NodeSource`; every connection
asks the sentinels for the master as it connects, so after a failover the next command reaches
the new one. ``sentinel_username``/``sentinel_password`` authenticate to the sentinels.
docs/redis.md ("Sentinel") says what a failover can lose.

Example::

    source = SentinelSource(parse_url("redis+sentinel://:pw@s1:26379,s2:26379/shop/0"), {})
    await source.open(tasks)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.backoff import NoBackoff
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    TimeoutError as RedisTimeoutError,
)

from ._node import NodeSource
from ._node_settings import connection_defaults, refuse_node_options

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import AbstractConnection

    from .. import Options, ParsedURL

__all__ = ["SENTINEL_OPTIONS", "SentinelSource"]

_DEFAULT_SENTINEL_PORT: Final = 26379
_PER_SENTINEL: Final = 1.0
"""Seconds one sentinel may take to answer before the next is asked (at most
``connect_timeout`` / their number). A hung sentinel (SIGSTOPped, blackholed) still accepts
connections from the kernel and would otherwise hold every connect until its deadline."""

SENTINEL_OPTIONS: Final[Mapping[str, type]] = {
    "sentinel_username": str,
    "sentinel_password": str,
}


class _Sentinel(Sentinel):
    """redis-py's Sentinel, asking the sentinels without losing one to concurrent askers.

    After a failover every connection asks at once. redis-py moves the sentinel that answered
    to the front by the index it had *before* its await, so two askers could overwrite one
    client with another: the one dropped was never asked again, nor closed with the rest.
    Here the list is only reordered by identity, with no await in between. Every sentinel but
    the last gets ``per_sentinel`` seconds to answer (the last: what the caller's deadline
    leaves), so a hung one is skipped rather than waited out; the one that answers goes first.
    """

    def __init__(
        self,
        sentinels: list[tuple[str, int]],
        sentinel_kwargs: dict[str, Any],
        per_sentinel: float = _PER_SENTINEL,
    ) -> None:
        super().__init__(sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        self._per_sentinel = per_sentinel

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors = []
        asked = list(self.sentinels)
        for sentinel in asked:
            bound = None if sentinel is asked[-1] else self._per_sentinel
            try:
                # asyncio.timeout, not wait_for: a cancellation is never swallowed (3.11).
                async with asyncio.timeout(bound):
                    masters = await sentinel.sentinel_masters()
            except (RedisConnectionError, RedisTimeoutError, TimeoutError) as exc:
                errors.append(f"{sentinel} - {exc!r}")
                continue
            state = masters.get(service_name) if isinstance(masters, dict) else None  # RESP2
            if state and self.check_master_state(state, service_name):
                self.sentinels.remove(sentinel)
                self.sentinels.insert(0, sentinel)
                return state["ip"], state["port"]
        detail = f" : {', '.join(errors)}" if errors else ""
        raise MasterNotFoundError(f"No master found for {service_name!r}{detail}")


class SentinelSource(NodeSource):
    """The master of a Sentinel-monitored service (see the module docstring).

    Options: those of :class:`NodeSource` but ``redis_client`` and the TLS ones, plus
    ``sentinel_username`` and ``sentinel_password``.
    """

    options: ClassVar[Mapping[str, type]] = {**NodeSource.options, **SENTINEL_OPTIONS}

    def _connection_settings(
        self, url: ParsedURL, options: Options, connect_timeout: float
    ) -> tuple[type[AbstractConnection], dict[str, Any]]:
        refuse_node_options(url, options, "give the database in the url path: /SERVICE_NAME/DB")
        if not url.hosts:
            raise ValueError(
                f"{url.scheme}:// needs the sentinels to ask: "
                f"{url.scheme}://host1:26379,host2:26379/SERVICE_NAME[/DB]"
            )
        service, _, db = url.path.strip("/").partition("/")
        if not service:
            raise ValueError(
                f"{url.scheme}:// needs the name of the monitored service in the path: "
                f"{url.scheme}://host1:26379/SERVICE_NAME[/DB]"
            )
        self._service = service
        settings = connection_defaults(url, connect_timeout, db=db or 0)
        settings["socket_keepalive"] = True
        sentinel_settings: dict[str, Any] = {
            # No socket_timeout: redis-py would send through asyncio.wait_for, which on Python
            # 3.11 swallows a cancellation that lands as the send completes (a cancelled
            # acquire would go on waiting). Asking the sentinels is part of connecting, which
            # our command deadline bounds; a sentinel that does not accept the connection in
            # time is skipped for the next.
            "socket_timeout": None,
            "socket_connect_timeout": connect_timeout,
            "retry": Retry(NoBackoff(), 0),
            "protocol": 2,
        }
        for key in SENTINEL_OPTIONS:
            if options.get(key) is not None:
                value = options[key]
                if not isinstance(value, str):
                    raise TypeError(f"option {key} must be a str, not {type(value).__name__}")
                sentinel_settings[key.removeprefix("sentinel_")] = value
        self._sentinel = _Sentinel(
            [(host or "localhost", port or _DEFAULT_SENTINEL_PORT) for host, port in url.hosts],
            sentinel_kwargs=sentinel_settings,
            per_sentinel=min(_PER_SENTINEL, connect_timeout / len(url.hosts)),
        )
        return SentinelManagedConnection, settings

    def _new_pool(self) -> aioredis.ConnectionPool:
        self._pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            self._service,
            self._sentinel,
            max_connections=self._max_connections,
            connection_class=SentinelManagedConnection,
            **self._conn_kwargs,
        )
        return self._pool

    def _command_client(self, shared: aioredis.Redis) -> aioredis.Redis:
        # Every command borrows from the pool: a connection that a slot kept could still be
        # on the demoted master after a failover (the pool drops only its idle ones when the
        # sentinels name a new master), where reads such as SCRIPT LOAD would go unnoticed.
        return shared

    def _side_kwargs(self) -> dict[str, Any]:
        # The pool's settings include the pool itself, through which a connection asks the
        # sentinels for the master (made at open(): side connections are made after it).
        return dict(self._pool.connection_kwargs)

    async def aclose(self) -> None:
        """Close the command connections, then the connections to the sentinels."""
        try:
            await super().aclose()
        finally:
            await self._sentinel.aclose()
