"""What the Redis backend offers besides lock steps: the noticeboard (``post_note``,
``read_note``) and the operators' ``inspect``, ``namespaces`` and ``break_lock``:
:class:`Operator`.

Example::

    operator = Operator(source, mode="p", fence_ms=0)
    await operator.inspect("locks", "order:*")  # [LockInfo(...), ...]
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any

from .. import HolderInfo, Kind, LockInfo
from . import _scripts as lua
from ._keys import (
    ANY_NAMESPACE_MATCH,
    HELD_SUFFIXES,
    break_args,
    broken_channel,
    keys_for,
    namespace_in_use,
    namespace_match,
    split_key,
)
from ._settings import lease_ms

if TYPE_CHECKING:
    from .. import LockSpec
    from ._source import ConnectionSource

__all__ = ["Operator", "lock_infos"]


class Operator:
    """Notes, inspection and force-release on one source (see the module docstring)."""

    __slots__ = ("_break", "_fence_ms", "_inspect", "_mode", "_note", "_source")

    def __init__(self, source: ConnectionSource, *, mode: str, fence_ms: int) -> None:
        self._source = source
        self._mode = mode  # how BREAK wakes the waiters, as a release would
        self._fence_ms = fence_ms
        self._note = source.errors("note")
        self._inspect = source.errors("inspect")
        self._break = source.errors("break")

    async def post_note(self, spec: LockSpec, owner: str, note: str, ttl: float) -> bool:
        """Noticeboard: ``T:note`` holds ``owner`` and the note; ``False`` if not held."""
        keys = keys_for(spec.namespace, spec.name)
        with self._note:
            done = await self._source.call(
                lua.run, lua.NOTE_POST, (keys.mutex, keys.note), owner, note, lease_ms(ttl)
            )
        return bool(done == 1)

    async def read_note(self, spec: LockSpec) -> str | None:
        """Noticeboard: the note of the mutex's current holder, if it posted one."""
        keys = keys_for(spec.namespace, spec.name)
        with self._note:
            note = await self._source.call(lua.run, lua.NOTE_READ, (keys.mutex, keys.note))
        if note is None or isinstance(note, str):  # str: an app's client with decode_responses
            return note
        return bytes(note).decode("utf-8", "surrogatepass")

    async def inspect(self, namespace: str, pattern: str = "*") -> list[LockInfo]:
        """Every held lock of ``namespace`` whose name matches ``pattern``, sorted by name.

        Walks the namespace's keys with ``SCAN`` (every primary, through the source), then
        reads each name's families in one read-only script (:data:`~._scripts.INSPECT`).
        Holders carry their remaining lease; waiters are counted where the service can tell
        (a fair queue, BLPOP waiter registries), else ``None``.
        """
        names: set[str] = set()
        async for key in self._source.scan_iter(namespace_match(namespace)):
            split = split_key(namespace, key)
            if split is not None and split[1] in HELD_SUFFIXES:
                names.add(split[0])
        found: list[LockInfo] = []
        for name in sorted(n for n in names if fnmatch.fnmatchcase(n, pattern)):
            keys = keys_for(namespace, name)
            with self._inspect:
                reply = await self._source.call(lua.run, lua.INSPECT, keys.inspect)
            found.extend(lock_infos(name, reply))
        return found

    async def namespaces(self) -> list[str]:
        """The namespaces with a lock held or waited for, sorted: one ``SCAN`` of every
        primary (through the source) for keys that start with ``{``, kept if the key is a
        holder's, a fair queue or a waiter registry (:func:`~._keys.namespace_in_use`); a
        fencing counter alone does not count."""
        found: set[str] = set()
        async for key in self._source.scan_iter(ANY_NAMESPACE_MATCH):
            namespace = namespace_in_use(key)
            if namespace is not None:
                found.add(namespace)
        return sorted(found)

    async def break_lock(self, spec: LockSpec) -> int:
        """Force-release: delete every holder of ``spec``'s family and move its fencing
        counter on, in one script (:data:`~._scripts.BREAK`); waiters are woken as by a
        release. The script publishes the dropped owners on the namespace's broken channel,
        where their clients listen (:mod:`._losses`): their bodies are cancelled at once. A
        client that missed it (not listening yet, reconnecting) hears it from its next
        renewal, which is refused."""
        keys = keys_for(spec.namespace, spec.name)
        family, family_keys = break_args(spec.kind, keys)
        channel = broken_channel(spec.namespace)
        with self._break:
            dropped, _ = await self._source.call_first(
                lua.run, lua.BREAK, family_keys, family, self._mode, channel, self._fence_ms
            )
        return int(dropped)


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)


def _identity(value: Any) -> str | None:
    """A stored identity; ``None`` for a holder granted by an older client, which stored none."""
    return None if value is None else _text(value)


def _members(flat: list[Any], now: int, identities: list[Any]) -> tuple[HolderInfo, ...]:
    """ZSET ``member, expiry ms, ...`` pairs as holders with their remaining lease, and their
    identities (one per member, in the same order)."""
    return tuple(
        HolderInfo(
            _text(flat[i]), max(float(flat[i + 1]) - now, 0.0) / 1000, _identity(identities[i // 2])
        )
        for i in range(0, len(flat), 2)
    )


def lock_infos(name: str, reply: list[Any]) -> list[LockInfo]:
    """The families of ``name`` held now, from an :data:`~._scripts.INSPECT` reply (one
    node's; Redlock reads every master's so)."""
    now, fence, owner, pttl, mutex_waiting, writer, writer_pttl, readers, rw_waiting = reply[:9]
    permits, sem_waiting = reply[9], reply[10]
    owner_id, writer_id, reader_ids, permit_ids = reply[11:15]
    token = None if fence is None else int(fence)
    found = []

    def waiting(count: int) -> int | None:
        return int(count) or None  # pub/sub waiters are invisible to the server: unknown

    if owner is not None:
        holder = HolderInfo(_text(owner), max(int(pttl), 0) / 1000, _identity(owner_id))
        found.append(LockInfo(name, Kind.MUTEX, (holder,), token, waiting(mutex_waiting)))
    if writer is not None:
        holder = HolderInfo(_text(writer), max(int(writer_pttl), 0) / 1000, _identity(writer_id))
        found.append(LockInfo(name, Kind.WRITE, (holder,), token, waiting(rw_waiting)))
    elif readers:
        readers_held = _members(readers, now, reader_ids)
        found.append(LockInfo(name, Kind.READ, readers_held, token, waiting(rw_waiting)))
    if permits:
        holders = _members(permits, now, permit_ids)
        found.append(LockInfo(name, Kind.SEMAPHORE, holders, token, waiting(sem_waiting)))
    return found
