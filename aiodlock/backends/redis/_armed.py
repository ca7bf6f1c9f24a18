"""A wakeup whose arming the Redis backend follows: :class:`ArmedWaiter`.

Example::

    waiter = ArmedWaiter(hub.waiter(channel, owner), joined=on_armed, leave=on_failed)
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

__all__ = ["ArmedWaiter"]


class Wakeup(Protocol):
    """A waiter of :mod:`._pubsub`, :mod:`._sharded` or :mod:`._blpop`."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def wait(self, timeout: float | None) -> None: ...


class ArmedWaiter:
    """A wakeup whose arming the backend follows: ``joined`` is called once it is armed,
    ``leave`` (if any) when it is left with an exception (a fair waiter leaves its queue)."""

    __slots__ = ("_inner", "_joined", "_leave")

    def __init__(
        self,
        inner: Wakeup,
        joined: Callable[[], None],
        leave: Callable[[], None] | None,
    ) -> None:
        self._inner = inner
        self._joined = joined
        self._leave = leave

    async def __aenter__(self) -> ArmedWaiter:
        await self._inner.__aenter__()
        self._joined()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self._leave is not None:
            self._leave()
        await self._inner.__aexit__(exc_type, exc, tb)

    async def wait(self, timeout: float | None) -> None:
        """Return when woken (or a wakeup was banked), or after ``timeout`` seconds."""
        await self._inner.wait(timeout)
