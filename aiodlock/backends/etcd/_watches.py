"""The etcd backend's waiter watches: each on the deletion its verdict chose (a holder's
watch on its own key is :mod:`._held`'s).

Watches start at the listing's revision + 1, so a deletion between the listing and the watch
is delivered too; one that ends, is cancelled or finds its revision compacted wakes the
waiter, which checks again (level-triggered, banked wakeups: docs/etcd.md).

Example::

    await arm(waiter, entry, conn, spawn)   # waiter.wake() on the deletion that matters
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from .. import BackendError
from ._conn import EtcdConnection, WatchStream
from ._entry import Entry, EtcdWaiter

__all__ = ["arm", "disarm"]

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]


async def arm(waiter: EtcdWaiter, entry: Entry, conn: EtcdConnection, spawn: Spawn) -> None:
    """Watch the deletion the last check chose, from the listing's revision on."""
    verdict = entry.verdict
    if verdict is None or (verdict.watch is None and not verdict.ahead):
        return
    # A key is watched from the listing on (a deletion before the watch is still
    # delivered); the directory from after the newest deletion our copy has seen.
    prefix = verdict.ahead
    watched = entry.directory if prefix else verdict.watch
    assert watched is not None
    start = entry.since if prefix else entry.revision + 1
    target = (watched, start)
    if waiter.armed == target:
        return
    disarm(waiter)
    waiter.armed = target
    try:
        stream = await conn.watch(watched, start_revision=start, prefix=prefix)
    except BackendError:
        waiter.armed = None
        entry.stale = True
        waiter.wake()  # check again (that attempt reports a cluster that is gone)
        return
    except BaseException:
        waiter.armed = None
        raise
    waiter.task = spawn(_wake_on(stream, waiter, entry, prefix), "aiodlock-etcd-watch")


async def _wake_on(stream: WatchStream, waiter: EtcdWaiter, entry: Entry, prefix: bool) -> None:
    try:
        deleted = await stream.wait()
        if deleted is None:
            entry.stale = True  # no telling what changed: list again
        else:
            entry.deleted.update(deleted)
            if prefix:  # it saw every deletion in the directory up to here
                entry.since = max(entry.since, stream.revision + 1)
        waiter.armed = None
        waiter.wake()
    finally:
        stream.cancel()


def disarm(waiter: EtcdWaiter) -> None:
    """Stop ``waiter``'s watch, if it has one."""
    waiter.armed = None
    task, waiter.task = waiter.task, None
    if task is not None:
        task.cancel()
