"""The etcd backend's watch on held keys: one stream per client, a watch id per held key.

A grant adds its key: a create request queued for the client's one Watch stream, from the
grant's listing revision + 1, so a deletion before the watch existed is delivered too. A
release cancels it. A deletion event marks the holder lost at once (``break_lock()``,
``aiodlock break``, any client's delete, the lease revoked or expired). The grant awaits
nothing and costs one message on a stream already open, not a stream, a task and a round
trip of its own (plus a short read, off the grant's path, when the cluster wrote since the
grant's listing: etcd would replay such a deletion to the new watch only at its next 100 ms
sync). When the stream ends (its member failed, lost its leader or was left for
another), it is opened again and every watch created again from its start: deletions in
between are replayed. A watch cancelled by a compaction is answered by a read of the key.

Example::

    held = HeldKeys(conn=require_open, spawn=spawn, lose=leases.mark_lost)
    held.add(entry)       # on a grant
    held.discard(entry)   # on its release or loss
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from aetcd import rpc

from .. import BackendError
from ._conn import EtcdConnection, WatchChannel
from ._entry import Entry
from ._keys import range_request
from ._session import RETRY_PAUSE

__all__ = ["HeldKeys"]

logger = logging.getLogger("aiodlock.etcd")

_DELETIONS_ONLY = [rpc.WatchCreateRequest.FilterType.NOPUT]


class HeldKeys:
    """Watches the keys of held entries on one shared stream (see the module docstring)."""

    __slots__ = (
        "_conn",
        "_entries",
        "_ids",
        "_last_id",
        "_lose",
        "_moved",
        "_outbox",
        "_spawn",
        "_start",
        "_stream",
        "_task",
        "_wakeup",
    )

    def __init__(
        self,
        *,
        conn: Callable[[], EtcdConnection],
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
        lose: Callable[[Entry, str], object],
    ) -> None:
        self._conn = conn  # the open connection (BackendError if the backend is not open)
        self._spawn = spawn
        self._lose = lose
        self._ids: dict[Entry, int] = {}  # watch id per held entry
        self._entries: dict[int, Entry] = {}
        self._start: dict[int, int] = {}  # the revision a watch (re)starts from
        self._last_id = 0
        self._outbox: list[Any] = []  # requests for the stream, in order
        self._wakeup = asyncio.Event()  # the outbox has something
        self._stream: WatchChannel | None = None
        self._task: asyncio.Task[None] | None = None
        self._moved = False  # the stream was left for the new member: reopen at once

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, entry: Entry) -> None:
        """Watch ``entry``'s key for its deletion from its listing on (nothing awaited)."""
        if entry in self._ids:
            return
        self._last_id += 1
        watch_id = self._last_id
        self._ids[entry], self._entries[watch_id] = watch_id, entry
        self._start[watch_id] = entry.revision + 1
        self._send(self._create(watch_id))
        if self._task is None or self._task.done():
            self._task = self._spawn(self._run(), "aiodlock-etcd-held-keys")

    def discard(self, entry: Entry) -> None:
        """Stop watching ``entry``'s key (released, lost). Idempotent."""
        watch_id = self._ids.pop(entry, None)
        if watch_id is None:
            return
        del self._entries[watch_id], self._start[watch_id]
        self._send(rpc.WatchRequest(cancel_request=rpc.WatchCancelRequest(watch_id=watch_id)))

    def restart(self) -> None:
        """The client moved to another member: leave the stream on the old one now (its
        channel closes a moment later), open one on the new member."""
        if self._stream is not None:
            self._moved = True
            self._stream.cancel()

    def _create(self, watch_id: int) -> Any:
        entry = self._entries[watch_id]
        return rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=entry.key,
                start_revision=self._start[watch_id],
                filters=_DELETIONS_ONLY,
                watch_id=watch_id,
            )
        )

    def _send(self, request: Any) -> None:
        self._outbox.append(request)
        self._wakeup.set()

    # ------------------------------------------------------------------ the stream

    async def _run(self) -> None:
        """Keep one stream open and every watch created on it. Runs until cancelled."""
        while True:
            try:
                stream = self._conn().open_watch()
            except BackendError:
                await asyncio.sleep(RETRY_PAUSE)
                continue
            self._stream = stream
            # A new stream knows no watch: create them all again (a cancel meant for the
            # old stream is moot).
            self._outbox = [self._create(watch_id) for watch_id in self._entries]
            self._wakeup.set()
            try:
                await self._serve(stream)
            finally:
                self._stream = None
                stream.cancel()
            logger.debug("etcd: the held keys' watch stream ended; opening another")
            if not self._moved:  # a member that failed us: not again at once
                await asyncio.sleep(RETRY_PAUSE)
            self._moved = False

    async def _serve(self, stream: WatchChannel) -> None:
        """Write the outbox and read the replies until the stream ends. The two halves are
        children of this task (a scope of their own, not background tasks)."""
        async with asyncio.TaskGroup() as group:
            reader = group.create_task(self._read(stream))
            writer = group.create_task(self._write(stream))
            # Either ending ends the stream: the other one stops too.
            reader.add_done_callback(lambda _: writer.cancel())
            writer.add_done_callback(lambda _: reader.cancel())

    async def _write(self, stream: WatchChannel) -> None:
        while True:
            while self._outbox:
                if not await stream.write(self._outbox[0]):
                    return
                self._outbox.pop(0)
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _read(self, stream: WatchChannel) -> None:
        while (reply := await stream.read()) is not None:
            entry = self._entries.get(reply.watch_id)
            if entry is None:
                continue  # cancelled by us meanwhile
            if reply.canceled or reply.compact_revision:
                # Compacted past its start (or refused): a read tells whether it is gone.
                self._spawn(self._check(entry), "aiodlock-etcd-held-check")
            elif reply.events:
                self._lose(entry, "its lock key was deleted")
                self.discard(entry)
            elif reply.created and reply.header.revision >= self._start[reply.watch_id]:
                # The cluster wrote since our listing: etcd replays those writes to a new
                # watch from its background sync, every 100 ms. Is the key gone already? A
                # read answers at once.
                self._spawn(self._confirm(entry), "aiodlock-etcd-held-confirm")

    async def _confirm(self, entry: Entry) -> None:
        """After a watch was created behind the cluster's revision: lost if a read (by the
        member itself) that saw our listing's revision finds the key gone."""
        request = range_request(entry.key, count_only=True, serializable=True)
        try:
            reply = await self._conn().call("_kv", "Range", request)
        except BackendError:
            return  # the watch tells, a moment later
        watch_id = self._ids.get(entry)
        if watch_id is None or reply.count or reply.header.revision < self._start[watch_id]:
            return
        self._lose(entry, "its lock key was deleted")
        self.discard(entry)

    async def _check(self, entry: Entry) -> None:
        """After a watch was cancelled: lost if the key is gone, else watch it again from
        the read's revision on."""
        while entry in self._ids:
            try:
                reply = await self._conn().range(entry.key, count_only=True)
            except BackendError:
                await asyncio.sleep(RETRY_PAUSE)
                continue
            watch_id = self._ids.get(entry)
            if watch_id is None:
                return
            if reply.count == 0:
                self._lose(entry, "its lock key was deleted")
                self.discard(entry)
                return
            self._start[watch_id] = reply.header.revision + 1
            self._send(self._create(watch_id))
            return
