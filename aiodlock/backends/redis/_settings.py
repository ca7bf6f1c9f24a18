"""The options of :class:`~._backend.RedisBackend` that are about locks, not about reaching the
server (those are the source's: :mod:`._node_settings`), and the source each URL scheme gets.

Example::

    settings = Settings(parse_url("redis://localhost/0"), {"wakeup": "blpop"})
    settings.mode  # "l": releases push BLPOP tokens
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ..._validate import check_identity, default_identity
from .. import Busy, check_bool, check_seconds
from ._cluster import ClusterSource
from ._node import NodeSource
from ._sentinel import SentinelSource

if TYPE_CHECKING:
    from .. import ParsedURL
    from ._source import ConnectionSource

__all__ = ["OPTIONS", "Settings", "busy", "identity_arg", "lease_ms", "make_source"]

_WAKEUP_MODES: Final = ("pubsub", "blpop")
# A lock name's fencing counter outlives its last grant by this long (see _scripts.next_token).
_DEFAULT_FENCE_TTL: Final = 7 * 24 * 3600.0
# wait_replicas: the longest a grant waits for its replicas (less if request_timeout is short).
_WAIT_MS: Final = 1000
# How long a client that takes a mutex while others wait may keep taking it back (see burst).
_DEFAULT_BURST: Final = 0.01

OPTIONS: Final[Mapping[str, type]] = {
    "wakeup": str,
    "fence_ttl": float,
    "burst": float,
    "wait_replicas": int,
    "keyspace_events": bool,
    "identity": str,  # stored with each grant, for inspect (connect() always passes it)
    # Everything about reaching the server is the source's.
    **SentinelSource.options,
}
"""Every option a Redis URL may carry (the sources' options included)."""


class Settings:
    """The lock options of one backend, checked (see :class:`~._backend.RedisBackend`)."""

    __slots__ = (
        "burst_ms",
        "cluster",
        "fence_ms",
        "identity",
        "keyspace_events",
        "mode",
        "wait_replicas",
        "wakeup",
    )

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        wakeup = options.get("wakeup")
        if wakeup is None:
            wakeup = "pubsub"
        if not isinstance(wakeup, str):
            raise TypeError(f"option wakeup must be a str, not {type(wakeup).__name__}")
        if wakeup not in _WAKEUP_MODES:
            raise ValueError(
                f"option wakeup must be one of {', '.join(map(repr, _WAKEUP_MODES))}, "
                f"not {wakeup!r}"
            )
        self.wakeup: str = wakeup
        self.fence_ms = _option_ms(options, "fence_ttl", _DEFAULT_FENCE_TTL)
        self.burst_ms = _option_ms(options, "burst", _DEFAULT_BURST)
        self.wait_replicas = _check_replicas(options.get("wait_replicas", 0))
        self.cluster = url.scheme == "redis+cluster"
        if self.cluster and self.wait_replicas:
            raise ValueError(f"option wait_replicas is not supported on {url.scheme}://")
        keyspace = options.get("keyspace_events", False)
        check_bool(keyspace, argument="option keyspace_events")
        if keyspace and self.cluster:
            # Key events are published on the node that holds the key only: a client would
            # need a subscription on every master.
            raise ValueError(f"option keyspace_events is not supported on {url.scheme}://")
        self.keyspace_events: bool = bool(keyspace)
        self.identity = identity_arg(options)
        # How releases notify (see _scripts): a cluster publishes to the channel's shard only.
        self.mode = "l" if wakeup == "blpop" else "s" if self.cluster else "p"

    def replicated(self, source: ConnectionSource) -> tuple[int, int] | None:
        """``wait_replicas`` as (replicas, timeout in ms) for a grant, or None."""
        if not self.wait_replicas:
            return None
        # Within a command's deadline, and well within a lease.
        request_ms = int(source.request_timeout * 1000)
        return self.wait_replicas, max(1, min(request_ms // 2, _WAIT_MS))


def identity_arg(options: Mapping[str, Any]) -> bytes:
    """The ``identity`` option as the acquire scripts take it (their last ARGV), encoded once:
    ``connect()`` always passes it; a backend made directly falls back to ``host:pid``."""
    given = options.get("identity")
    return check_identity(default_identity() if given is None else given).encode()


def make_source(url: ParsedURL, options: Mapping[str, Any]) -> ConnectionSource:
    """The connection source of ``url``'s scheme."""
    if url.scheme == "redis+sentinel":
        return SentinelSource(url, options)
    if url.scheme == "redis+cluster":
        return ClusterSource(url, options)
    return NodeSource(url, options)


def _check_replicas(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"option wait_replicas must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"option wait_replicas must be >= 0, not {value}")
    return value


def _option_ms(options: Mapping[str, Any], name: str, default: float) -> int:
    """A seconds option (``fence_ttl``, ``burst``) in whole milliseconds; 0 stays 0 (keep
    fencing counters forever; serve waiting clients strictly in turn)."""
    seconds = check_seconds(
        options.get(name, default), argument=f"option {name}", allow_none=False, allow_zero=True
    )
    assert seconds is not None
    return 0 if seconds == 0 else lease_ms(seconds)


def lease_ms(ttl: float) -> int:
    """``ttl`` in whole milliseconds, rounded up: the server must never expire a lease before
    the client thinks it could."""
    return max(1, math.ceil(ttl * 1000.0))


def busy(ms: int) -> Busy:
    """The refusal of a script that answered the blocking lease's remaining ``ms``."""
    # -1: the blocking key has no TTL (not written by us); only a release can free it.
    if ms == -1:
        return Busy(None)
    # +1 ms so the retry lands after the expiry, never at it; never 0 or negative.
    return Busy(max(ms + 1, 1) / 1000.0)
