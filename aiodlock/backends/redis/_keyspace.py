"""``keyspace_events=True``: checking that the server sends ``del`` key events, and reading a
key again after one (see :mod:`._losses` for how the events tell a holder).

Example::

    channel = await check_keyspace_events(client, "redis://10.0.0.5:6379/0")
    # b"__keyevent@0__:del"
    still_ours = await holds(source, key, spec, owner)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import RedisError

from .. import BackendError, Kind, LockSpec

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ._source import ConnectionSource

__all__ = ["KEYSPACE_FLAGS", "check_keyspace_events", "holds", "holds_on"]

KEYSPACE_FLAGS: Final = "Eg"
"""The ``notify-keyspace-events`` classes ``keyspace_events=True`` needs: key events (``E``)
of the generic commands (``g``: ``DEL``); ``A`` stands for every class."""


async def check_keyspace_events(client: aioredis.Redis, where: str) -> bytes:
    """The ``del`` key-event channel of ``client``'s database; ``BackendError`` saying what to
    set if the server does not send those events (or refuses ``CONFIG GET``)."""
    try:
        config = await client.config_get("notify-keyspace-events")
    except RedisError as exc:
        raise BackendError(
            f"keyspace_events=True needs CONFIG GET on {where} to check "
            f"notify-keyspace-events, which the server refused ({exc}); set it to include "
            f"'{KEYSPACE_FLAGS}' and allow CONFIG GET, or drop keyspace_events"
        ) from exc
    flags = text(next(iter(config.values()), ""))
    if "E" not in flags or not ("g" in flags or "A" in flags):
        raise BackendError(
            f"keyspace_events=True needs the server's notify-keyspace-events to include "
            f"'{KEYSPACE_FLAGS}' (key events of DEL), but it is {flags!r} on {where}: "
            f"run CONFIG SET notify-keyspace-events {flags}{KEYSPACE_FLAGS} (and keep it "
            f"in redis.conf), or drop keyspace_events"
        )
    db = int(client.connection_pool.connection_kwargs.get("db", 0) or 0)
    return f"__keyevent@{db}__:del".encode()


async def holds(source: ConnectionSource, key: bytes, spec: LockSpec, owner: str) -> bool:
    """Whether ``owner`` still holds its lease in ``key`` (read again after a ``del`` event:
    the event may be an older holder's release, heard after our grant)."""
    return bool(await source.call(holds_on, key, spec, owner))


async def holds_on(client: aioredis.Redis, key: bytes, spec: LockSpec, owner: str) -> bool:
    """:func:`holds` on one connection (a Redlock master's, in a quorum read)."""
    if spec.kind in (Kind.MUTEX, Kind.WRITE):
        value = await client.get(key)
        return value is not None and text(value) == owner
    return await client.zscore(key, owner) is not None


def text(value: Any) -> str:
    """A reply as text (redis-py answers bytes unless decoding)."""
    return value.decode() if isinstance(value, bytes) else str(value)
