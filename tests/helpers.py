"""Small helpers shared by the backend-specific test modules (no driver, no server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["wait_until"]


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition that no event reports (a waiter queued on a remote service)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but the condition
            await asyncio.sleep(0.001)
