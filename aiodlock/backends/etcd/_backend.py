"""The etcd backend class: the lock protocol on the queue engine, over etcd's keys and leases.

The recipe is etcd's own ``concurrency`` Mutex, ported and extended to every lock kind; the
queue engine (:mod:`..queue`) decides places, :mod:`._transactions` queues, :mod:`._watches`
waits, :mod:`._session` keeps the lease, :mod:`._janitor` deletes what was given up. The
design, the failure table and the options: docs/etcd.md.

Example::

    async with aiodlock.connect("etcd://127.0.0.1:2379/apps?session_ttl=5") as locks:
        async with locks.write_lock("catalog"):
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from .. import (
    BackendError,
    Busy,
    Capability,
    Grant,
    LimitMismatchError,
    LockInfo,
    LockSpec,
    LossSignal,
    ParsedURL,
    Tasks,
    Waiter,
)
from ..queue import QUEUE_CAPABILITIES, Leases, evaluate
from ._conn import EtcdConnection
from ._entry import Entry, EtcdWaiter
from ._held import HeldKeys
from ._inspect import break_holders, inspect, namespaces
from ._janitor import KeyJanitor
from ._keys import directory, range_request
from ._session import EtcdSession, EtcdSessions
from ._settings import OPTIONS, EtcdSettings
from ._transactions import Transactions, recheck
from ._watches import arm, disarm

__all__ = ["EtcdBackend"]

logger = logging.getLogger("aiodlock.etcd")


class EtcdBackend:
    """Locks on an etcd v3 cluster (docs/etcd.md: the recipe, its failures and options).

    Example::

        async with aiodlock.connect("etcd://127.0.0.1:2379/apps?session_ttl=5") as locks:
            async with locks.write_lock("catalog"):
                ...
    """

    # As on ZooKeeper: a refused attempt leaves a key, which this backend deletes itself when
    # no waiter claims it in the same loop step, so the core lets a client's tasks take turns.
    queues_on_busy: ClassVar[bool] = False
    capabilities: ClassVar[frozenset[Capability]] = QUEUE_CAPABILITIES
    options: ClassVar[Mapping[str, type]] = OPTIONS

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        self._settings = EtcdSettings.from_url(url, options)
        self._url = url
        self._root = self._settings.root
        self._state = "new"
        self._conn: EtcdConnection | None = None
        self._tasks: Tasks | None = None
        self._running: set[asyncio.Task[None]] = set()  # cancelled first when closing
        self._cleanups: set[asyncio.Task[None]] = set()  # what settle() waits for
        self._entries: dict[tuple[bytes, str], Entry] = {}
        self._waiters: dict[tuple[bytes, str], EtcdWaiter] = {}
        self._sessions = EtcdSessions(self._settings, self.describe(), on_end=self._session_ended)
        self._leases: Leases[Entry] = Leases(
            logger, name=lambda entry: f"lock key {entry.key!r}", on_reaped=self._discard
        )
        self._janitor = KeyJanitor(
            conn=lambda: self._conn if self._state == "open" else None,
            lease=lambda entry: entry.session.lease_id,
            current=lambda entry: self._entries.get(entry.table_key),
            spawn=self._spawn_cleanup,
            linger=2 * self._settings.request_timeout,
        )
        self._held = HeldKeys(
            conn=self._require_open, spawn=self._spawn, lose=self._leases.mark_lost
        )
        self._transactions = Transactions(
            conn=self._require_open,
            spawn=self._spawn,
            describe=self.describe(),
        )

    # ------------------------------------------------------------------ lifetime

    async def open(self, tasks: Tasks) -> None:
        """Connect to a member that answers and grant the session lease; BackendError if no
        member answers within ``connect_timeout``."""
        if self._state != "new":
            raise RuntimeError(f"{self.describe()} backend was already opened")
        self._state, self._tasks = "opening", tasks
        conn = self._conn = self._connection(tasks)
        limit = self._settings.connect_timeout
        session, _ = self._sessions.for_ttl(self._settings.session_ttl)
        try:
            await conn.open(limit)
            async with asyncio.timeout(limit):
                await session.grant(conn)
        except TimeoutError as exc:
            await self._give_up_opening(conn, tasks)
            raise BackendError(
                f"could not grant a lease on {self.describe()} within {limit:g} s (connect_timeout)"
            ) from exc
        except BaseException:
            await self._give_up_opening(conn, tasks)
            raise
        self._state = "open"
        self._keep(session)

    def _keep(self, session: EtcdSession) -> None:
        """Start ``session``'s keeper and its grace watch (a lease granted lazily is kept
        from its grant on: until then both find no lease and wait)."""
        self._spawn(session.keep(self._require_open()), "aiodlock-etcd-keeper")
        grace = self._leases.watch_grace(
            session.grace_deadline, session.lapse, poll=lambda: session.heartbeat
        )
        self._spawn(grace, "aiodlock-etcd-grace")

    def _session_for(self, ttl: float) -> EtcdSession:
        session, new = self._sessions.for_ttl(ttl)
        if new:
            self._keep(session)
        return session

    def _connection(self, tasks: Tasks) -> EtcdConnection:
        settings = self._settings
        return EtcdConnection(
            settings.endpoints,
            request_timeout=settings.request_timeout,
            credentials=settings.credentials,
            username=self._url.username,
            password=self._url.password,
            describe=self.describe(),
            on_move=self._moved,
            spawn=tasks.try_spawn,
        )

    async def _give_up_opening(self, conn: EtcdConnection, tasks: Tasks) -> None:
        self._state = "closed"
        await conn.close()
        await tasks.aclose()

    async def aclose(self) -> None:
        """Revoke the lease (etcd deletes every key of ours at once) and stop every task."""
        if self._state not in ("opening", "open"):
            if self._state == "new":
                self._state = "closed"  # never opened: nothing to stop
            return
        self._state = "closing"
        for entry in self._entries.values():
            self._leases.cancel_reaper(entry)
        for task in list(self._running):
            task.cancel()  # the background deletions go on while the lease is revoked
        try:
            await self._revoke_and_disconnect()
        finally:
            await self._closed()

    async def _closed(self) -> None:
        """Stop every task of ours, and wake the waiters: they find the backend closed."""
        if self._tasks is not None:
            await self._tasks.aclose()
        self._state = "closed"
        for waiter in self._waiters.values():
            waiter.wake()

    async def _revoke_and_disconnect(self) -> None:
        conn = self._conn
        if conn is None:
            return
        for session in self._sessions:
            lease, session.lease_id = session.lease_id, None
            if lease is not None:
                with contextlib.suppress(BackendError):
                    await conn.revoke(lease, timeout=self._settings.request_timeout)
        await conn.close()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._spawn_into(self._running, coro, name)

    def _spawn_cleanup(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._spawn_into(self._cleanups, coro, name)

    def _spawn_into(
        self, into: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None], name: str
    ) -> asyncio.Task[None]:
        tasks = self._tasks
        if tasks is None or tasks.closed:
            coro.close()
            raise BackendError(f"{self.describe()} backend is closed")
        task = tasks.spawn(coro, name)
        into.add(task)
        task.add_done_callback(into.discard)
        return task

    def _require_open(self) -> EtcdConnection:
        if self._state != "open" or self._conn is None:
            raise BackendError(f"{self.describe()} backend is not open")
        return self._conn

    async def settle(self) -> None:
        """Wait for the background deletions running now (and those they start)."""
        while self._cleanups:
            await asyncio.wait(list(self._cleanups))

    # ------------------------------------------------------------------ description

    def check(self, spec: LockSpec) -> None:
        """Every kind is supported (the FIFO queue makes ``fair=True`` a no-op)."""

    @property
    def request_timeout(self) -> float:
        """Seconds one request may take (the ``request_timeout`` option)."""
        return self._settings.request_timeout

    def describe(self) -> str:
        """The URL without credentials."""
        return self._url.redacted()

    def statistics(self) -> Mapping[str, Any]:
        """Session and recipe counters."""
        conn = self._conn
        main = self._sessions.main
        lease = None if main is None else main.lease_id
        return {
            "state": self._state,
            "endpoint": conn.endpoint if conn is not None else None,
            "lease_id": None if lease is None else f"{lease:x}",  # the session_ttl lease
            "lease_ttl": None if main is None else main.ttl,
            "sessions": {
                s.requested: None if s.lease_id is None else f"{s.lease_id:x}"
                for s in self._sessions
            },
            "entries": len(self._entries),
            "held": sum(1 for e in self._entries.values() if e.held and e.lost is None),
            "waiters": len(self._waiters),
            "watched_keys": len(self._held),
            "leases": sum(s.grants for s in self._sessions),
            "losses": self._leases.losses,
            "member_moves": conn.moves if conn is not None else 0,
        }

    # ------------------------------------------------------------------ protocol

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        """Queue (a key created only if absent, on the lease of ``ttl``) and check our place:
        Grant or Busy(None)."""
        self._require_open()
        key = (directory(self._root, spec), owner)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = Entry(key[0], owner, spec, self._session_for(ttl))
        async with entry.lock:
            if entry.gone:  # left the queue meanwhile (not through the core): queue anew
                return await self.try_acquire(spec, owner, ttl)
            if entry.held:
                return Grant(entry.token) if entry.lost is None else Busy(None)
            lease, leaving = entry.session.lease_id, self._janitor.leaving
            verdict = None
            if not entry.stale and entry.queue and entry.lease_id == lease:
                if entry.deleted:
                    await self._transactions.relist(entry)
                verdict = recheck(entry, entry.session.lease_id, leaving)
            if verdict is None or verdict.granted or verdict.conflict is not None:
                # A grant (or a refusal) is decided on a fresh listing, never on our copy.
                if not await self._transactions.enqueue(entry):
                    return await self.try_acquire(spec, owner, ttl)  # a new entry
                verdict = evaluate(entry.queue, entry.key, leaving=leaving)
            if verdict.conflict is not None:
                # Deleted before we answer: a refused key left behind would make the next
                # contender (of the right limit) meet it and be refused too.
                self._retire(entry)
                try:
                    await self._delete_key(entry)
                except BaseException:
                    self._discard(entry)
                    raise
                raise LimitMismatchError(spec.name, verdict.conflict, spec.limit)
            if verdict.granted:
                entry.held = True
                entry.verdict = None
                entry.token = next(c.seq for c in entry.queue if c.id == entry.key)
                self._leases.schedule_reaper(entry, ttl)
                self._held.add(entry)
                return Grant(entry.token)
            entry.verdict = verdict
            waiter = self._waiters.get(key)
            if waiter is None:
                # Lock.try_acquire() will not wait: unless waiter() is entered right away
                # (the core does so in the same step), our key must not stay.
                asyncio.get_running_loop().call_soon(self._drop_if_unwaited, entry)
            else:
                await arm(waiter, entry, self._require_open(), self._spawn)
            return Busy(None)

    async def release(self, spec: LockSpec, owner: str) -> bool:
        """Delete our key (after any transaction still on its way); True if it was held."""
        if self._state != "open":
            return False
        entry = self._entries.get((directory(self._root, spec), owner))
        if entry is None:
            return False
        if entry.lost is not None or entry.gone:
            if not entry.gone:
                self._retire(entry)
                self._discard(entry)
            return False
        async with entry.lock:
            if _left(entry):  # released by another call meanwhile
                return False
            held = entry.held and entry.lost is None
            self._retire(entry)
            if held:
                try:
                    await self._delete_key(entry)
                except BaseException:
                    self._discard(entry)  # cancelled or failed: finished in the background
                    raise
                return True
            self._discard(entry)  # only queued: nobody waits for the deletion
            return False

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        """Confirm our key exists on our live lease; False once the lease is lost."""
        conn = self._require_open()
        entry = self._entries.get((directory(self._root, spec), owner))
        if entry is None or not entry.holding:
            return False
        if entry.lease_id != entry.session.lease_id:
            self._leases.mark_lost(entry, "its etcd lease ended")
            return False
        timeout = max(entry.session.heartbeat, min(ttl / 3, self._settings.request_timeout))
        reply = await conn.call(
            "_kv", "Range", range_request(entry.key, count_only=True), timeout=timeout
        )
        if entry.lost_event.is_set():
            return False
        if reply.count == 0:
            self._leases.mark_lost(entry, "its lock key was deleted")
            return False
        self._leases.schedule_reaper(entry, ttl)
        return True

    def loss_signal(self, spec: LockSpec, owner: str) -> LossSignal | None:
        """An Event set the moment the held lease of ``owner`` is known to be lost: key
        deleted, lease revoked or expired, keep-alive unanswered for the grace, or ttl passed
        without renewal. ``None`` if ``owner`` holds nothing here."""
        entry = self._entries.get((directory(self._root, spec), owner))
        if entry is None or not entry.held:
            return None
        return entry.lost_event

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """When the lease of ``owner``'s key surely still lives: ``contact`` (the send time of
        the newest answered keep-alive) plus its TTL, less the drift margin. The grace watch
        declares the loss earlier (0.75 x TTL) in a live process; this bounds a paused one.
        ``None`` if ``owner`` holds nothing here."""
        entry = self._entries.get((directory(self._root, spec), owner))
        if entry is None or not entry.held:
            return None
        return entry.session.expiry_deadline()

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        """Arm the watch our last refused attempt chose; leaving by an error drops our key."""
        conn = self._require_open()
        key = (directory(self._root, spec), owner)
        waiter = EtcdWaiter()
        self._waiters[key] = waiter  # before any await: see _drop_if_unwaited
        try:
            entry = self._entries.get(key)
            if entry is not None and not entry.held:
                await arm(waiter, entry, conn, self._spawn)
            yield waiter
        except BaseException:
            entry = self._entries.get(key)
            if entry is not None and not entry.held and not entry.gone:
                self._retire(entry)
                self._discard(entry)
            raise
        finally:
            disarm(waiter)
            if self._waiters.get(key) is waiter:
                del self._waiters[key]

    # ------------------------------------------------------------------ inspect / break

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every lock of ``namespace`` with keys whose name matches ``pattern``: holders with
        their lease's TTL left, the number of waiters, the newest holder's create revision."""
        return await inspect(self._require_open(), self._root, namespace, pattern)

    async def namespaces(self) -> list[str]:
        """The namespaces with keys under our prefix, sorted: a keys-only scan that skips
        each namespace's keys once it is named (see :func:`._inspect.namespaces`)."""
        return await namespaces(self._require_open(), self._root)

    async def break_lock(self, spec: LockSpec) -> int:
        """Delete the key of every holder of ``spec``; the next holder's create revision is
        larger anyway, so a broken holder's fenced writes are refused. Returns how many."""
        return await break_holders(self._require_open(), directory(self._root, spec))

    # ------------------------------------------------------------------ leaving the queue

    async def _delete_key(self, entry: Entry) -> None:
        """Delete our key once the transaction that may create it has ended."""
        task = entry.inflight
        if task is not None:
            await asyncio.wait((task,))
            entry.inflight = None
            entry.error = None
        if entry.key and entry.sent and entry.lease_id == entry.session.lease_id:
            await self._require_open().delete(entry.key)
        entry.sent = False

    def _discard(self, entry: Entry) -> None:
        """Delete our key in the background; our waiters queued behind it move on now."""
        if self._state != "open" or not entry.key:
            return
        if entry.lost is None:
            for waiter in self._waiters.values():
                if waiter.armed is not None and waiter.armed[0] == entry.key:
                    disarm(waiter)
                    waiter.wake()
        self._janitor.discard(entry)

    def _retire(self, entry: Entry) -> None:
        entry.gone = True
        entry.held = False
        entry.verdict = None
        self._leases.cancel_reaper(entry)
        self._held.discard(entry)
        if self._entries.get(entry.table_key) is entry:
            del self._entries[entry.table_key]

    def _drop_if_unwaited(self, entry: Entry) -> None:
        if not entry.gone and not entry.held and entry.table_key not in self._waiters:
            self._retire(entry)
            self._discard(entry)

    # ------------------------------------------------------------------ the session

    def _moved(self) -> None:
        """We talk to another member now: watches on the old one may never fire, so every
        waiter lists again and re-arms, and the held keys' stream opens on the new one."""
        self._held.restart()
        for entry in self._entries.values():
            entry.stale = True
        for waiter in self._waiters.values():
            disarm(waiter)
            waiter.wake()

    def _session_ended(self, session: EtcdSession, lease: int, reason: str) -> None:
        """Every lock on ``lease`` is lost; waiters queue again on a new lease."""
        self._leases.mark_all_lost(self._entries.values(), reason, lambda e: e.lease_id == lease)
        for waiter in self._waiters.values():
            waiter.wake()
        if self._state == "open":
            # If it still lives, its keys must not block anyone: revoke it (deletes them).
            self._spawn_cleanup(session.revoke(self._require_open(), lease), "aiodlock-etcd-revoke")


def _left(entry: Entry) -> bool:
    # A call, not the attribute, so a type checker does not keep it narrowed across awaits.
    return entry.gone
