"""The session guard: keeps the session alive and held leases honest about it.

The pinger keeps ``contact`` (the send time of the newest answered request) fresh and gives
up a connection that heard nothing for two thirds of the session timeout; the grace watch
declares every held lease lost once nothing was answered for ``suspended_grace``, before the
server can expire the session and grant the lock to someone else (docs/zookeeper.md,
"Lease, session and loss").

Example::

    ctx.spawn(guard.pinger(), "aiodlock-zk-pinger")
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from .. import BackendError
from ._cleanup import Cleanup
from ._context import GRACE_FRACTION, ZKContext
from ._errors import ConnectionLoss
from ._leases import Leases
from ._session import CONNECTED, LOST, SUSPENDED
from ._watches import Watches

__all__ = ["SessionGuard"]

logger = logging.getLogger("aiodlock.zookeeper")

_MAX_GRACE_FRACTION: Final = 0.9
_SILENCE_FRACTION: Final = 2 / 3
"""A connection silent for this fraction of the session timeout is given up (see pinger)."""
_MIN_PING_TIMEOUT: Final = 0.05  # the shortest wait for a ping's reply


class SessionGuard:
    """Follows the session's states, pings it, and loses held leases on silence."""

    __slots__ = (
        "_cleanup",
        "_ctx",
        "_leases",
        "_session_id",
        "_watches",
        "kick",
        "reconnects",
        "sessions",
    )

    def __init__(self, ctx: ZKContext, leases: Leases, watches: Watches, cleanup: Cleanup) -> None:
        self._ctx = ctx
        self._leases = leases
        self._watches = watches
        self._cleanup = cleanup
        self._session_id: int | None = None
        self.kick = asyncio.Event()  # ping now (a reconnection)
        self.sessions = 0
        self.reconnects = 0

    def on_state(self, old: str, new: str) -> None:
        """aiozk's session moved (called synchronously from the transport)."""
        if self._ctx.state != "open" or self._ctx.transport is None:
            return
        if new == CONNECTED:
            sid = self._ctx.transport.session_id
            if sid != self._session_id:
                self.new_session(sid)
            else:
                self.reconnects += 1
            self._watches.reset_watches()
            self.kick.set()  # ping now (fresh contact), then clean up
        elif new == LOST:
            self._leases.session_ended("the zookeeper session expired")
            self._watches.reset_watches()
        elif new == SUSPENDED:
            logger.info("zookeeper connection suspended (%s)", self._ctx.describe())

    def new_session(self, sid: int | None) -> None:
        if self._session_id is not None:
            self._leases.session_ended("the zookeeper session ended")
        self._session_id = sid
        self.sessions += 1
        transport = self._ctx.transport
        if transport is not None:
            granted = transport.negotiated_timeout
            grace = granted * GRACE_FRACTION
            if self._ctx.settings.suspended_grace is not None:
                grace = min(self._ctx.settings.suspended_grace, granted * _MAX_GRACE_FRACTION)
            self._ctx.grace = grace

    async def pinger(self) -> None:
        """Keep the session alive and ``contact`` fresh; give up a connection gone silent.

        A ping goes out every ``suspended_grace / 3`` (and at once after a reconnection). Its
        reply may come late without anything being wrong: it queues behind every request
        sent before it, and under load (a cancellation storm) that took more than a second.
        So lateness proves nothing, and the connection is given up only when it has heard
        nothing at all — no reply to any request, no event — for two thirds of the
        negotiated session timeout (ZooKeeper's own client does the same): early enough to
        reach another server of the ensemble while the session still lives there, so that
        our waiters keep their places. (Held leases do not wait for that: the grace watch
        declares them lost after ``suspended_grace``.)
        """
        transport = self._ctx.require_open()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._ctx.heartbeat):
                    await self.kick.wait()
            self.kick.clear()
            if not transport.connected:
                continue
            limit = transport.negotiated_timeout * _SILENCE_FRACTION
            # Wait for the reply until the connection has been silent for ``limit``, counted
            # from the last thing it heard (not from this ping, which may go out up to a
            # heartbeat later): the time left to reach another server is what keeps the session.
            wait = max(limit - transport.silence(), _MIN_PING_TIMEOUT)
            try:
                await transport.ping(timeout=wait)
            except ConnectionLoss:
                if transport.connected and transport.silence() >= limit:
                    logger.info(
                        "nothing heard from zookeeper in %.3g s (2/3 of the session "
                        "timeout): reconnecting",
                        limit,
                    )
                    transport.drop_connection()
            except BackendError:
                pass
            self._cleanup.kick_janitor()

    async def grace_watch(self) -> None:
        """Declare every held lease lost once no answer came for ``suspended_grace``."""
        transport = self._ctx.require_open()
        await self._leases.watch_grace(
            lambda: transport.contact + self._ctx.grace,
            self._on_silence,
            resume=transport.contact_changed,
        )

    def _on_silence(self) -> None:
        reason = self.silence_reason()
        self._leases.mark_held_lost(self._ctx.entries.values(), reason, doom=True)

    def silent_past_grace(self) -> bool:
        """Whether nothing was answered for ``suspended_grace``: held leases are lost."""
        transport = self._ctx.transport
        return (
            transport is not None
            and transport.contact + self._ctx.grace <= asyncio.get_running_loop().time()
        )

    def silence_reason(self) -> str:
        return (
            f"no answer from zookeeper for {self._ctx.grace:.3g} s "
            "(the session may expire before we hear from it again)"
        )
