"""Who the backend is to ZooKeeper (digest credentials) and who may touch what it creates (ACLs).

ZooKeeper's ``digest`` scheme: a session says ``user:password`` once per connection (the
``auth`` request, see :mod:`._session`) and is known from then on as the identity
``digest:user:<base64 sha1 of "user:password">`` (:func:`digest`). The server never refuses a
digest: a wrong password is only *another* identity, which the nodes of the right one do not
let in. So a wrong password is told two ways: at connect, from the ACL of the chroot when it
names our user with another hash (:func:`names_another_password`); and on any request the
ACLs refuse (``NoAuth``), by an error that says which identity was refused.

Every node the backend creates (contenders, their directories, the chroot levels) gets
:attr:`Settings.acl` (docs/zookeeper.md, "Authentication and ACLs"): with credentials,
:func:`default_acl` is creator-only — ``auth`` (the session's own identity) with every
permission, ``world:anyone`` READ so operators can still look — and without, open to the
world, as before. The ``acl`` option replaces it: ``"scheme:id:perms,..."`` in ZooKeeper's own
notation (:func:`parse_acl`).

Example::

    creds = credentials_from(parse_url("zookeeper://alice:s3cret@zk1/apps"), {})
    creds.identity                     # "digest:alice:..." (never the password)
    parse_acl("auth::cdrwa,digest:" + digest("ops", "pw") + ":rd")
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .. import ParsedURL

__all__ = [
    "ADMIN",
    "ALL",
    "AUTH_OPTIONS",
    "CREATE",
    "DELETE",
    "READ",
    "WRITE",
    "AclEntry",
    "Credentials",
    "credentials_from",
    "default_acl",
    "digest",
    "format_acl",
    "names_another_password",
    "parse_acl",
]

READ: Final = 1
WRITE: Final = 2
CREATE: Final = 4
DELETE: Final = 8
ADMIN: Final = 16
ALL: Final = READ | WRITE | CREATE | DELETE | ADMIN
_LETTERS: Final = {"c": CREATE, "d": DELETE, "r": READ, "w": WRITE, "a": ADMIN}  # zkCli order
_NEEDED: Final = READ | WRITE | CREATE | DELETE
"""What the backend does to its own nodes: list and read, touch, queue, leave."""

AUTH_OPTIONS: Final[Mapping[str, type]] = {"username": str, "password": str, "acl": str}
"""The options of this module (``acl`` also takes a list of entries as a keyword)."""


def digest(user: str, password: str) -> str:
    """The id ZooKeeper's digest scheme gives ``user`` with ``password``: ``user:<hash>``,
    to name that identity in an ACL (``digest:`` + this + ``:perms``) without its password.
    What ZooKeeper's ``DigestAuthenticationProvider`` computes."""
    raw = hashlib.sha1(f"{user}:{password}".encode()).digest()  # ZooKeeper's scheme, not ours
    return f"{user}:{base64.b64encode(raw).decode()}"


