"""A level-triggered wakeup for backends that wake their waiters in-process."""

from __future__ import annotations

import asyncio

__all__ = ["BankedWakeup"]


class BankedWakeup:
    """A wakeup that is kept until used: ``wake()`` before ``wait()`` is not lost.

    The memory and ZooKeeper waiters build on it (the protocol's level-triggered rule).
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    @property
    def banked(self) -> bool:
        """A wakeup arrived that no ``wait()`` has consumed yet."""
        return self._event.is_set()

    def wake(self) -> None:
        """Wake the current ``wait()``, or bank the wakeup for the next one."""
        self._event.set()

    async def _consume(self, timeout: float | None) -> bool:
        """Wait for a wakeup (or use the banked one): True if woken, False on timeout."""
        if not self._event.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._event.wait()
            except TimeoutError:
                return False
        self._event.clear()
        return True
