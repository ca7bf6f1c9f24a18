"""What the SQL engine needs of a connection (:class:`Connection`: each driver wraps its own),
and where to open one (:class:`ConnectSettings`)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["ConnectSettings", "Connection"]


class Connection(Protocol):
    """A dedicated server session, as the pool and the engine use it."""

    idle_since: float
    lease_event: asyncio.Event | None
    peer_closed: bool

    @property
    def io(self) -> asyncio.Lock:
        """Serialises a keep-alive in flight with the release that follows it."""

    @property
    def closed(self) -> bool:
        """True once the connection cannot be used."""

    def close(self) -> None:
        """Close now (the server frees what the session held)."""


@dataclass(frozen=True)
class ConnectSettings:
    """Where and how to connect; ``password`` never shows in ``repr()``."""

    host: str
    port: int
    user: str | None
    password: str | None = field(repr=False)
    database: str
    connect_timeout: float
    unix_socket: str | None = None
    tls: ssl.SSLContext | str | bool | None = None
    """None: no TLS (MySQL), the driver's default (PostgreSQL: ``prefer``)."""
