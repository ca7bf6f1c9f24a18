"""What a release of the Redis backend needs to know about its owner's attempts:
:class:`Attempts` (one in flight, and for fair locks a place that may be held in a queue).

Example::

    reply = await source.call(attempts.run, lua.MUTEX_ACQUIRE, keys, owner, *args)
    await attempts.landed(owner)  # before the release of owner is sent
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING, Any

from . import _scripts as lua

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["Attempts"]


class Attempts:
    """What a release needs to know about the attempts of its owner: whether one is still in
    flight, and (fair locks) whether one ever reached the server.

    *In flight.* A release waits until its owner's attempt, if one is still running, has
    landed. The core releases right away when an attempt is interrupted, and a command that
    had to queue for a connection goes on without its caller (see :mod:`._node`): sent on
    another connection, the release could reach the server first and find nothing, and the
    attempt would then take the lock, or a place in the fair queue, for nobody.

    *Places in a fair queue.* An owner may hold a place at the server only once its attempt
    has a connection and is about to be sent. The core follows every refused or interrupted
    fair attempt with a release, also when its caller was cancelled while still queued for a
    connection; that release is answered here, without a round trip -- in a storm of
    cancellations most of them are. A place is given up as its release is sent (and taken
    back if that release fails), so the second of two overlapping releases of one owner (the
    core may compensate twice) costs nothing either.
    """

    __slots__ = ("_flight", "_leaving", "_places", "_replicated")

    def __init__(self, replicated: tuple[int, int] | None = None) -> None:
        # (replicas, timeout in ms): a grant returns once that many replicas have it.
        self._replicated = replicated
        self._flight: dict[str, asyncio.Future[None] | None] = {}
        self._places: set[str] = set()
        self._leaving: dict[str, asyncio.Future[Any]] = {}

    async def run(
        self,
        client: aioredis.Redis,
        script: lua.Script,
        keys: tuple[bytes, ...],
        owner: str,
        *args: Any,
    ) -> Any:
        """Run the acquire ``script`` for ``owner`` (by the source, once a connection is ours)."""
        if script is lua.FAIR_ACQUIRE:
            self._places.add(owner)
        flight = self._flight
        flight[owner] = None  # a future only once a release waits for it (rarely)
        try:
            if self._replicated is None:
                return await lua.run(client, script, keys, owner, *args)
            replicas, timeout_ms = self._replicated
            return await lua.run_replicated(
                client, script, keys, owner, *args, replicas=replicas, timeout_ms=timeout_ms
            )
        finally:
            landed = flight.pop(owner, None)
            if landed is not None:
                landed.set_result(None)

    def in_flight(self, owner: str) -> bool:
        """Whether an attempt of ``owner`` is running."""
        return owner in self._flight

    async def landed(self, owner: str) -> None:
        """Return once no attempt of ``owner`` is in flight."""
        flight = self._flight
        if owner not in flight:
            return
        landed = flight[owner]
        if landed is None:
            landed = flight[owner] = asyncio.get_running_loop().create_future()
        await asyncio.shield(landed)

    def leaving(self, owner: str, reply: asyncio.Future[Any]) -> None:
        """``owner`` gave up its place, and the release that leaves the queue is on its way."""
        self._leaving[owner] = reply
        reply.add_done_callback(partial(self._left, owner))

    def _left(self, owner: str, reply: asyncio.Future[Any]) -> None:
        if self._leaving.get(owner) is reply:
            del self._leaving[owner]
        if reply.cancelled() or reply.exception() is not None:
            self._places.add(owner)  # the outcome is unknown: a release must be sent again

    async def left(self, owner: str) -> bool | None:
        """Wait for the release sent by :meth:`leaving`, if any: whether it released the lock,
        or None (none was sent, or it failed: ``owner`` holds its place again)."""
        reply = self._leaving.get(owner)
        if reply is None:
            return None
        if not reply.done():
            await asyncio.wait((reply,))  # neither raises its error nor cancels it
        if reply.cancelled() or reply.exception() is not None:
            self._places.add(owner)
            return None
        return bool(reply.result() == 1)

    def queued(self, owner: str) -> bool:
        """Whether ``owner`` may hold a place in a fair queue (or the fair lock)."""
        return owner in self._places

    def leave(self, owner: str) -> bool:
        """Give up ``owner``'s place before releasing it: ``False`` if it has none (never
        sent, or another release of it is under way or done) and nothing need be sent."""
        if owner not in self._places:
            return False
        self._places.discard(owner)
        return True

    def stay(self, owner: str) -> None:
        """The release of ``owner`` failed or was interrupted: it may still hold its place."""
        self._places.add(owner)
