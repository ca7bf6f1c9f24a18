"""``aiodlock.connect()``: a URL and options in, a :class:`~aiodlock.LockClient` out.

The URL selects the backend (its scheme, through the registry); the options common to every
backend (namespace, ttl, timeout, max_hold, identity) are checked here and given to the client,
the rest to the backend, which declares what it accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._client import LockClient
from ._url import parse_url
from ._validate import (
    check_identity,
    check_namespace,
    check_seconds,
    check_timeout,
    check_ttl,
    convert_query,
    default_identity,
)
from .backends._protocol import Backend
from .backends._registry import load

__all__ = ["DEFAULT_NAMESPACE", "DEFAULT_TTL", "connect"]

DEFAULT_NAMESPACE: Final = "aiodlock"
DEFAULT_TTL: Final = 30.0
_COMMON_OPTIONS: Final[Mapping[str, type]] = {
    "namespace": str,
    "ttl": float,
    "timeout": float,
    "max_hold": float,
    "identity": str,
}


def connect(url: str | None = None, **options: Any) -> LockClient:
    """Make a client for the coordination service at ``url`` (``memory://`` when omitted).

    Use it as an async context manager: entering connects, leaving releases what is still
    held and disconnects::

        async with aiodlock.connect("redis://127.0.0.1:6379/0", namespace="shop") as locks:
            async with locks.lock("order:42"):
                ...

    Args:
        url: ``memory://[store]``, ``redis://``, ``rediss://``, ``unix://``,
            ``zookeeper://h1:p1,h2:p2/chroot``, ``etcd://h1:p1,h2:p2/prefix``,
            ``mysql://user:password@host:port/db``,
            ``postgresql://user:password@host:port/db`` (also ``postgres://``), and
            any scheme an installed package registers (entry-point group ``aiodlock.backends``).
            Query parameters are options (``?ttl=10&wakeup=blpop``); keyword options win over them.
            Special characters in a user name or password must be percent-encoded.
        **options: ``namespace`` (default ``"aiodlock"``), ``ttl`` (lease seconds, default
            30, renewed every ttl/3), ``timeout`` (default acquire wait, ``None`` = forever),
            ``max_hold`` (stop renewing after this many seconds), ``identity`` (who this
            client is, stored with each lock it holds and shown by ``inspect``; default
            ``"host:pid"``, any printable text of 1-128 characters), and the backend's own
            options (Redis: ``wakeup="pubsub"|"blpop"``, ``connect_timeout``, the ``ssl_*``
            options of ``rediss://``, ``redis_client=`` an application's own client...).

    Raises:
        ValueError: unknown scheme (the message lists the known ones), a bad option value.
        TypeError: an unknown option, or an option of the wrong type.
        ImportError: the backend's driver is not installed (the message says which extra).
    """
    parsed = parse_url(url)
    backend_cls = load(parsed.scheme)
    accepted: dict[str, type] = {**_COMMON_OPTIONS, **backend_cls.options}
    merged: dict[str, Any] = {}
    for key, text in parsed.query.items():
        if key not in accepted:
            raise TypeError(_unknown_option(key, accepted, "URL query parameter"))
        merged[key] = convert_query(key, text, accepted[key])
    for key, value in options.items():
        if key not in accepted:
            raise TypeError(_unknown_option(key, accepted, "option"))
        merged[key] = value
    namespace = check_namespace(merged.pop("namespace", DEFAULT_NAMESPACE))
    ttl = check_ttl(merged.pop("ttl", DEFAULT_TTL))
    timeout = check_timeout(merged.pop("timeout", None))
    max_hold = check_seconds(merged.pop("max_hold", None), argument="max_hold")
    identity = check_identity(merged.pop("identity", default_identity()))
    if "identity" in backend_cls.options:  # a backend that stores it declares the option
        merged["identity"] = identity
    backend: Backend = backend_cls(parsed, merged)
    return LockClient(
        backend,
        namespace=namespace,
        ttl=ttl,
        timeout=timeout,
        max_hold=max_hold,
        identity=identity,
    )


def _unknown_option(key: str, accepted: Mapping[str, type], what: str) -> str:
    return f"unknown {what} {key!r}; this backend accepts: {', '.join(sorted(accepted))}"
