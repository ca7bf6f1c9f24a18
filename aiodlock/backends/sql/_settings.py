"""The options both SQL backends share, checked once: :func:`read_settings`.

``connect_timeout``, ``request_timeout`` (alias ``query_timeout``), ``wait_slice``,
``max_connections``, ``max_idle``, ``shared_sessions``, ``fence_table`` and ``fence_ttl``, and
the client's ``identity`` (passed by ``connect()``); a dialect reads its own options (TLS, a
socket path) itself. The table of options is in
docs/mysql.md and docs/postgres.md.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..._validate import check_identity, default_identity
from .. import Deadlines, ParsedURL, canonical_options, check_seconds, with_aliases
from ._connection import ConnectSettings

__all__ = [
    "ALIASES",
    "DEFAULTS",
    "OPTIONS",
    "Settings",
    "check_table_name",
    "connect_settings",
    "read_settings",
    "sessions_table",
]

ALIASES: Final[Mapping[str, str]] = {"query_timeout": "request_timeout"}
OPTIONS: Final[Mapping[str, type]] = with_aliases(
    {
        "connect_timeout": float,
        "request_timeout": float,
        "wait_slice": float,
        "max_connections": int,
        "max_idle": int,
        "shared_sessions": int,
        "fence_table": str,
        "fence_ttl": float,
        "identity": str,
    },
    ALIASES,
)
"""The shared options, canonical names and aliases (a backend adds its own)."""

DEFAULTS: Final[Mapping[str, Any]] = {  # of the shared options
    "connect_timeout": 10.0,
    "request_timeout": 10.0,
    "wait_slice": 1.0,
    # Lent connections: contended waits, semaphores, reader/writer locks, operators. With the
    # shared sessions, a client stays within 10 server connections by default (a stock
    # PostgreSQL allows 100 in all, MariaDB 151).
    "max_connections": 8,
    "max_idle": 8,
    "shared_sessions": 2,
    "fence_table": "aiodlock_fence",
    "fence_ttl": 7 * 24 * 3600.0,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """The shared options of one SQL backend, checked."""

    where: str
    """The URL without its password (in messages)."""
    connect_timeout: float
    request_timeout: float
    bounds: Deadlines
    """The usual statements' limit (``request_timeout``), without a timer per statement."""
    wait_slice: float
    max_connections: int
    max_idle: int
    shared_sessions: int
    """Sessions that hold the client's uncontended mutexes (0: each lock a session of its
    own), on top of ``max_connections``."""
    fence_table: str
    fence_ttl: float
    identity: str
    """The client's ``identity``, recorded once per server session for ``inspect``
    (``host:pid`` when the backend is made without ``connect()``)."""


def read_settings(
    url: ParsedURL, options: Mapping[str, Any], *, check_table: Callable[[object], str]
) -> Settings:
    """The shared options of ``options`` (aliases allowed), checked.

    Raises:
        ValueError, TypeError: an option out of range or of the wrong type.
    """
    opts = canonical_options({k: v for k, v in options.items() if k in OPTIONS}, ALIASES)

    def seconds(name: str, *, allow_zero: bool = False) -> float:
        value = opts.get(name)
        if value is None:
            return float(DEFAULTS[name])
        checked = check_seconds(
            value, argument=opts.given(name), allow_none=False, allow_zero=allow_zero
        )
        assert checked is not None
        return checked

    request_timeout = seconds("request_timeout")
    return Settings(
        where=url.redacted(),
        connect_timeout=seconds("connect_timeout"),
        request_timeout=request_timeout,
        bounds=Deadlines(request_timeout),
        wait_slice=seconds("wait_slice"),
        max_connections=_check_int(opts, "max_connections", minimum=1),
        max_idle=_check_int(opts, "max_idle", minimum=0),
        shared_sessions=_check_int(opts, "shared_sessions", minimum=0),
        fence_table=check_table(opts.get("fence_table", DEFAULTS["fence_table"])),
        fence_ttl=seconds("fence_ttl", allow_zero=True),
        identity=_identity(opts.get("identity")),
    )


def _identity(given: object) -> str:
    """``connect()`` always passes the client's identity; a backend made directly may not."""
    return check_identity(default_identity() if given is None else given)


def _check_int(options: Mapping[str, Any], name: str, *, minimum: int) -> int:
    value = options.get(name, DEFAULTS[name])
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}")
    return value


def check_table_name(table: object, *, longest: int, fold: bool) -> str:
    """Validate the ``fence_table`` option: a plain unquoted SQL identifier of at most
    ``longest`` characters (``fold``: lowercased, as PostgreSQL folds an unquoted name)."""
    if not isinstance(table, str):
        raise TypeError(f"fence_table must be a str, not {type(table).__name__}")
    if not re.fullmatch(rf"[A-Za-z_][A-Za-z0-9_]{{0,{longest - 1}}}", table):
        raise ValueError(
            f"fence_table must be a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, "
            f"at most {longest} characters), not {table!r}"
        )
    return table.lower() if fold else table


def sessions_table(fence_table: str, *, longest: int) -> str:
    """The table of each session's client identity, named after the fencing table (its
    ``_sessions``), the fencing table's name cut short if both would not fit ``longest``."""
    suffix = "_sessions"
    return fence_table[: longest - len(suffix)] + suffix


def connect_settings(
    url: ParsedURL,
    settings: Settings,
    default_port: int,
    *,
    unix_socket: str | None = None,
    tls: ssl.SSLContext | str | bool | None = None,
) -> ConnectSettings:
    """Where to connect: the one host of an SQL URL, and its database (which holds the
    fencing table)."""
    scheme = url.scheme
    if len(url.hosts) > 1:
        raise ValueError(f"{scheme}:// takes one host, got {len(url.hosts)}")
    host, port = url.hosts[0] if url.hosts else ("localhost", None)
    database = url.path.strip("/")
    if not database:
        raise ValueError(
            f"{scheme}:// url needs a database for the fencing table: "
            f"{scheme}://user:password@host:{default_port}/database"
        )
    return ConnectSettings(
        host=host or "localhost",
        port=port or default_port,
        user=url.username,
        password=url.password,
        database=database,
        connect_timeout=settings.connect_timeout,
        unix_socket=unix_socket,
        tls=tls,
    )
