"""A contender node's way into the queue: created once, listed, adopted after a lost reply.

A create is never resent behind our back and runs in a task of ours, so a caller cancelled
meanwhile does not lose its reply; a reply lost with its connection leaves the node unknown
(``uncertain``), found later by the uuid in its name and adopted if it is of our session
(docs/zookeeper.md, "Lost replies and cancellation").

Example::

    names = await nodes.enqueue(entry, transport)  # our node exists; the directory's listing
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from .. import BackendError
from ._context import ZKContext
from ._errors import ConnectionLoss, NodeExistsError, NoNodeError, NotConnected
from ._layout import seq
from ._state import Entry
from ._transport import ZKTransport

__all__ = ["ANY_SESSION", "Nodes"]

logger = logging.getLogger("aiodlock.zookeeper")

_ENQUEUE_ATTEMPTS: Final = 6
ANY_SESSION: Final = -1  # a create was sent while the session was changing: sweep any


class Nodes:
    """Creates, lists and adopts the contender nodes of the backend's entries."""

    __slots__ = ("_ctx", "adopted")

    def __init__(self, ctx: ZKContext) -> None:
        self._ctx = ctx
        self.adopted = 0  # nodes found by uuid after a lost create reply, and kept

    async def children(
        self, transport: ZKTransport, directory: str, *, wait: bool = True
    ) -> list[str]:
        try:
            return await transport.children(directory, wait=wait, timeout=self._ctx.request_timeout)
        except NoNodeError:
            return []

    async def enqueue(self, entry: Entry, transport: ZKTransport) -> list[str]:
        """Make sure our node exists in the current session; return the directory listing."""
        for _ in range(_ENQUEUE_ATTEMPTS):
            if entry.name is not None and entry.creating is None:
                names = entry.listing
                entry.listing = None
                if names is None or entry.name not in names:
                    names = await self.children(transport, entry.directory)
                if entry.name in names and entry.session_id == transport.session_id:
                    await self._drop_strays(entry, transport, names)
                    return names
                entry.name = None  # deleted under us, or gone with an ended session
            if entry.uncertain and entry.creating is None:
                names = await self.children(transport, entry.directory)
                if await self._adopt(entry, transport, names):
                    return [n for n in names if n == entry.name or not n.startswith(entry.protect)]
            try:  # (a create still on its way, from a cancelled call, is waited for instead)
                await self._create(entry, transport)
            except ConnectionLoss:
                # The create may have happened: find it by our uuid once we are back,
                # instead of creating a second node that would block our own queue.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._ctx.request_timeout):
                        await transport.wait_connected()
        raise BackendError(
            f"could not queue for {entry.directory!r} on {self._ctx.describe()} "
            f"after {_ENQUEUE_ATTEMPTS} attempts"
        )

    async def _create(self, entry: Entry, transport: ZKTransport) -> None:
        """Create our node (never resent), in a task of ours: a caller cancelled while the
        request is on its way does not lose the reply, so whoever removes the entry waits
        for it and deletes the node by name — no listing of the directory. Only a reply lost
        with its connection leaves the node unknown (``uncertain``: found by uuid later)."""
        task = entry.creating
        if task is None:
            task = self._ctx.spawn(self._create_node(entry, transport), "aiodlock-zk-create")
            entry.creating = task
        await self.created(entry)

    async def created(self, entry: Entry) -> None:
        """Wait for the entry's create to end (not cancelling it) and take its outcome."""
        task = entry.creating
        if task is None:
            return
        await asyncio.wait((task,))  # a cancelled caller leaves the create running
        entry.creating = None
        error, entry.create_error = entry.create_error, None
        if task.cancelled():  # the backend is closing
            raise BackendError(f"{self._ctx.describe()} backend was closed")
        if error is not None:
            raise error

    async def _create_node(self, entry: Entry, transport: ZKTransport) -> None:
        base = f"{entry.directory}/{entry.prefix}"
        try:
            for _ in range(_ENQUEUE_ATTEMPTS):
                was_uncertain, stray = entry.uncertain, entry.stray_session
                # From here until the reply, a node of ours may exist that we cannot name.
                entry.uncertain = True
                sid = transport.session_id
                connected = transport.connected and sid is not None
                entry.stray_session = sid if connected else ANY_SESSION
                try:
                    # Listed in the same round trip (see _enqueue), unless a fair lock's.
                    entry.tagged = entry.owner
                    created, stat, listing = await transport.create_listed(
                        base,
                        self._ctx.data_of(entry),
                        directory=entry.directory if entry.list_on_create else None,
                        timeout=self._ctx.request_timeout,
                    )
                except NotConnected:
                    entry.uncertain, entry.stray_session = was_uncertain, stray  # never sent
                    raise
                except NoNodeError:
                    entry.uncertain, entry.stray_session = was_uncertain, stray
                    await self._make_parents(entry.directory, transport)
                    continue
                entry.uncertain = False
                entry.stray_session = stray  # a clean create leaves no stray (earlier ones might)
                entry.name = created.rsplit("/", 1)[1]
                entry.czxid = stat.czxid
                entry.session_id = stat.ephemeral_owner
                entry.listing = listing
                return
            raise BackendError(f"could not create a node in {entry.directory!r}")
        except BackendError as exc:
            entry.create_error = exc

    async def _make_parents(self, directory: str, transport: ZKTransport) -> None:
        path = ""
        for part in directory.strip("/").split("/"):
            path = f"{path}/{part}"
            with contextlib.suppress(NodeExistsError):
                await transport.create(path, container=True, timeout=self._ctx.request_timeout)

    async def _adopt(self, entry: Entry, transport: ZKTransport, names: list[str]) -> bool:
        """After an unknown create outcome: keep our node of this session, delete the rest."""
        mine = sorted((n for n in names if n.startswith(entry.protect)), key=seq)
        kept = False
        for name in mine:
            path = f"{entry.directory}/{name}"
            try:
                _, stat = await transport.get(path, timeout=self._ctx.request_timeout)
            except NoNodeError:
                continue
            if not kept and stat.ephemeral_owner == transport.session_id:
                entry.name = name
                entry.czxid = stat.czxid
                entry.session_id = stat.ephemeral_owner
                kept = True
                self.adopted += 1
                continue
            with contextlib.suppress(NoNodeError):
                await transport.delete(path, timeout=self._ctx.request_timeout)
        entry.uncertain = False
        return kept

    async def _drop_strays(self, entry: Entry, transport: ZKTransport, names: list[str]) -> None:
        """Delete nodes with our uuid that are not our node: a create that landed late, or
        our node of an ended session the server has not expired yet (it would queue ahead
        of us: we would wait for ourselves)."""
        for name in [n for n in names if n != entry.name and n.startswith(entry.protect)]:
            with contextlib.suppress(NoNodeError):
                await transport.delete(
                    f"{entry.directory}/{name}", timeout=self._ctx.request_timeout
                )
            names.remove(name)

    async def poke(self, entry: Entry, transport: ZKTransport) -> None:
        """Touch our node so the waiter watching it re-checks (semaphore handover)."""
        entry.tagged = entry.owner  # (which also names its holder, see _retag)
        try:
            await transport.set(
                entry.path, self._ctx.data_of(entry), timeout=self._ctx.request_timeout
            )
        except NoNodeError:
            pass  # gone already: its deletion woke the successor
        except BackendError as exc:
            logger.debug("could not touch %s for its successor: %s", entry.path, exc)
