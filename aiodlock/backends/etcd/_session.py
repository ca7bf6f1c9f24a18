"""The etcd backend's sessions: a lease per lock ttl in use, kept alive, replaced once lost.

A lock's key lives on the lease of its ``ttl`` (whole seconds, at most ``session_ttl``), so a
crashed holder's keys go ``ttl`` after its last keep-alive, as a Redis key would expire.
Each lease is granted lazily (the ``session_ttl`` one at ``open()``), kept alive every
``ttl / 4``; its grace (``0.75 * ttl`` after the newest answered keep-alive) ends it before
the cluster could expire it. An ended lease is revoked in the background and the next
acquisition grants a new one (docs/etcd.md, "The sessions" and "What breaks").

Each grant puts one key on the new lease, ``<root>/:identity/<lease id>`` = the client's
identity (:func:`._keys.identity_key`), for ``inspect``: it goes with the lease, so nothing
accumulates, and a lock's grant costs nothing more. A lease whose identity key could not be
written is not used: the error is the grant's (docs/etcd.md, "The session identity").

Example::

    sessions = EtcdSessions(settings, "etcd://h1/locks", on_end=lose_every_lock_on)
    session, new = sessions.for_ttl(3.0)   # new: run session.keep(conn) as a task
    lease_id = await session.current(conn)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import Final

from .. import BackendError
from ._conn import EtcdConnection
from ._keys import identity_key
from ._settings import EtcdSettings

__all__ = ["RETRY_PAUSE", "EtcdSession", "EtcdSessions"]

logger = logging.getLogger("aiodlock.etcd")

_GRACE_FRACTION: Final = 0.75
# The core's clock-drift margin (1 % + 2 ms), kept off a lease's expiry for its deadline.
_DRIFT_FRACTION: Final = 0.01
_DRIFT_FLOOR: Final = 0.002
_KEEPALIVE_FRACTION: Final = 0.25
RETRY_PAUSE: Final = 0.1


class EtcdSessions:
    """The client's sessions, one per lease TTL asked for (module docstring)."""

    __slots__ = ("_by_ttl", "_describe", "_on_end", "_settings")

    def __init__(
        self,
        settings: EtcdSettings,
        describe: str,
        *,
        on_end: Callable[[EtcdSession, int, str], None],
    ) -> None:
        self._settings = settings
        self._describe = describe
        self._on_end = on_end
        self._by_ttl: dict[int, EtcdSession] = {}

    def seconds(self, ttl: float) -> int:
        """The lease TTL for locks of ``ttl``: whole seconds, at most ``session_ttl``."""
        return max(1, math.ceil(min(ttl, self._settings.session_ttl)))

    def for_ttl(self, ttl: float) -> tuple[EtcdSession, bool]:
        """The session for locks of ``ttl``, and whether it was made just now (its keeper
        is then the caller's to start)."""
        seconds = self.seconds(ttl)
        session = self._by_ttl.get(seconds)
        if session is not None:
            return session, False
        session = self._by_ttl[seconds] = EtcdSession(
            self._settings, self._describe, seconds, on_end=self._on_end
        )
        return session, True

    @property
    def main(self) -> EtcdSession | None:
        """The ``session_ttl`` session (granted at open), if made yet."""
        return self._by_ttl.get(self.seconds(self._settings.session_ttl))

    def __iter__(self) -> Iterator[EtcdSession]:
        return iter(list(self._by_ttl.values()))


