"""What both Redis wakeup mechanisms promise, and the timed sleep they share (:func:`sleep_on`).

A waiting acquisition arms a wakeup (confirmed by the server), re-checks the lock, then waits,
capped by the holder's remaining lease; a waiter that leaves with a single-waiter wakeup it did
not use hands it on. The mechanisms are :mod:`._pubsub` (default) and :mod:`._blpop`;
docs/redis.md ("Waiting") has the reasoning.

Example::

    await sleep_on(future, timeout)  # until a wakeup sets the future, or timeout seconds
"""

from __future__ import annotations

import asyncio

__all__ = ["sleep_on"]


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def sleep_on(fut: asyncio.Future[None], timeout: float | None) -> None:
    """Wait until ``fut`` is resolved by a wakeup, or ``timeout`` seconds, whichever is first."""
    handle = None if timeout is None else fut.get_loop().call_later(timeout, _resolve, fut)
    try:
        await fut
    finally:
        if handle is not None:
            handle.cancel()
