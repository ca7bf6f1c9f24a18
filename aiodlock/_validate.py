"""Argument checks, and the public "use the client's default" marker.

Every check raises at once, on the line that passed the bad value, with a message naming the
argument: ``TypeError`` for a value of the wrong type, ``ValueError`` for a value out of range.
Nothing here knows about locks, clients or backends.

Example::

    ttl = check_seconds(ttl, argument="ttl", allow_none=False)
"""

from __future__ import annotations

import enum
import inspect
import math
import os
import socket
from typing import Any, Final, Literal

__all__ = [
    "IDENTITY_MAX",
    "MAX_NAME_BYTES",
    "MIN_TTL",
    "USE_CLIENT_DEFAULT",
    "UseClientDefault",
    "check_async_callable",
    "check_bool",
    "check_identity",
    "check_limit",
    "check_name",
    "check_namespace",
    "check_seconds",
    "check_timeout",
    "check_ttl",
    "convert_query",
    "default_identity",
]

MAX_NAME_BYTES: Final = 1024

MIN_TTL: Final = 0.02
"""The shortest lease accepted, in seconds. A lease is renewed every ``ttl / 3``, so a ttl
must be several round trips to the service long; below this it would be lost at once."""


class UseClientDefault(enum.Enum):
    """The type of :data:`USE_CLIENT_DEFAULT`: "not given, take the client's setting".

    ``None`` already means "no limit" for ``timeout`` and ``max_hold``, so a distinct marker
    says "not passed". It is an enum so that type checkers narrow it with ``is``::

        def lock(self, name: str, *, timeout: float | None | UseClientDefault = USE_CLIENT_DEFAULT)
    """

    USE_CLIENT_DEFAULT = "USE_CLIENT_DEFAULT"

    def __repr__(self) -> str:
        return "USE_CLIENT_DEFAULT"


USE_CLIENT_DEFAULT: Final = UseClientDefault.USE_CLIENT_DEFAULT
"""Marks an option that was not passed: the client's value (from ``connect()``) applies."""


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
    checked = check_name(namespace, argument="namespace")
    bad = set(checked) & set(":{}")
    if bad:
        raise ValueError(f"namespace must not contain {''.join(sorted(bad))!r}")
    return checked


IDENTITY_MAX: Final = 128
"""Characters of an ``identity`` at most: a host name and a pid, or a pod and a worker."""


def default_identity() -> str:
    """``host:pid`` of this process, the ``identity`` a client stores with its locks unless
    told otherwise. Read at ``connect()``: a client made before a fork keeps the parent's."""
    return f"{socket.gethostname()}:{os.getpid()}"[:IDENTITY_MAX]


def check_identity(identity: object) -> str:
    """An identity is a printable str of 1 to :data:`IDENTITY_MAX` characters, shown to
    operators by ``inspect``; it never names or separates anything, so any printable
    character may appear."""
    if not isinstance(identity, str):
        raise TypeError(f"identity must be a str, not {type(identity).__name__}")
    if not identity or len(identity) > IDENTITY_MAX:
        raise ValueError(f"identity must have 1 to {IDENTITY_MAX} characters, not {len(identity)}")
    if not identity.isprintable():
        raise ValueError(f"identity must be printable text, not {identity!r}")
    return identity


def check_seconds(
    value: object, *, argument: str, allow_none: bool = True, allow_zero: bool = False
) -> float | None:
    """Validate a duration: a finite number of seconds > 0 (``allow_zero``: >= 0), or
    ``None`` (no limit)."""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{argument} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{argument} must be finite, not {seconds}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{argument} must be {'>=' if allow_zero else '>'} 0, not {seconds}")
    return seconds


def check_ttl(value: object) -> float:
    """Validate a lease length: seconds, at least :data:`MIN_TTL`."""
    ttl = check_seconds(value, argument="ttl", allow_none=False)
    assert ttl is not None
    if ttl < MIN_TTL:
        raise ValueError(
            f"ttl must be at least {MIN_TTL} s (and several round trips to the service), "
            f"not {ttl}: the lease is renewed every ttl/3"
        )
    return ttl


def check_timeout(value: object) -> float | None:
    """Validate how long to wait for a lock: seconds, ``0`` (one attempt, do not wait) or
    ``None`` (wait as long as it takes)."""
    return check_seconds(value, argument="timeout", allow_zero=True)


def check_async_callable(fn: object, *, argument: str = "fn") -> None:
    """``fn`` must be an async function (``async def``, or a ``functools.partial`` of one, or
    any callable that returns an awaitable); a plain function is refused before anything runs.
    """
    if not callable(fn):
        raise TypeError(f"{argument} must be an async function, not {type(fn).__name__}")
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        return
    target: Any = fn  # (mypy cannot tell a callable object from a function here)
    plain = inspect.isfunction(target) or inspect.ismethod(target) or inspect.isbuiltin(target)
    if plain and getattr(fn, "__name__", "") != "<lambda>":  # a lambda may return a coroutine
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"{argument} must be an async function, and {name} is a plain function: define it "
            f"with `async def`, or run it in a thread by passing `asyncio.to_thread, {name}`"
        )


def check_limit(limit: object) -> int:
    """A semaphore limit is an int >= 1."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, not {limit}")
    return limit


def check_bool(value: object, *, argument: str) -> bool:
    """A flag must be a real ``bool`` (``reentrant=1`` is a typo, not a request)."""
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be a bool, not {type(value).__name__}")
    return value


def convert_query(key: str, text: str, kind: type) -> Any:
    """Turn one URL query-string value into the option's type (``float``, ``int``, ``bool``)."""
    if kind is bool:
        return _convert_bool(key, text)
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


def _convert_bool(key: str, text: str) -> bool:
    lowered = text.lower()
    truth: dict[str, Literal[True, False]] = {
        "1": True, "true": True, "yes": True, "on": True,
        "0": False, "false": False, "no": False, "off": False,
    }  # fmt: skip
    if lowered not in truth:
        raise ValueError(f"option {key} must be a boolean, not {text!r}")
    return truth[lowered]
