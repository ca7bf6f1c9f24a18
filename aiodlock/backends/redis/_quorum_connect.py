"""Connecting the masters of a Redlock backend: :class:`QuorumConnect` returns from
:meth:`~QuorumConnect.start` once a quorum of the masters has connected, and keeps connecting
the rest in the background.

A master that hangs (SIGSTOPped, a blackholed link) takes the whole ``connect_timeout`` to
fail; waiting for every master would make a new client pay that although a quorum answered
at once. So each master connects in a task of the backend's
:class:`~aiodlock.backends.Tasks` share: ``start()`` returns once a majority is up and every
other master has connected or failed, or :data:`STRAGGLERS` later (it raises
``BackendError`` once a majority can no longer be), and a master whose connect failed
is tried again (capped backoff) until it answers or the backend closes. Until then its
commands fail at once ("not open yet"), which a quorum round counts as that master's refusal.

Example::

    connects = QuorumConnect(sources, load, majority=2, where=url.redacted())
    await connects.start(tasks)  # two of three masters up
    ...
    await connects.aclose()  # before the sources close: no connect lands after that
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import TYPE_CHECKING, Final

from .. import BackendError

if TYPE_CHECKING:
    from .. import Tasks
    from ._node import NodeSource
    from ._source import Prepare

__all__ = ["STRAGGLERS", "QuorumConnect"]

_log = logging.getLogger("aiodlock.redis")

STRAGGLERS: Final = 0.25
"""Seconds :meth:`QuorumConnect.start` still waits for the other masters once a quorum is up:
healthy masters connect within milliseconds of each other, and a client that starts with every
master connected grants on all of them (its first locks do not depend on fewer masters than it
has); a hung master costs this, not ``connect_timeout``."""

_MIN_BACKOFF: Final = 0.1
_MAX_BACKOFF: Final = 2.0
"""Seconds between two connects of a master that failed (doubling from the first, jittered):
a master that refuses is asked again soon after it is back, without a busy loop meanwhile."""


class QuorumConnect:
    """The connects of N masters, a quorum of them awaited (see the module docstring)."""

    __slots__ = (
        "_changed",
        "_failed",
        "_majority",
        "_prepare",
        "_returned",
        "_sources",
        "_tasks",
        "_up",
        "_where",
    )

    def __init__(
        self, sources: list[NodeSource], prepare: Prepare, *, majority: int, where: str
    ) -> None:
        self._sources = sources
        self._prepare = prepare
        self._majority = majority
        self._where = where
        self._up: set[int] = set()  # masters connected
        self._failed: dict[int, Exception] = {}  # master -> how its first connect failed
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()  # a master connected or failed its first connect
        self._returned = False  # start() has returned: the rest connect in the background

    @property
    def connected(self) -> int:
        """How many masters are connected now."""
        return len(self._up)

    async def start(self, tasks: Tasks) -> None:
        """Connect every master in the background; return once a majority is up.

        Raises ``BackendError`` once too many masters failed their first connect for a
        majority to be up (after cancelling the other connects, as :meth:`aclose` does).
        """
        n = len(self._sources)
        for i in range(n):
            task = tasks.spawn(self._connect(i, tasks), f"aiodlock-redlock-connect {i}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            while len(self._up) < self._majority:
                if len(self._failed) - len(self._failed.keys() & self._up) > n - self._majority:
                    raise self._no_quorum()
                self._changed.clear()
                await self._changed.wait()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STRAGGLERS):
                    while len(self._up) + len(self._failed.keys() - self._up) < n:
                        self._changed.clear()
                        await self._changed.wait()
        except BaseException:
            await self.aclose()
            raise
        self._returned = True
        for i in range(n):
            if i not in self._up:
                why = self._failed.get(i)
                _log.warning(
                    "redlock master %s is not connected at open (%s); connecting in the background",
                    self._sources[i].describe(),
                    "no answer yet" if why is None else why,
                )

    def _no_quorum(self) -> BackendError:
        first = next(iter(self._failed.values()))
        up, n = len(self._up), len(self._sources)
        error = BackendError(
            f"redlock: only {up} of {n} masters answered on {self._where} "
            f"(a quorum is {self._majority}): {first}"
        )
        error.__cause__ = first
        return error

    async def _connect(self, i: int, tasks: Tasks) -> None:
        # Until master i is connected (or the backend closes): one connect at a time, each
        # bounded by the source's connect_timeout; after a failure, capped backoff.
        source = self._sources[i]
        delay = _MIN_BACKOFF
        while True:
            try:
                await source.open(tasks, self._prepare)
            except Exception as exc:
                if i not in self._failed:
                    self._failed[i] = exc
                    self._changed.set()
                    if self._returned:  # else start() says it
                        _log.warning(
                            "redlock master %s did not connect: %s; trying again",
                            source.describe(),
                            exc,
                        )
                # Reconnect backoff (jittered), not a lock poll.
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(_MAX_BACKOFF, delay * 2)
                continue
            self._up.add(i)
            self._changed.set()
            if self._returned:
                _log.info("redlock master %s connected", source.describe())
            return

    async def aclose(self) -> None:
        """Cancel the connects still running, and wait for them (a cancelled connect closes
        what it opened). Idempotent."""
        while self._tasks:
            running = list(self._tasks)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
