"""The keys of acquisitions given up, deleted in the background, many per transaction.

A storm of cancelled acquisitions costs one request per batch of 128 keys (etcd's default
``--max-txn-ops``), not one per key. Until its deletion has surely been seen by every
listing sent before it, a key stays in :attr:`KeyJanitor.leaving`: the queue engine counts
it as gone, so our other entries need not wait for its deletion's watch event.

Example::

    janitor.discard(entry)   # returns at once; a task of the backend deletes the key
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final

from aetcd import rpc

from .. import BackendError
from ._conn import EtcdConnection
from ._entry import Entry
from ._session import RETRY_PAUSE

__all__ = ["KeyJanitor"]

logger = logging.getLogger("aiodlock.etcd")

_BATCH: Final = 128  # etcd's default --max-txn-ops


class KeyJanitor:
    """Deletes the keys of discarded entries (see the module docstring)."""

    __slots__ = ("_conn", "_current", "_lease", "_linger", "_spawn", "_task", "_trash", "leaving")

    def __init__(
        self,
        *,
        conn: Callable[[], EtcdConnection | None],
        lease: Callable[[Entry], int | None],
        current: Callable[[Entry], Entry | None],
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
        linger: float,
    ) -> None:
        self._conn = conn  # the open connection, None once closing
        self._lease = lease  # the lease an entry's key would be on now
        self._current = current  # the entry of the backend's table for an entry's owner
        self._spawn = spawn
        self._linger = linger  # how long a listing sent before a deletion may take
        self._trash: list[Entry] = []
        self._task: asyncio.Task[None] | None = None
        self.leaving: set[bytes] = set()  # our keys being deleted that never held

    def discard(self, entry: Entry) -> None:
        """Delete ``entry``'s key in the background, retrying until done or the lease is
        gone. A key that never held is counted as gone from now on (:attr:`leaving`)."""
        self._trash.append(entry)
        if entry.lost is None:
            self.leaving.add(entry.key)  # never to hold the lock: ours behind it move on now
        if self._task is None or self._task.done():
            self._task = self._spawn(self._empty(), "aiodlock-etcd-janitor")

    async def _empty(self) -> None:
        while self._trash and (conn := self._conn()) is not None:
            batch, self._trash = self._trash[:_BATCH], self._trash[_BATCH:]
            inflight = [e.inflight for e in batch if e.inflight is not None]
            if inflight:
                await asyncio.wait(inflight)  # their keys exist (or not) once they end
            keys: dict[bytes, None] = {}
            for entry in batch:
                entry.inflight = None
                entry.error = None
                newer = self._current(entry)
                if newer is not None and newer is not entry and newer.key == entry.key:
                    continue  # queued again under the same key: that entry owns it now
                if entry.sent and entry.lease_id == self._lease(entry):
                    keys[entry.key] = None
            try:
                if keys:
                    await conn.txn(
                        rpc.TxnRequest(
                            success=[
                                rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=k))
                                for k in keys
                            ]
                        )
                    )
            except BackendError as exc:
                logger.debug("could not delete %d keys yet: %s", len(keys), exc)
                self._trash[:0] = batch
                await asyncio.sleep(RETRY_PAUSE)
                continue
            # A listing sent before the deletion may still show these keys: they stay
            # skipped until any such listing has surely come back.
            loop = asyncio.get_running_loop()
            for entry in batch:
                entry.sent = False
                loop.call_later(self._linger, self.leaving.discard, entry.key)
