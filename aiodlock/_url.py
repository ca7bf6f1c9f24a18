"""URL parsing, backend selection and option validation.

``connect("redis://:secret@host:6379/0?ttl=10&wakeup=blpop")`` becomes a scheme, a list of
hosts, credentials, a path and options. Query options and keyword options are merged (keywords
win) and validated here, before any connection is made, so bad input fails on the line that
wrote it. Passwords are kept out of every ``repr()`` and message.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = [
    "BACKENDS",
    "ParsedURL",
    "check_limit",
    "check_name",
    "check_namespace",
    "check_seconds",
    "load_backend",
    "parse_url",
]

MAX_NAME_BYTES = 1024

# scheme -> (module, class, extra that installs its driver)
BACKENDS: Mapping[str, tuple[str, str, str | None]] = {
    "memory": ("aiodlock.backends.memory", "MemoryBackend", None),
    "redis": ("aiodlock.backends.redis", "RedisBackend", "redis"),
    "rediss": ("aiodlock.backends.redis", "RedisBackend", "redis"),
    "unix": ("aiodlock.backends.redis", "RedisBackend", "redis"),
    "zookeeper": ("aiodlock.backends.zookeeper", "ZooKeeperBackend", "zookeeper"),
    "mysql": ("aiodlock.backends.mysql", "MySQLBackend", "mysql"),
}


@dataclass(frozen=True)
class ParsedURL:
    """A coordination-service URL, split; ``password`` never shows in ``repr()``."""

    scheme: str
    hosts: tuple[tuple[str, int | None], ...]
    path: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    query: Mapping[str, str] = field(default_factory=dict)
    raw: str = field(default="", repr=False)

    def redacted(self) -> str:
        """The URL with any password replaced by ``***``, for messages and ``repr()``."""
        auth = ""
        if self.username or self.password:
            auth = (self.username or "") + (":***" if self.password else "") + "@"
        hosts = ",".join(h if p is None else f"{h}:{p}" for h, p in self.hosts)
        return f"{self.scheme}://{auth}{hosts}{self.path}"


def parse_url(url: str | None) -> ParsedURL:
    """Split ``url``; ``None`` means ``memory://``.

    Raises:
        TypeError: ``url`` is not a string.
        ValueError: unknown scheme (the message lists the known ones) or a malformed URL.
    """
    if url is None:
        url = "memory://"
    if not isinstance(url, str):
        raise TypeError(f"url must be a str or None, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in BACKENDS:
        known = ", ".join(f"{s}://" for s in sorted(BACKENDS))
        shown = scheme if sep else url.split("@")[-1][:40]
        raise ValueError(f"unknown URL scheme {shown!r} in url; known schemes: {known}")
    # urlsplit does not accept several comma-separated hosts with ports, so split by hand.
    parts = urlsplit("x://" + rest)
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, _, pwd = auth.partition(":")
        username = unquote(user) or None
        password = unquote(pwd) or None
    hosts: list[tuple[str, int | None]] = []
    for item in filter(None, netloc.split(",")):
        host, port = _split_host(item)
        hosts.append((host, port))
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    path = unquote(parts.path)
    if scheme == "unix":
        # unix:///run/redis.sock?db=0: the socket path is the URL path.
        hosts = []
    return ParsedURL(scheme, tuple(hosts), path, username, password, query, url)


def _split_host(item: str) -> tuple[str, int | None]:
    if item.startswith("["):  # [::1]:6379
        host, _, tail = item[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = item.partition(":")
    if not port_text:
        return host, None
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"url has a bad port {port_text!r} for host {host!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"url has a port out of range: {port}")
    return host, port


def load_backend(scheme: str) -> type[Any]:
    """Import the backend class for ``scheme``, or say which extra to install."""
    module_name, class_name, extra = BACKENDS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if extra is None or (exc.name or "").startswith("aiodlock"):
            raise
        raise ImportError(
            f"the {scheme}:// backend needs its driver: pip install 'aiodlock[{extra}]'",
            name=exc.name,
        ) from exc
    cls: type[Any] = getattr(module, class_name)
    return cls


def check_name(name: object, *, argument: str = "name") -> str:
    """Validate a lock name: a non-empty str, no NUL, at most 1024 UTF-8 bytes."""
    if not isinstance(name, str):
        raise TypeError(f"{argument} must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{argument} must not be empty")
    if "\x00" in name:
        raise ValueError(f"{argument} must not contain NUL characters")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{argument} is {size} bytes long; the limit is {MAX_NAME_BYTES}")
    return name


def check_namespace(namespace: object) -> str:
    """A namespace is a name that also avoids ``:``, ``{`` and ``}`` (key separators)."""
    check_name(namespace, argument="namespace")
    assert isinstance(namespace, str)
    bad = set(namespace) & set(":{}")
    if bad:
        raise ValueError(f"namespace must not contain {''.join(sorted(bad))!r}")
    return namespace


def check_seconds(value: object, *, argument: str, allow_none: bool = True) -> float | None:
    """Validate a duration: a finite number of seconds > 0, or ``None`` (no limit)."""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{argument} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{argument} must be finite, not {seconds}")
    if seconds <= 0:
        raise ValueError(f"{argument} must be > 0, not {seconds}")
    return seconds


def check_limit(limit: object) -> int:
    """A semaphore limit is an int >= 1."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, not {limit}")
    return limit


def convert_query(key: str, text: str, kind: type) -> Any:
    """Turn one query-string value into the option's type."""
    if kind is bool:
        lowered = text.lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        raise ValueError(f"option {key} must be a boolean, not {text!r}")
    if kind is float:
        if text.lower() in {"", "none"}:
            return None
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"option {key} must be a number, not {text!r}") from None
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"option {key} must be an integer, not {text!r}") from None
    return text