class EtcdSession:
    """One lease: its id (``None`` between a loss and the next grant), the TTL asked for and
    the TTL the cluster granted, and ``contact``, the send time of the newest answered
    keep-alive."""

    __slots__ = (
        "_describe",
        "_grant_lock",
        "_on_end",
        "_settings",
        "contact",
        "grants",
        "lease_id",
        "requested",
        "ttl",
    )

    def __init__(
        self,
        settings: EtcdSettings,
        describe: str,
        requested: int,
        *,
        on_end: Callable[[EtcdSession, int, str], None],
    ) -> None:
        self._settings = settings
        self._describe = describe
        self._on_end = on_end
        self._grant_lock = asyncio.Lock()
        self.lease_id: int | None = None
        self.requested = requested
        self.ttl = requested
        self.contact = 0.0
        self.grants = 0

    @property
    def grace(self) -> float:
        """How long after ``contact`` our locks still surely hold."""
        return self.ttl * _GRACE_FRACTION

    @property
    def heartbeat(self) -> float:
        return max(self.ttl * _KEEPALIVE_FRACTION, 0.05)

    def expiry_deadline(self) -> float:
        """Until when the cluster surely keeps the lease: it expires no earlier than its TTL
        after the leader heard the newest keep-alive, which was sent at ``contact``. The
        core's ``session_deadline``: later than the grace, so a renewal's validity (``ttl``
        from its send) is not cut short by a keep-alive's cadence, and still before the
        cluster could hand the lock on (a paused process never believes it holds longer)."""
        return self.contact + self.ttl * (1 - _DRIFT_FRACTION) - _DRIFT_FLOOR

    def grace_deadline(self) -> float | None:
        """When the grace runs out (``None``: no lease now)."""
        return None if self.lease_id is None else self.contact + self.grace

    def lapse(self) -> None:
        """The grace ran out with no keep-alive answered: the lease counts as lost."""
        self.end(
            self.lease_id,
            f"no keep-alive answered for {self.grace:.3g} s "
            "(the lease may expire before we hear from etcd again)",
        )

    def end(self, lease: int | None, reason: str) -> None:
        """``lease`` is over (if it is still ours): ``on_end(lease, reason)``."""
        if lease is None or lease != self.lease_id:
            return
        self.lease_id = None
        logger.warning("etcd lease %x ended: %s", lease, reason)
        self._on_end(self, lease, reason)

    async def current(self, conn: EtcdConnection) -> int:
        """Our lease, granting a new one if the last one ended."""
        lease = self.lease_id
        if lease is not None:
            return lease
        async with self._grant_lock:
            if self.lease_id is None:
                await self.grant(conn)
            assert self.lease_id is not None
            return self.lease_id

    async def grant(self, conn: EtcdConnection) -> None:
        """A new lease, with our identity key on it; BackendError (the lease unused) if
        either request fails."""
        sent = asyncio.get_running_loop().time()
        reply = await conn.grant(self.requested)
        if reply.error:
            raise BackendError(f"{self._describe}: lease grant refused: {reply.error}")
        lease = int(reply.ID)
        key, identity = identity_key(self._settings.root, lease), self._settings.identity
        try:
            await conn.put(key, identity.encode(), lease=lease)
        except BackendError:
            # Unused, and unkept: it would expire after its TTL with (at most) this key on
            # it. Revoked at once if etcd answers within the request timeout.
            with contextlib.suppress(BackendError):
                await conn.revoke(lease)
            raise
        self.lease_id = lease
        self.ttl = int(reply.TTL)
        self.contact = sent
        self.grants += 1
        if self.ttl > self.requested:
            # etcd's shortest lease is 1.5 x its election timeout: never silent about it.
            logger.warning(
                "etcd lease %x granted with ttl %d s, not the %d s asked for (the cluster's "
                "minimum): locks of ttl %d s outlive a crashed holder by up to %d s",
                reply.ID, reply.TTL, self.requested, self.requested, reply.TTL,
            )  # fmt: skip
        else:
            logger.info(
                "etcd lease %x granted (ttl %d s) on %s", reply.ID, reply.TTL, self._describe
            )

    async def keep(self, conn: EtcdConnection) -> None:
        """Keep the lease alive: a keep-alive every ``ttl / 4``, again at once after a
        failure (on the next member). Runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.heartbeat)
            while (lease := self.lease_id) is not None:
                sent = loop.time()
                try:
                    left = await conn.keep_alive(lease, timeout=self.grace / 2)
                except BackendError as exc:
                    logger.debug("etcd keep-alive failed: %s", exc)
                    await asyncio.sleep(RETRY_PAUSE)
                    continue
                if left <= 0:
                    self.end(lease, "the etcd lease expired or was revoked")
                elif lease == self.lease_id:
                    self.contact = max(self.contact, sent)
                break

    async def revoke(self, conn: EtcdConnection, lease: int) -> None:
        """Revoke an ended lease (its keys must not block anyone), retrying until it surely
        expired by itself."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.ttl + self._settings.request_timeout
        while loop.time() < until:
            try:
                await conn.revoke(lease)
                return
            except BackendError:
                await asyncio.sleep(RETRY_PAUSE)
