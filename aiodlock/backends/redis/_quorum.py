"""Fan-out bookkeeping shared by the Redlock backend's steps: :class:`Round`, the replies of
one request sent to every master, collected until enough of them are in.

Example::

    rnd = Round([source.submit(lua.run, script, keys, *args) for source in sources])
    await rnd.gather(0.5, lambda r: len(r.replies) >= 2)
    rnd.replies  # master index -> reply, for those that answered in time
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .. import retrieve

__all__ = ["Round"]


class Round:
    """The replies of one fan-out: what each master said (a value, an error, or nothing)."""

    __slots__ = ("errors", "futures", "replies")

    def __init__(self, futures: list[asyncio.Future[Any]]) -> None:
        self.futures = futures
        self.replies: dict[int, Any] = {}
        self.errors: dict[int, BaseException] = {}

    async def gather(self, timeout: float, enough: Callable[[Round], bool]) -> None:
        """Collect replies until ``enough(self)``, every master answered, or ``timeout``."""
        pending = {fut: i for i, fut in enumerate(self.futures)}
        for fut in pending:
            fut.add_done_callback(retrieve)  # a reply we may stop waiting for
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while pending:
            if enough(self):
                return
            left = deadline - loop.time()
            if left <= 0:
                return
            done, _ = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                if fut.cancelled():
                    self.errors[i] = asyncio.CancelledError()
                elif (exc := fut.exception()) is not None:
                    self.errors[i] = exc
                else:
                    self.replies[i] = fut.result()

    def first_error(self) -> BaseException | None:
        return next(iter(self.errors.values()), None)
