"""The ZooKeeper backend's URL and options, checked once when the client is made.

``zookeeper://h1:2181,h2:2181/chroot?session_ttl=10``: hosts (port 2181 by default), an
optional chroot, and the options of docs/zookeeper.md, "URL and options" (``session_timeout``,
ZooKeeper's name, is an alias of ``session_ttl``). Digest credentials come from the URL's
``user:password@`` or the ``username``/``password`` options, the ACL of every node created
from ``acl`` (see :mod:`._auth`). TLS (``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``,
``tls_verify``, as on every backend) becomes :attr:`Settings.tls`, an ``ssl.SSLContext``
checking the server's certificate and host name by default. ``identity`` is the client's
(``connect()`` passes it; ``host:pid`` for a backend made directly), written in our nodes.

Example::

    settings = Settings.parse(parse_url("zookeeper://zk1/apps"), {"connect_timeout": 2})
    settings.root  # "/apps"
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..._validate import check_identity, default_identity
from .. import (
    TLS_OPTIONS,
    Options,
    ParsedURL,
    canonical_options,
    check_seconds,
    tls_context,
    with_aliases,
)
from ._auth import AUTH_OPTIONS, AclEntry, Credentials, credentials_from, parse_acl
from ._layout import chroot

__all__ = ["ALIASES", "OPTIONS", "Settings"]

_DEFAULT_PORT: Final = 2181
_DEFAULT_SESSION_TTL: Final = 10.0
_DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_DEFAULT_REQUEST_TIMEOUT: Final = 10.0

ALIASES: Final[Mapping[str, str]] = {"session_timeout": "session_ttl"}  # ZooKeeper's own name
OPTIONS: Final[Mapping[str, type]] = {
    **with_aliases(
        {"session_ttl": float, "connect_timeout": float, "request_timeout": float}, ALIASES
    ),
    "suspended_grace": float,
    "identity": str,  # the client's, passed by connect(): inspect names holders by it
    **AUTH_OPTIONS,  # digest credentials and the ACL of our nodes
    **TLS_OPTIONS,  # to the servers' secureClientPort (docs/zookeeper.md, "TLS")
}
"""The options the backend declares (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Where to connect and how long to wait, from a ``zookeeper://`` URL and its options."""

    url: ParsedURL
    hosts: list[tuple[str, int]]
    root: str  # the chroot ("" for none)
    session_ttl: float  # the session timeout requested; the server grants one within bounds
    connect_timeout: float
    request_timeout: float
    suspended_grace: float | None  # None: half the granted session timeout
    identity: str  # who we are (the client's ``identity``), written in every node we make
    credentials: Credentials | None  # digest user and password (never shown)
    acl: tuple[AclEntry, ...]  # of every node we create
    tls: ssl.SSLContext | None = None  # None: in the clear

    @classmethod
    def parse(cls, url: ParsedURL, options: Mapping[str, Any]) -> Settings:
        """Check ``url`` and ``options``; ValueError or TypeError for a wrong one."""
        credentials = credentials_from(url, options)
        if credentials is not None and url.username is None:  # describe() names the user
            url = dataclasses.replace(url, username=credentials.user, password="***")
        if not url.hosts:
            raise ValueError("zookeeper:// url needs a host: zookeeper://h1:2181,h2:2181/chroot")
        hosts = [(host or "localhost", port or _DEFAULT_PORT) for host, port in url.hosts]
        root = chroot(url.path)
        opts = canonical_options(options, ALIASES)
        return cls(
            url=url,
            hosts=hosts,
            root=root,
            session_ttl=_seconds(opts, "session_ttl", _DEFAULT_SESSION_TTL),
            connect_timeout=_seconds(opts, "connect_timeout", _DEFAULT_CONNECT_TIMEOUT),
            request_timeout=_seconds(opts, "request_timeout", _DEFAULT_REQUEST_TIMEOUT),
            suspended_grace=_optional_seconds(opts, "suspended_grace"),
            identity=_identity(options.get("identity")),
            credentials=credentials,
            acl=parse_acl(options.get("acl"), credentials),
            tls=tls_context(options, scheme=url.scheme),
        )


def _identity(given: object) -> str:
    """``connect()`` always passes the client's identity; a backend made directly may not."""
    return check_identity(default_identity() if given is None else given)


def _seconds(options: Options, key: str, default: float) -> float:
    value = _optional_seconds(options, key)
    return default if value is None else value


def _optional_seconds(options: Options, key: str) -> float | None:
    value = options.get(key)
    if value is None:
        return None
    checked = check_seconds(value, argument=options.given(key))
    assert checked is not None
    return checked
