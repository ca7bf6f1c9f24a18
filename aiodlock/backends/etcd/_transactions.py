"""Queueing on etcd: one transaction creates our key if absent and lists the directory.

The key is a function of the lease and the owner, so a transaction sent again (a lost
reply) finds the key the first one made. A client sends one transaction per directory at a
time, in arrival order; one whose caller gave up before its turn is never sent. A woken
waiter first re-reads its place from its copy of the directory (docs/etcd.md, "Granting and
waiting").

Example::

    if await transactions.enqueue(entry):   # entry.queue: the directory, ours in it
        verdict = evaluate(entry.queue, entry.key)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Set
from typing import Any

from aetcd import rpc

from .. import BackendError
from ..queue import Verdict, evaluate
from ._conn import EtcdConnection
from ._entry import Entry, Line
from ._keys import contenders, range_request

__all__ = ["Transactions", "recheck"]


class Transactions:
    """Sends the transactions and listings of a backend's entries (module docstring)."""

    __slots__ = ("_conn", "_describe", "_lines", "_spawn")

    def __init__(
        self,
        *,
        conn: Callable[[], EtcdConnection],
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
        describe: str,
    ) -> None:
        self._conn = conn  # the open connection (BackendError if the backend is not open)
        self._spawn = spawn
        self._describe = describe
        self._lines: dict[bytes, Line] = {}  # per directory: our transactions take turns

    async def enqueue(self, entry: Entry) -> bool:
        """Make sure our key exists on the current lease of the entry's session; list the
        directory (entry.queue). False if the entry left the queue meanwhile (nothing was
        sent)."""
        for _ in range(4):
            stale = entry.inflight
            if stale is not None:
                # A transaction of an earlier, cancelled call: its listing is old news. Let it
                # end (its key may exist), then send one of our own.
                await asyncio.wait((stale,))
                entry.inflight = None
                entry.error = None
            lease = await entry.session.current(self._conn())
            if entry.lease_id != lease:
                entry.lease_id = lease
                entry.key = entry.directory + f"{lease:x}-{entry.owner}".encode()
            entry.listed = False
            task = entry.inflight = self._spawn(self._transact(entry), "aiodlock-etcd-txn")
            await asyncio.wait((task,))  # a cancelled caller leaves it running
            entry.inflight = None
            error, entry.error = entry.error, None
            if task.cancelled():
                raise BackendError(f"{self._describe} backend was closed")
            if error is None:
                # Not sent if the entry left the queue meanwhile: never decide on an old
                # listing, queue anew instead.
                return entry.listed
            if "lease not found" in str(error):
                entry.session.end(lease, "the etcd lease was not found")
                continue
            raise error
        raise BackendError(f"could not queue on {self._describe}: the lease keeps ending")

    async def relist(self, entry: Entry) -> None:
        """List the directory again with a serializable read (answered by the member
        itself, no consensus round): a waiter woken by a deletion learns at once about
        every other key ahead of it that went meanwhile (in a storm of cancelled waiters,
        walking the queue one watch at a time is far slower)."""
        reply = await self._conn().call(
            "_kv", "Range", range_request(entry.directory, prefix=True, serializable=True)
        )
        entry.queue = contenders(reply.kvs)
        entry.revision = reply.header.revision
        entry.since = entry.revision + 1
        entry.deleted.clear()

    async def _transact(self, entry: Entry) -> None:
        """Our turn in the directory's line, then the transaction (unless given up: in a
        storm of acquisitions cancelled within milliseconds most then cost nothing at the
        service, instead of a transaction and a deletion each, which starved the lease's
        keep-alives on a loaded machine)."""
        line = self._lines.get(entry.directory)
        if line is None:
            line = self._lines[entry.directory] = Line()
        line.users += 1
        try:
            async with line.lock:
                if entry.gone:
                    return  # given up before it was sent: nothing to create
                await self._send(entry)
        finally:
            line.users -= 1
            if not line.users and self._lines.get(entry.directory) is line:
                del self._lines[entry.directory]

    async def _send(self, entry: Entry) -> None:
        conn = self._conn()
        entry.sent = True
        listing = rpc.RequestOp(request_range=range_request(entry.directory, prefix=True))
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    result=rpc.Compare.CompareResult.EQUAL,
                    target=rpc.Compare.CompareTarget.CREATE,
                    key=entry.key,
                    create_revision=0,
                )
            ],
            success=[
                rpc.RequestOp(
                    request_put=rpc.PutRequest(
                        key=entry.key, value=entry.value, lease=entry.lease_id
                    )
                ),
                listing,
            ],
            failure=[listing],
        )
        try:
            reply = await conn.txn(request)
        except BackendError as exc:
            entry.error = exc
            return
        entry.queue = contenders(reply.responses[-1].response_range.kvs)
        entry.revision = reply.header.revision
        entry.listed = True
        entry.stale = False
        entry.deleted.clear()
        entry.since = entry.revision + 1


def recheck(entry: Entry, lease: int | None, leaving: Set[bytes]) -> Verdict[bytes] | None:
    """Our place from our copy of the directory, with no request: ``None`` if the copy
    cannot tell (none yet, stale, or our own key is not in it).

    Keys are only ever added *behind* ours (a larger create revision), so the keys ahead of
    ours are those of our listing minus the deletions since; a listing may come from a member
    that lags (a serializable read) because a waiter's watch starts at the listing's
    revision + 1, so a deletion after it is delivered even if it happened before the watch
    existed. A grant is never decided on the copy: the transaction, which reads the
    leader's state, confirms it.
    """
    if entry.stale or not entry.queue or entry.lease_id != lease:
        return None
    if entry.deleted:
        entry.queue = [c for c in entry.queue if c.id not in entry.deleted]
        entry.deleted.clear()
    if not any(c.id == entry.key for c in entry.queue):
        return None  # our own key was deleted: queue again
    return evaluate(entry.queue, entry.key, leaving=leaving)