@dataclass(frozen=True, slots=True)
class Credentials:
    """A digest user and password; the password never shows in ``repr()``."""

    user: str
    password: str = field(repr=False)

    @property
    def auth(self) -> bytes:
        """The ``auth`` request's payload (ZooKeeper splits it at the first ``:``)."""
        return f"{self.user}:{self.password}".encode()

    @property
    def identity(self) -> str:
        """``digest:user:<hash>``: who the server takes us for."""
        return f"digest:{digest(self.user, self.password)}"

    def describe(self) -> str:
        return f"digest user {self.user!r}"


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One ACL entry: ``scheme:id`` may do ``perms`` (bits READ, WRITE, CREATE...)."""

    scheme: str
    id: str
    perms: int

    def __str__(self) -> str:
        letters = "".join(letter for letter, bit in _LETTERS.items() if self.perms & bit)
        return f"{self.scheme}:{self.id}:{letters}"


def format_acl(entries: Iterable[AclEntry]) -> str:
    """``entries`` in the notation :func:`parse_acl` reads."""
    return ",".join(str(entry) for entry in entries)


def credentials_from(url: ParsedURL, options: Mapping[str, Any]) -> Credentials | None:
    """The URL's ``user:password@`` or the ``username``/``password`` options (not both).

    Raises:
        ValueError: a user without a password or the reverse, both sources given, a user
            name with a ``:`` (ZooKeeper would split it there). No message shows a password.
    """
    from_url = url.username is not None or url.password is not None
    from_options = options.get("username") is not None or options.get("password") is not None
    if from_url and from_options:
        raise ValueError(
            f"{url.redacted()}: credentials in the URL and in the username/password "
            "options: give them one way"
        )
    user = url.username if from_url else options.get("username")
    password = url.password if from_url else options.get("password")
    for name, value in (("username", user), ("password", password)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if user is None and password is None:
        return None
    if not user or not password:
        raise ValueError(
            f"{url.redacted()}: give both a user name and a password "
            "(zookeeper://user:password@host/chroot), or neither"
        )
    if ":" in user:
        raise ValueError(f"{url.redacted()}: a ZooKeeper digest user name cannot contain ':'")
    return Credentials(user, password)


def default_acl(credentials: Credentials | None) -> tuple[AclEntry, ...]:
    """Creator-only (world may read) with credentials; open to the world without."""
    if credentials is None:
        return (AclEntry("world", "anyone", ALL),)
    return (AclEntry("auth", "", ALL), AclEntry("world", "anyone", READ))


def parse_acl(value: object, credentials: Credentials | None) -> tuple[AclEntry, ...]:
    """The ``acl`` option: ``"scheme:id:perms,..."`` (a str) or a list of such entries.

    ``perms`` are letters of ``crwda`` (create, read, write, delete, admin), as in
    ZooKeeper's ``setAcl``; ``None`` gives :func:`default_acl`.

    Raises:
        TypeError: not a str or a list/tuple of str.
        ValueError: a malformed entry, ``auth`` without credentials, or an ACL that does not
            give the client's own identity ``crwd`` (it could not queue, list, touch or
            delete its own nodes).
    """
    if value is None:
        return default_acl(credentials)
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [item.strip() for item in value]
    else:
        raise TypeError(f"acl must be a str or a list of str, not {type(value).__name__}")
    entries = tuple(_entry(item) for item in items if item)
    if not entries:
        raise ValueError("acl is empty: a node nobody may touch could never be released")
    if credentials is None:
        if any(entry.scheme == "auth" for entry in entries):
            raise ValueError("acl entry auth:: needs credentials (zookeeper://user:pw@...)")
        return entries
    ours = 0
    for entry in entries:
        if (
            entry.scheme == "auth"
            or (entry.scheme == "digest" and f"digest:{entry.id}" == credentials.identity)
            or (entry.scheme, entry.id) == ("world", "anyone")
        ):
            ours |= entry.perms
    if ours & _NEEDED != _NEEDED:
        raise ValueError(
            f"acl {format_acl(entries)!r} does not give {credentials.describe()} the "
            "permissions crwd on its own nodes: add auth::cdrwa"
        )
    return entries


def _entry(text: str) -> AclEntry:
    scheme, sep, rest = text.partition(":")
    ident, sep2, letters = rest.rpartition(":")
    if not (sep and sep2 and scheme) or any(c.isspace() for c in text):
        raise ValueError(f"acl entry {text!r} is not scheme:id:perms (e.g. world:anyone:r)")
    perms = 0
    for letter in letters:
        bit = _LETTERS.get(letter)
        if bit is None or perms & bit:
            raise ValueError(f"acl entry {text!r}: perms are letters of crwda, each once")
        perms |= bit
    if not perms:
        raise ValueError(f"acl entry {text!r} grants nothing")
    if scheme == "world" and ident != "anyone":
        raise ValueError(f"acl entry {text!r}: the world scheme's only id is anyone")
    if scheme == "digest" and ":" not in ident:
        raise ValueError(
            f"acl entry {text!r}: a digest id is user:hash "
            "(aiodlock.backends.zookeeper.digest(user, password) computes it)"
        )
    return AclEntry(scheme, ident, perms)


def names_another_password(acl: Iterable[AclEntry], credentials: Credentials) -> bool:
    """Whether a node's ACL (as getACL shows it to us) names our user with another password.

    A digest entry of our user whose hash is not ours is a wrong password. The server shows
    the hash as ``x`` to a session without ADMIN on the node: then it is ours only if the
    entry gives no ADMIN (had it been ours, we would hold ADMIN and see the hash).
    """
    named = [e for e in acl if e.scheme == "digest" and e.id.split(":", 1)[0] == credentials.user]
    if not named or any(f"digest:{e.id}" == credentials.identity for e in named):
        return False
    return any(e.id != f"{credentials.user}:x" or e.perms & ADMIN for e in named)
