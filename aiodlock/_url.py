"""URL parsing only: a coordination-service URL split into a :class:`ParsedURL`.

``"redis://:secret@host:6379/0?ttl=10&wakeup=blpop"`` becomes a scheme, a list of hosts,
credentials, a path and the raw query options. Which schemes exist is the registry's business
(:mod:`aiodlock.backends._registry`), what the options mean the client's and the backend's.
Passwords are kept out of every ``repr()`` and message.

Example::

    parsed = parse_url("zookeeper://10.0.0.1:2181,10.0.0.2:2181/locks")
    parsed.hosts  # (("10.0.0.1", 2181), ("10.0.0.2", 2181))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["ParsedURL", "parse_url"]



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
        ValueError: no ``scheme://`` prefix, or a malformed host or port.
    """
    if url is None:
        url = "memory://"
    if not isinstance(url, str):
        raise TypeError(f"url must be a str or None, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or not scheme:
        shown = url.split("@")[-1][:40]  # never the credentials
        raise ValueError(f"unknown URL scheme in url {shown!r}: expected scheme://...")
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
