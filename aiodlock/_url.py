"""URL parsing only: a coordination-service URL split into a :class:`ParsedURL`.

``"redis://:secret@host:6379/0?ttl=10&wakeup=blpop"`` becomes a scheme, a list of hosts,
credentials, a path and the raw query options. Which schemes exist is the registry's business
(:mod:`aiodlock.backends._registry`), what the options mean the client's and the backend's.
Passwords are kept out of every ``repr()`` and message, and no error about a malformed URL
quotes any part of its user name or password: a special character that is not percent-encoded
(``redis://:pa#ss@host``) would split the URL inside the password, so such URLs are refused
before a piece of the password can pass for a host, a port, a path or an option.

Example::

    parsed = parse_url("zookeeper://10.0.0.1:2181,10.0.0.2:2181/locks")
    parsed.hosts  # (("10.0.0.1", 2181), ("10.0.0.2", 2181))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["ENCODE_HINT", "ParsedURL", "parse_url"]


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

    No part of the user name or password ever appears in an error: a malformed URL is refused
    with a message that quotes only what follows the credentials (or nothing of the URL).

    Raises:
        TypeError: ``url`` is not a string.
        ValueError: no ``scheme://`` prefix, a malformed host or port, or credentials with
            special characters that are not percent-encoded (``#``, ``/``, ``?``).
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
    if not _SCHEME.fullmatch(scheme):
        # Quote nothing: "://" inside a password would make the scheme part of it.
        raise ValueError(f"url has a malformed scheme; {ENCODE_HINT}")
    authority, tail = _split_authority(rest)
    username = password = None
    if "@" in authority:
        auth, authority = authority.rsplit("@", 1)  # an unencoded "@" in a password is kept
        user, _, pwd = auth.partition(":")
        username = unquote(user) or None
        password = unquote(pwd) or None
    # urlsplit does not accept several comma-separated hosts with ports, so split by hand.
    hosts: list[tuple[str, int | None]] = []
    for item in filter(None, authority.split(",")):
        host, port = _split_host(item)
        hosts.append((host, port))
    parts = urlsplit("x://" + tail)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    path = unquote(parts.path)
    if scheme == "unix":
        # unix:///run/redis.sock?db=0: the socket path is the URL path.
        hosts = []
    return ParsedURL(scheme, tuple(hosts), path, username, password, query, url)


ENCODE_HINT: Final = (
    "special characters in user names and passwords must be percent-encoded "
    "(# as %23, / as %2F, ? as %3F, @ as %40, : as %3A)"
)
_SCHEME: Final = re.compile(r"[a-z][a-z0-9+.-]*")


def _split_authority(rest: str) -> tuple[str, str]:
    """``rest`` (after ``scheme://``) split into the authority and the path-query tail.

    The authority ends at the first ``/``, ``?`` or ``#``. A ``#`` or ``@`` after it means
    a user name or password with an unencoded ``/``, ``?`` or ``#`` (the URL would otherwise
    be split inside the password, and a piece of it taken for a host, port, database or
    option, and echoed in a message): refused, quoting nothing of the URL.
    """
    end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    authority, tail = rest[:end], rest[end:]
    if "#" in tail:
        raise ValueError(f"url has a '#' (URLs here take no fragment); {ENCODE_HINT}")
    if "@" in tail:
        raise ValueError(
            "url has an '@' after its host part: a user name or password with an unencoded "
            f"'/' or '?', or an '@' in the path or query (write it as %40); {ENCODE_HINT}"
        )
    return authority, tail


def _split_host(item: str) -> tuple[str, int | None]:
    # Called on the part after the credentials only, so quoting it cannot show them.
    if item.startswith("["):  # [::1]:6379
        host, bracket, tail = item[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ValueError(f"url has a malformed IPv6 host {item!r}; {ENCODE_HINT}")
        port_text = tail[1:]
    else:
        host, _, port_text = item.partition(":")
    if not port_text:
        return host, None
    # Digits checked first, so no int() error (with the text in it) is chained or kept.
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"url has a bad port {port_text!r} for host {host!r}; {ENCODE_HINT}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"url has a port out of range: {port}")
    return host, port
