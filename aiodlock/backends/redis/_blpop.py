"""BLPOP wakeups (``wakeup="blpop"``): :class:`BlockingSignals` and its :class:`BlpopWaiter`.

Each ``wait()`` blocks in ``BLPOP <signal list> <timeout>`` on a connection of its own (one
per waiting acquisition). Arming registers the owner in the list's waiter registry; releases
push a token only while that registry exists, so the wakeup is level-triggered. The scripts
that arm, leave and hand back are the backend's (:class:`SignalCommands`). docs/redis.md
("BLPOP wakeups") has the details.

Example::

    async with signals.waiter(keys.signal, owner, registry=keys.mutex_waiters) as waiter:
        await waiter.wait(timeout=remaining_lease)
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections import Counter
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol

from redis.exceptions import RedisError

from .. import BackendError
from ._scripts import WAIT_SLICE_MS, WAITERS_TTL_MS
from ._source import disconnect_quietly
from ._wait import sleep_on

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from ._source import ConnectionSource

__all__ = ["BlockingSignals", "BlpopWaiter", "SignalCommands"]

_DRAIN_LIMIT: Final = 0.25
"""A waiter that leaves while its BLPOP has at most this long to run lets it finish (and keeps
the connection); a longer one is aborted, which costs the connection."""


class SignalCommands(Protocol):
    """The few commands BLPOP waiters need from the backend (its pool, scripts, errors)."""

    async def arm_waiter(self, registry: bytes, owner: str) -> None:
        """Register ``owner`` in ``registry`` (``WAIT_ARM``); raise ``BackendError``."""
        ...

    async def leave_waiter(self, registry: bytes, lists: tuple[bytes, ...], owner: str) -> None:
        """Deregister ``owner`` (``WAIT_LEAVE``); best effort, never raises."""
        ...

    async def push_back(self, key: bytes, registry: bytes, cap: int) -> None:
        """Hand a wake token back to ``key`` (``SIGNAL_PUSH``); best effort, never raises."""
        ...


class BlockingSignals:
    """Connections and reader tasks for BLPOP waits: one connection per waiting acquisition.

    A waiter first registers its owner id in the list's waiter registry (a ZSET) and only
    then re-checks the lock -- the BLPOP counterpart of a confirmed SUBSCRIBE: a release
    pushes a token only while the registry exists, so a release with nobody waiting writes
    nothing, and the last waiter to leave deletes the registry and any unused tokens.

    The connections are kept apart from the command pool so blocked waiters can never starve
    the releases that would wake them; a few idle ones are kept for reuse. Redis checks BLPOP
    timeouts only ``hz`` times a second (every 100 ms by default), so each BLPOP runs in a
    task of the backend's TaskGroup and ``wait()`` keeps its own, exact timer: when the timer
    fires first, the BLPOP stays in flight for the next ``wait()``, and a token it pops later
    is banked, or handed back if the waiter has left. Long waits are cut into slices of
    ``WAIT_SLICE_MS`` so every live waiter refreshes its registration (and the registry's
    TTL). A refresh never re-creates a registration (``ZADD XX``): one that arrives after the
    waiter's deregistration, on another connection, must not bring it back. So a registry that
    expired under a live waiter (a stall of ``WAITERS_TTL_MS``) stays gone until the next waiter
    arms: meanwhile releases push no token and waiters re-check on their own timers.
    """

    def __init__(
        self,
        source: ConnectionSource,
        commands: SignalCommands,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None] | None],
        clean_up: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None] | None],
        keep_idle: int = 4,
    ) -> None:
        self._source = source
        self._commands = commands
        self._connect_timeout = source.connect_timeout
        # How long past its server-side timeout a BLPOP reply may take: one command's time.
        self._grace = source.request_timeout
        self._spawn = spawn
        self._clean_up = clean_up  # a background task the backend's settle() waits for
        self._where = source.describe()
        self._keep_idle = keep_idle
        # Idle connections by route (the server they reach: see ConnectionSource.route).
        self._idle: dict[str, list[AbstractConnection]] = {}
        self._reads: set[asyncio.Task[None]] = set()
        self.in_use = 0
        self.waiters = 0
        self.closed = False
        self.woken_readers: set[str] = set()
        """Owners of readers that took a token: their next attempt passes one on."""
        self.registered: Counter[bytes] = Counter()
        """Our waiters that may be registered now, per registry (a release tells them from
        others'): counted from the moment their registration is sent until they are granted
        (the grant deregisters them) or their deregistration has run. A waiter of ours that the
        server counts and we do not would pass for another client's, and our release would stay
        out for the courtesy (``MUTEX_RELEASE``) -- refusing that very waiter for 30 ms."""

    def waiter(
        self,
        key: bytes,
        owner: str,
        *,
        registry: bytes | None,
        lists: tuple[bytes, ...] = (),
        cap: int = 1,
        reader: bool = False,
    ) -> BlpopWaiter:
        """A waiter blocking on list ``key``.

        ``registry`` is the waiter ZSET guarding ``lists`` (``None`` for a fair waiter's own
        list, which the fair queue guards); ``cap`` bounds the list when a token is handed
        back; ``reader`` marks a waiting reader, whose next grant passes a token on.
        """
        return BlpopWaiter(self, key, owner, registry, lists, cap, reader)

    def close(self) -> list[AbstractConnection]:
        """Abort every BLPOP in flight; return the idle connections for closing."""
        self.closed = True
        for task in self._reads:
            task.cancel()
        idle, self._idle = self._idle, {}
        return [conn for conns in idle.values() for conn in conns]

    def statistics(self) -> dict[str, int]:
        return {
            "pubsub_connections": 0,
            "subscribed_channels": 0,
            "waiters": self.waiters,
            "blocking_connections": self.in_use + sum(map(len, self._idle.values())),
        }

    async def _acquire(self, key: bytes) -> tuple[str, AbstractConnection]:
        """A connection to the server that holds ``key``, and its route."""
        route = self._source.route(key)
        idle = self._idle.get(route) or []
        while idle:
            conn = idle.pop()
            if conn.is_connected:
                self.in_use += 1
                return route, conn
        conn = self._source.new_connection("blpop", route)
        self.in_use += 1
        try:
            async with asyncio.timeout(self._connect_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException as exc:
            self._release(route, conn, healthy=False)
            if isinstance(exc, RedisError | OSError):
                raise BackendError(
                    f"cannot open a BLPOP connection to {self._where}: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        return route, conn

    def _release(self, route: str, conn: AbstractConnection, *, healthy: bool) -> None:
        self.in_use -= 1
        idle = self._idle.setdefault(route, [])
        if healthy and not self.closed and len(idle) < self._keep_idle:
            idle.append(conn)
        else:
            self._spawn(disconnect_quietly(conn))

    def _give_back(self, key: bytes, registry: bytes | None, cap: int) -> None:
        if registry is not None:  # a fair waiter's list: the core's release re-notifies
            self._clean_up(self._commands.push_back(key, registry, cap))


class BlpopWaiter:
    """One waiting acquisition blocking on a signal list; an async context manager."""

    __slots__ = (
        "_cap",
        "_deadline",
        "_ended",
        "_entered",
        "_flag",
        "_fut",
        "_healthy",
        "_key",
        "_lists",
        "_owes",
        "_owner",
        "_read",
        "_read_until",
        "_reader",
        "_registry",
        "_sigs",
    )

    def __init__(
        self,
        sigs: BlockingSignals,
        key: bytes,
        owner: str,
        registry: bytes | None,
        lists: tuple[bytes, ...],
        cap: int,
        reader: bool,
    ) -> None:
        self._sigs = sigs
        self._key = key
        self._owner = owner
        self._registry = registry
        self._lists = lists
        self._cap = cap
        self._reader = reader
        self._entered = False
        self._flag = False  # a banked token, consumed by the next wait()
        self._owes = False  # took a token that no re-check has used yet
        self._fut: asyncio.Future[None] | None = None
        self._deadline = 0.0  # loop time the current wait() ends (inf: no limit)
        self._read: asyncio.Task[None] | None = None
        self._ended: Callable[[asyncio.Task[None]], None] | None = None  # _read's clean-up
        self._healthy = False  # the last BLPOP task left its connection fit for reuse
        self._read_until = 0.0  # loop time the BLPOP in flight times out on the server

    async def __aenter__(self) -> BlpopWaiter:
        sigs = self._sigs
        if sigs.closed:
            raise BackendError(f"the redis backend for {sigs._where} is closed")
        if self._registry is not None:
            sigs.registered[self._registry] += 1
            try:
                await sigs._commands.arm_waiter(self._registry, self._owner)
            except BaseException:
                # Cancelled or failed with the ZADD maybe applied: undo it in the background.
                self._spawn_leave(counted=True)
                raise
        self._entered = True
        sigs.waiters += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._entered:
            return
        self._entered = False
        sigs = self._sigs
        sigs.waiters -= 1
        granted = exc_type is None  # the core leaves its waiter normally only once granted
        if granted:
            self._uncount()
        if self._reader:
            sigs.woken_readers.discard(self._owner)
        # A token we took and will not use (banked, or cancelled before the re-check): the
        # give-back runs before our deregistration, which may delete the list.
        give_back = self._flag or (self._owes and exc_type is not None)
        self._flag = self._owes = False
        read = self._read
        if read is not None:
            loop = asyncio.get_running_loop()
            if self._read_until - loop.time() > _DRAIN_LIMIT:
                # Aborting loses the connection; the reply may have been a token: hand it back.
                read.cancel()
                give_back = True
            # else: let it run out; a token it pops now is handed back (see _on_token).
        if give_back:
            sigs._give_back(self._key, self._registry, self._cap)
        leave = self._spawn_leave(after=read, counted=not granted)
        if leave is not None and exc_type is not None:
            # Leaving without the lock: wait for the deregistration (shielded, so a second
            # cancellation cannot skip it) so that nothing of ours is left once we are out.
            # Leaving with the lock never waits here: the grant already deregistered us (see
            # _LEAVE_ON_GRANT), and an await after a grant could turn into a lost lease.
            await asyncio.shield(leave)

    def _spawn_leave(
        self, after: asyncio.Task[None] | None = None, *, counted: bool = False
    ) -> asyncio.Task[None] | None:
        """Deregister in the background (``counted``: then stop counting us as registered)."""
        if self._registry is None:
            return None
        task = self._sigs._clean_up(self._leave(after, counted))
        if task is None and counted:
            self._uncount()  # closing: nothing is sent any more
        return task

    async def _leave(self, after: asyncio.Task[None] | None, counted: bool) -> None:
        # The BLPOP task pipelines a refresh (ZADD XX, PEXPIRE) before each BLPOP on its own
        # connection. XX makes a refresh that Redis runs after this deregistration harmless;
        # waiting for the task still keeps the common case in order, and its token accounted.
        try:
            if after is not None:
                await asyncio.wait((after,))
            await self._sigs._commands.leave_waiter(self._registry or b"", self._lists, self._owner)
        finally:
            if counted:
                self._uncount()

    def _uncount(self) -> None:
        registered = self._sigs.registered
        registry = self._registry
        if registry is not None:
            registered[registry] -= 1
            if not registered[registry]:
                del registered[registry]

    async def wait(self, timeout: float | None) -> None:
        """Return when a token was taken (or one is banked), or after ``timeout`` seconds."""
        if self._flag:
            self._flag = False
            return
        self._owes = False
        sigs = self._sigs
        if not self._entered or sigs.closed or (timeout is not None and timeout <= 0):
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._deadline = math.inf if timeout is None else now + timeout
        read = self._read
        if read is not None and read.done() and self._ended is not None:
            # It ended in this loop step (a server-side timeout read while no wait() ran) and
            # its clean-up callback has not run yet: run it now. Counting on a BLPOP that can
            # no longer pop would leave this wait deaf to every release until its own timer.
            read.remove_done_callback(self._ended)
            self._ended(read)
        if self._read is None:
            route, conn = await sigs._acquire(self._key)
            read = sigs._spawn(self._blpop(conn))
            if read is None:
                sigs._release(route, conn, healthy=True)
                return
            # Cleaned up by a callback, not in the task: a task cancelled before its first
            # step never runs its finally clause, and would keep the connection.
            self._ended = functools.partial(self._read_ended, route, conn)
            read.add_done_callback(self._ended)
            self._read = read
            sigs._reads.add(read)
        fut: asyncio.Future[None] = loop.create_future()
        self._fut = fut
        try:
            await sleep_on(fut, timeout)
        finally:
            self._fut = None
        self._flag = False

    def _block_arg(self, now: float) -> str:
        remaining = min(self._deadline - now, WAIT_SLICE_MS / 1000.0)
        # Decimal seconds (Redis >= 6), rounded up to whole ms; never 0, which means forever.
        seconds = max(math.ceil(remaining * 1000.0), 1) / 1000.0
        self._read_until = now + seconds
        return f"{seconds:.3f}"

    async def _blpop(self, conn: AbstractConnection) -> None:
        """Owned task: BLPOP until a token arrives or nobody is waiting any more; sets
        ``_healthy`` when it ends with the connection fit for reuse."""
        sigs = self._sigs
        loop = asyncio.get_running_loop()
        self._healthy = False
        try:
            while True:
                block = self._block_arg(loop.time())
                blpop = ("BLPOP", self._key, block)
                if self._registry is None:
                    await conn.send_command(*blpop, check_health=False)
                    replies = 1
                else:
                    # Refresh our registration on every BLPOP, pipelined: keeps the registry
                    # alive. XX: only while we are still in it. Cancelled with these commands
                    # unread, we are deregistered on another connection, and Redis may run
                    # that WAIT_LEAVE first; a plain ZADD arriving after it would re-create
                    # the registry with nobody left to remove it.
                    reg = self._registry
                    commands = (
                        ("ZADD", reg, "XX", 0, self._owner),
                        ("PEXPIRE", reg, WAITERS_TTL_MS),
                        blpop,
                    )
                    await conn.send_packed_command(conn.pack_commands(commands), False)
                    replies = 3
                async with asyncio.timeout(self._read_until + sigs._grace - loop.time()):
                    for _ in range(replies):
                        reply = await conn.read_response()  # no socket_timeout: unbounded
                if reply is not None:
                    self._on_token()
                    break
                # Timed out on the server. Block again only if a wait() is still running.
                if not (self._entered and self._fut is not None and self._deadline > loop.time()):
                    break
            self._healthy = True
        except (RedisError, OSError):
            # Connection lost or our read limit passed: wake the waiter to re-check (which
            # reports a real outage), and hand back the token the lost reply may have held.
            sigs._give_back(self._key, self._registry, self._cap)
            self._wake()

    def _read_ended(self, route: str, conn: AbstractConnection, read: asyncio.Task[None]) -> None:
        # Also on cancellation (the waiter left, or the backend is closing).
        sigs = self._sigs
        if self._read is read:
            self._read = None
            self._ended = None
        sigs._reads.discard(read)
        sigs._release(route, conn, healthy=self._healthy and not read.cancelled())
        if sigs.closed:
            self._wake()  # let the caller re-check and meet the closed backend

    def _on_token(self) -> None:
        if not self._entered:
            # The waiter left meanwhile: the token is someone else's.
            self._sigs._give_back(self._key, self._registry, self._cap)
            return
        self._owes = True
        if self._reader:
            self._sigs.woken_readers.add(self._owner)
        self._wake()

    def _wake(self) -> None:
        self._flag = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)
