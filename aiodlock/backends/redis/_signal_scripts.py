"""The commands BLPOP waiters need (:class:`~._blpop.SignalCommands`), run like every lock
step of the Redis backend: :class:`SignalScripts`.

Example::

    signals = BlockingSignals(source, SignalScripts(source), spawn=spawn, clean_up=clean_up)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from .. import BackendError
from . import _scripts as lua
from ._slots import wait_outcome

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ._source import ConnectionSource

__all__ = ["SignalScripts"]


class SignalScripts:
    """The commands BLPOP waiters need (:class:`~._blpop.SignalCommands`), run like every
    lock step: on a command connection of the source, bounded, errors translated."""

    __slots__ = ("_arming", "_errors", "_source")

    def __init__(self, source: ConnectionSource) -> None:
        self._source = source
        self._errors = source.errors("wakeup")
        # (registry, owner) -> resolved once its WAIT_ARM in flight has landed.
        self._arming: dict[tuple[bytes, str], asyncio.Future[None]] = {}

    async def arm_waiter(self, registry: bytes, owner: str) -> None:
        """Register ``owner`` in ``registry`` (``WAIT_ARM``); raise ``BackendError``.

        Run in a task of the source, so that once sent it lands even if the caller gives
        up, and a deregistration of the same owner waits for it rather than overtaking it
        on another connection (which would leave the registry behind).
        """
        with self._errors:
            await wait_outcome(self._source.submit(self._arm, registry, owner))

    async def _arm(self, client: aioredis.Redis, registry: bytes, owner: str) -> None:
        key = (registry, owner)
        landed = self._arming[key] = asyncio.get_running_loop().create_future()
        try:
            await lua.run(client, lua.WAIT_ARM, (registry,), owner, lua.WAITERS_TTL_MS)
        finally:
            if self._arming.get(key) is landed:
                del self._arming[key]
            landed.set_result(None)

    async def leave_waiter(self, registry: bytes, lists: tuple[bytes, ...], owner: str) -> None:
        """Deregister ``owner`` (``WAIT_LEAVE``), once its registration has landed; best
        effort, never raises."""
        landed = self._arming.get((registry, owner))
        if landed is not None:
            await asyncio.wait((landed,))
        # Best effort: the registry's TTL bounds what a failed deregistration leaves.
        with contextlib.suppress(BackendError, RedisError, OSError):
            await self._source.call(lua.run, lua.WAIT_LEAVE, (registry, *lists), owner)

    async def push_back(self, key: bytes, registry: bytes, cap: int) -> None:
        """Hand a wake token back to ``key`` (``SIGNAL_PUSH``); best effort, never raises."""
        # Best effort: the waiters' caps bound what a lost token costs.
        with contextlib.suppress(BackendError, RedisError, OSError):
            await self._source.call(lua.run, lua.SIGNAL_PUSH, (key, registry), cap)
