"""Small helpers shared by the backend-specific test modules (no driver, no server)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["eventually", "wait_until"]


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition that no event reports (a waiter queued on a remote service)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but the condition
            await asyncio.sleep(0.001)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> float:
    """Poll ``check``, a server-side condition nothing notifies us of (a probe's view, a key
    expiring); return the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 - the server notifies nobody of these
            await asyncio.sleep(0.005)
    return loop.time() - started
