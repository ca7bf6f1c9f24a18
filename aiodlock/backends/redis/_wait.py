"""What both Redis wakeup mechanisms promise, and the timed sleep they share (:func:`sleep_on`).

A waiting acquisition follows the protocol's *subscribe, then re-check* rule: it first arms a
wakeup, then tries the lock again, then waits. A release that lands between the failed attempt
and the arming is therefore seen by the re-check, and one that lands after the arming is
delivered to the armed wakeup. Arming only counts once the server has it: a SUBSCRIBE that is
merely *sent* is not live yet (redisson#1763 is exactly that race). Every wait is also capped
by the caller (the holder's remaining lease), so even a lost message costs a bounded delay,
never a hang.

Two mechanisms, chosen by the backend's ``wakeup`` option:

- ``pubsub`` (default, :mod:`._pubsub`): one connection per backend carries every
  subscription of the process; 1000 waiters cost exactly one connection.
- ``blpop`` (:mod:`._blpop`): each ``wait()`` blocks in ``BLPOP`` on a connection of its own;
  for where pub/sub is unavailable or filtered.

In both modes a waiter that consumed a single-waiter wakeup and then leaves with an exception
(cancelled or timed out before its re-check could use it) hands the wakeup on, so one
cancellation cannot strand the other waiters until their caps run out.
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
