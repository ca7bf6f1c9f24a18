"""How one Redis server is reached, from the URL and the options: redis-py's connection class
and keyword arguments, checked when the backend is made rather than at the first connect.

The option names are the shared vocabulary (``request_timeout``, ``tls_ca``...); redis-py's
spellings (``socket_timeout``, ``ssl_ca_certs``...) are accepted as aliases
(:data:`NODE_ALIASES`). docs/redis.md explains the TLS defaults.

Example::

    cls, kwargs = connection_settings(parse_url("rediss://cache:6380/0"), options, 5.0)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

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

from .. import Options, canonical_options, check_bool, check_seconds

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from .. import ParsedURL

__all__ = [
    "CLIENT_NAME",
    "DEFAULT_PORT",
    "NODE_ALIASES",
    "TLS_OPTIONS",
    "connection_defaults",
    "connection_settings",
    "given_pool",
    "node_options",
    "pool_where",
    "refuse_node_options",
    "seconds",
    "side_settings",
]

DEFAULT_PORT: Final = 6379
CLIENT_NAME: Final = "aiodlock"
NODE_ALIASES: Final[Mapping[str, str]] = {
    "socket_timeout": "request_timeout",
    "ssl_ca_certs": "tls_ca",
    "ssl_certfile": "tls_cert",
    "ssl_keyfile": "tls_key",
}
"""redis-py's spellings of the shared option names, still accepted."""
TLS_OPTIONS: Final[Mapping[str, type]] = {
    "tls_ca": str,
    "tls_cert": str,
    "tls_key": str,
    "tls_verify": bool,
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    # redis-py's finer checks, which tls_verify sums up: kept as they were.
    "ssl_cert_reqs": str,
    "ssl_check_hostname": bool,
}
"""The options of ``rediss://`` only, under every name they are accepted by."""
_CERT_REQS: Final = ("none", "optional", "required")
_FILES: Final = (
    ("tls_ca", "ssl_ca_certs"),
    ("tls_cert", "ssl_certfile"),
    ("tls_key", "ssl_keyfile"),
)


def node_options(options: Mapping[str, Any]) -> Options:
    """``options`` under the shared names (``ValueError`` for one given under two names)."""
    return canonical_options(options, NODE_ALIASES)


def connection_settings(
    url: ParsedURL, options: Options, connect_timeout: float
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
    common["port"] = port or DEFAULT_PORT
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
        # Retries off: a replayed acquire whose reply was lost could block ourselves.
        "retry": Retry(NoBackoff(), 0),
        # RESP2: plain arrays for pub/sub, no HELLO/maintenance-notification handshake.
        "protocol": 2,
        "decode_responses": False,
        "client_name": CLIENT_NAME,
        "db": _check_db(db),
    }


def _tls_settings(options: Options) -> dict[str, Any]:
    """SSLConnection's keyword arguments from the TLS options, checked now, not at connect.

    Certificates and host names are checked unless the options say otherwise: redis-py's own
    defaults differ between versions (before 6 it did not check host names).
    """
    settings: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    for name, native in _FILES:
        value = options.get(name)
        if value is not None:
            given = options.given(name)
            if not isinstance(value, str | os.PathLike):
                raise TypeError(f"option {given} must be a file path, not {type(value).__name__}")
            path = settings[native] = os.fspath(value)
            # Now rather than as "No such file or directory" at connect, which names no file.
            if not os.path.isfile(path):
                raise ValueError(f"option {given}: no such file: {path!r}")
    if "ssl_keyfile" in settings and "ssl_certfile" not in settings:
        key = options.given("tls_key")
        cert = "ssl_certfile" if key == "ssl_keyfile" else "tls_cert"
        raise ValueError(f"option {key} needs {cert} (the client certificate)")
    verify = options.get("tls_verify")
    if verify is not None:
        finer = _given(options, ("ssl_cert_reqs", "ssl_check_hostname"))
        if finer:
            raise ValueError(f"option tls_verify and {', '.join(finer)} overlap: give only one")
        if not check_bool(verify, argument="option tls_verify"):
            # Encrypted, but neither the certificate nor the host name is checked (tests).
            settings["ssl_cert_reqs"] = "none"
            settings["ssl_check_hostname"] = False
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


def _given(options: Mapping[str, Any], names: tuple[str, ...]) -> list[str]:
    """The options of ``names`` that ``options`` set, as the user spelled them."""
    spell = options.given if isinstance(options, Options) else str
    return sorted(spell(key) for key in names if options.get(key) is not None)


def refuse_node_options(url: ParsedURL, options: Mapping[str, Any], why: str) -> None:
    """``ValueError`` for the one-node options a deployment of several cannot take
    (``redis_client``, ``db``, the TLS ones), saying ``why``."""
    given = _given(options, ("redis_client", "db", *TLS_OPTIONS))
    if given:
        raise ValueError(f"option {', '.join(given)} is not supported on {url.scheme}:// ({why})")


def _refuse_tls_options(url: ParsedURL, options: Mapping[str, Any]) -> None:
    given = _given(options, tuple(TLS_OPTIONS))
    if given and url.scheme != "rediss":
        raise ValueError(
            f"option {', '.join(given)} is for TLS, which needs a rediss:// url; "
            f"{url.scheme}:// connects without TLS"
        )


def given_pool(client: object, url: ParsedURL, options: Options) -> aioredis.ConnectionPool:
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
    settings = _given(options, ("db", *TLS_OPTIONS))
    if settings:
        raise ValueError(
            f"option {', '.join(settings)} cannot be combined with redis_client: "
            "configure that client instead"
        )
    return client.connection_pool


def side_settings(pool: aioredis.ConnectionPool, connect_timeout: float) -> dict[str, Any]:
    """Side connections (pub/sub, BLPOP) on the server of ``pool``: its connection settings,
    with what aiodlock's own connections need (see :func:`connection_settings`)."""
    return {
        **pool.connection_kwargs,
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 2,
        "decode_responses": False,
        "client_name": CLIENT_NAME,
    }


def pool_where(pool: aioredis.ConnectionPool) -> str:
    """The server of ``pool`` for messages, without credentials."""
    kwargs = pool.connection_kwargs
    db = kwargs.get("db", 0)
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={db}"
    scheme = "rediss" if issubclass(pool.connection_class, SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', DEFAULT_PORT)}/{db}"


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


def seconds(options: Options, key: str, default: float) -> float:
    """The seconds option ``key`` (checked), or ``default``."""
    value = check_seconds(options.get(key), argument=options.given(key))
    return default if value is None else value
