"""The in-process reference backend: every capability, same semantics, no server.

``memory://`` is one store shared by every client in the process (so two clients exclude
each other like two processes would on a server); ``memory://NAME`` is a separate named
store. Leases expire on the event loop's clock exactly as they would on Redis, fencing tokens
come from one counter per store (so they increase per name, and the store keeps nothing for a
name nobody holds or waits for), waiters are woken directly (one per release, all for a writer's
release), and fair locks hand over in arrival order. A semaphore remembers the limit of its
holders and refuses another one (:class:`~aiodlock.LimitMismatchError`) until they are gone.

It is a product feature — embedded default, examples, and unit tests of your own code — and
carries the optional operations an operator (and a fault-injection test) uses:
:meth:`MemoryBackend.inspect` lists the held locks, :meth:`MemoryBackend.break_lock` drops the
holders of a lock as if their leases had expired or the key had been deleted.

Example::

    async with aiodlock.connect("memory://") as locks:
        async with locks.semaphore("pool", limit=2):
            ...
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from . import (
    BankedWakeup,
    Busy,
    Capability,
    Grant,
    HolderInfo,
    Kind,
    LimitMismatchError,
    LockInfo,
    LockSpec,
    LossSignal,
    ParsedURL,
    Tasks,
    Waiter,
)

__all__ = ["MemoryBackend"]

_SLACK: Final = 0.001  # retry just after the blocking lease has run out
_REQUEST_TIMEOUT: Final = 5.0


@dataclass(slots=True)
class _Holder:
    kind: Kind
    expires_at: float
    identity: str
    note: str | None = None  # Noticeboard: dies with the holder
    lost: LossSignal | None = None  # made when the core asks for it (loss_signal)


class _MemoryWaiter(BankedWakeup):
    __slots__ = ("owner", "woken_last")

    def __init__(self, owner: str) -> None:
        super().__init__()
        self.owner = owner
        self.woken_last = False  # the last wait() ended by a wakeup (not by its timeout)

    async def wait(self, timeout: float | None) -> None:
        self.woken_last = False
        self.woken_last = await self._consume(timeout)


@dataclass(slots=True)
class _Entry:
    holders: dict[str, _Holder] = field(default_factory=dict)
    queue: dict[str, float] = field(default_factory=dict)  # fair: owner -> liveness deadline
    waiters: list[_MemoryWaiter] = field(default_factory=list)
    token: int | None = None  # the last fencing token granted here (for inspect)
    limit: int = 0  # semaphore: the limit its holders use (meaningful while it has holders)

    def empty(self) -> bool:
        return not (self.holders or self.queue or self.waiters)

    def purge(self, now: float) -> None:
        for owner in [o for o, h in self.holders.items() if h.expires_at <= now]:
            del self.holders[owner]
        for owner in [o for o, d in self.queue.items() if d <= now]:
            del self.queue[owner]

    def wake_one(self, exclude: _MemoryWaiter | None = None) -> None:
        for waiter in self.waiters:
            if waiter is not exclude and not waiter.banked:
                waiter.wake()
                return

    def wake_all(self) -> None:
        for waiter in self.waiters:
            waiter.wake()

    def wake_owner(self, owner: str) -> None:
        for waiter in self.waiters:
            if waiter.owner == owner:
                waiter.wake()
                return


class _Store:
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, str], _Entry] = {}
        self.last_token = 0  # one counter for every name: nothing is kept per idle name

    def next_token(self) -> int:
        self.last_token += 1
        return self.last_token


_STORES: dict[str, _Store] = {}


def _family(kind: Kind) -> str:
    # A name holds three independent lock families, as on every backend.
    if kind is Kind.MUTEX:
        return "mutex"
    if kind is Kind.SEMAPHORE:
        return "semaphore"
    return "rw"


_KIND_OF = {"mutex": Kind.MUTEX, "semaphore": Kind.SEMAPHORE, "rw": Kind.READ}


class MemoryBackend:
    """In-process backend with every capability (see the module docstring)."""

    # Every capability: its leases are TTL leases, with no session to lose.
    capabilities: ClassVar[frozenset[Capability]] = frozenset(Capability) - {
        Capability.SESSION_LEASE
    }
    options: ClassVar[Mapping[str, type]] = {"identity": str}
    queues_on_busy: ClassVar[bool] = False  # only fair locks queue, and spec.fair says so

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        self._store_name = url.hosts[0][0] if url.hosts else ""
        self._store = _STORES.setdefault(self._store_name, _Store())
        self._waiting = 0
        self._identity: str = options.get("identity", "")

    async def open(self, tasks: Tasks) -> None:
        """Nothing to connect to."""

    async def aclose(self) -> None:
        """Nothing to disconnect."""

    def check(self, spec: LockSpec) -> None:
        """Every kind and option is supported."""

    @property
    def request_timeout(self) -> float:
        """Nothing to wait for in memory: the default of the server backends."""
        return _REQUEST_TIMEOUT

    def describe(self) -> str:
        """``memory://`` plus the store name."""
        return f"memory://{self._store_name}"

    def statistics(self) -> Mapping[str, Any]:
        """Locks with holders or waiters in the store, and this backend's waiters."""
        return {"entries": len(self._store.entries), "waiters": self._waiting}

    # ------------------------------------------------------------------ protocol

    async def try_acquire(self, spec: LockSpec, owner: str, ttl: float) -> Grant | Busy:
        now = asyncio.get_running_loop().time()
        key = self._key(spec)
        entry = self._store.entries.setdefault(key, _Entry())
        entry.purge(now)
        if spec.kind is Kind.SEMAPHORE:
            self._check_limit(entry, spec)
        blockers = self._blockers(entry, spec)
        if spec.fair:
            ahead = next(iter(entry.queue), owner)
            if ahead != owner and not blockers:
                # Free, but promised to the queue's head: wait for it (or for its heartbeat
                # deadline, should it have died).
                blockers = [entry.queue[ahead]]
        if not blockers:
            entry.queue.pop(owner, None)
            entry.holders[owner] = _Holder(spec.kind, now + ttl, self._identity)
            entry.limit = spec.limit
            entry.token = self._store.next_token()
            return Grant(entry.token)
        retry_after = min(blockers) - now + _SLACK
        if spec.fair:
            entry.queue[owner] = now + ttl
            retry_after = min(retry_after, ttl / 3)
        return Busy(max(retry_after, _SLACK))

    async def release(self, spec: LockSpec, owner: str) -> bool:
        key = self._key(spec)
        entry = self._store.entries.get(key)
        if entry is None:
            return False
        entry.purge(asyncio.get_running_loop().time())
        held = entry.holders.pop(owner, None)
        was_head = next(iter(entry.queue), None) == owner
        entry.queue.pop(owner, None)
        if held is not None or was_head:
            self._notify(entry, spec)
        if entry.empty():
            del self._store.entries[key]
        return held is not None

    async def renew(self, spec: LockSpec, owner: str, ttl: float) -> bool:
        now = asyncio.get_running_loop().time()
        entry = self._store.entries.get(self._key(spec))
        if entry is None:
            return False
        entry.purge(now)
        holder = entry.holders.get(owner)
        if holder is None:
            return False
        holder.expires_at = now + ttl
        return True

    async def post_note(self, spec: LockSpec, owner: str, note: str, ttl: float) -> bool:
        """Noticeboard: the note lives on the holder's record, so it ends with the lease."""
        holder = self._live_holder(spec, owner)
        if holder is None:
            return False
        holder.note = note
        return True

    async def read_note(self, spec: LockSpec) -> str | None:
        """Noticeboard: the current holder's note."""
        entry = self._store.entries.get(self._key(spec))
        if entry is None:
            return None
        entry.purge(asyncio.get_running_loop().time())
        return next((h.note for h in entry.holders.values()), None)

    def _live_holder(self, spec: LockSpec, owner: str) -> _Holder | None:
        entry = self._store.entries.get(self._key(spec))
        if entry is None:
            return None
        entry.purge(asyncio.get_running_loop().time())
        return entry.holders.get(owner)

    def loss_signal(self, spec: LockSpec, owner: str) -> asyncio.Event | None:
        """Set when :meth:`break_lock` drops ``owner`` (an expiry is reported by renew())."""
        entry = self._store.entries.get(self._key(spec))
        holder = None if entry is None else entry.holders.get(owner)
        if holder is None:
            return None
        if holder.lost is None:
            holder.lost = LossSignal()
        return holder.lost

    def session_deadline(self, spec: LockSpec, owner: str) -> float | None:
        """None: a memory lease is a TTL lease, bounded by its renewals."""
        return None

    @asynccontextmanager
    async def waiter(self, spec: LockSpec, owner: str) -> AsyncIterator[Waiter]:
        key = self._key(spec)
        entry = self._store.entries.setdefault(key, _Entry())
        waiter = _MemoryWaiter(owner)
        entry.waiters.append(waiter)
        self._waiting += 1
        try:
            yield waiter
        except BaseException:
            if waiter.banked or waiter.woken_last:
                # We were handed a wakeup we will not use: pass it on, or the next waiter
                # would sleep until its cap although the lock may be free.
                entry.wake_one(exclude=waiter)
            raise
        finally:
            self._waiting -= 1
            entry.waiters.remove(waiter)
            if entry.empty() and self._store.entries.get(key) is entry:
                del self._store.entries[key]

    # ------------------------------------------------------------------ operator operations

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every lock of ``namespace`` with holders or waiters whose name matches ``pattern``."""
        now = asyncio.get_running_loop().time()
        found = []
        for (ns, name, family), entry in sorted(self._store.entries.items()):
            entry.purge(now)
            if ns != namespace or entry.empty() or not fnmatch.fnmatchcase(name, pattern):
                continue
            kinds = {holder.kind for holder in entry.holders.values()} or {_KIND_OF[family]}
            kind = Kind.WRITE if Kind.WRITE in kinds else min(kinds, key=lambda k: k.value)
            holders = tuple(
                HolderInfo(owner, max(holder.expires_at - now, 0.0), holder.identity)
                for owner, holder in entry.holders.items()
            )
            # A fair waiter is both in the queue and waiting: count it once.
            waiters = max(len(entry.waiters), len(entry.queue))
            found.append(LockInfo(name, kind, holders, entry.token, waiters))
        return found

    async def namespaces(self) -> list[str]:
        """The namespaces with a holder or a waiter in this store."""
        now = asyncio.get_running_loop().time()
        found = set()
        for (ns, _, _), entry in list(self._store.entries.items()):
            entry.purge(now)
            if not entry.empty():
                found.add(ns)
        return sorted(found)

    async def break_lock(self, spec: LockSpec) -> int:
        """Drop every holder of ``spec``'s lock, as if their leases expired.

        The holders are told at once (their loss signals), so their bodies are cancelled.
        Waiters are woken. Returns how many holders were dropped.
        """
        entry = self._store.entries.get(self._key(spec))
        if entry is None or not entry.holders:
            return 0
        dropped = len(entry.holders)
        holders = list(entry.holders.values())
        entry.holders.clear()
        entry.wake_all()
        for holder in holders:  # told at once, as the server backends tell theirs
            if holder.lost is not None:
                holder.lost.set()
        return dropped

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _key(spec: LockSpec) -> tuple[str, str, str]:
        return (spec.namespace, spec.name, _family(spec.kind))

    @staticmethod
    def _check_limit(entry: _Entry, spec: LockSpec) -> None:
        """Refuse a semaphore limit other than its live holders' (they would over-grant)."""
        if entry.holders and entry.limit != spec.limit:
            raise LimitMismatchError(spec.name, entry.limit, spec.limit)

    @staticmethod
    def _blockers(entry: _Entry, spec: LockSpec) -> list[float]:
        """Expiry times of the holders that keep ``spec`` from being granted now."""
        holders = entry.holders.values()
        if spec.kind is Kind.READ:
            return [h.expires_at for h in holders if h.kind is Kind.WRITE]
        if spec.kind is Kind.SEMAPHORE:
            if len(entry.holders) < spec.limit:
                return []
            return [min(h.expires_at for h in holders)]
        return [h.expires_at for h in holders]

    @staticmethod
    def _notify(entry: _Entry, spec: LockSpec) -> None:
        if spec.fair:
            head = next(iter(entry.queue), None)
            if head is not None:
                entry.wake_owner(head)
            return
        if spec.kind is Kind.WRITE or spec.kind is Kind.READ:
            if not entry.holders:
                entry.wake_all()
        else:
            entry.wake_one()
