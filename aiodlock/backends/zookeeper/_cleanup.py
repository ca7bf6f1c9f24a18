"""Deleting the nodes of entries that left the queue: by name, by uuid, or later.

A node whose name we know is deleted by name; after a lost create reply, every node with the
entry's uuid goes, found by one listing of its directory per round of entries (the sweeper).
A node that cannot be deleted now (connection down) is *doomed*: the janitor deletes it once
the connection is back in the same session; a node of an ended session is gone already.

Example::

    await cleanup.remove_nodes(entry, transport, wait=False)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from .. import BackendError
from ._context import ZKContext
from ._errors import NoNodeError, NotConnected
from ._nodes import ANY_SESSION, Nodes
from ._state import Entry, Sweep
from ._transport import ZKTransport

__all__ = ["Cleanup"]

_PROTECT_LENGTH: Final = len("_c_") + 32 + len("-")  # "_c_<uuid hex>-"


class Cleanup:
    """Removes queue nodes now, in rounds per directory, or later through the janitor."""

    __slots__ = ("_ctx", "_janitor", "_nodes", "_sweepers", "_sweeps")

    def __init__(self, ctx: ZKContext, nodes: Nodes) -> None:
        self._ctx = ctx
        self._nodes = nodes
        self._sweeps: dict[str, Sweep] = {}  # per directory: the round still taking entries
        self._sweepers: set[str] = set()  # directories whose sweeper task is running
        self._janitor: asyncio.Task[None] | None = None

    async def remove_nodes(
        self, entry: Entry, transport: ZKTransport, *, wait: bool = True
    ) -> None:
        """Delete our node and, after an unknown create outcome, any node with our uuid.

        If that cannot be done now, the entry is kept for the janitor, which retries when the
        connection is back in the same session (a node of an ended session is gone already).
        ``wait=False``: do not wait for a suspended connection to come back (NotConnected).
        """
        try:
            creating = entry.creating
            if creating is not None:
                if not wait and not creating.done() and not transport.connected:
                    raise NotConnected("not connected to zookeeper (connection suspended)")
                # Its reply names our node. A create that failed left the entry uncertain
                # (or, never sent, with nothing to delete).
                with contextlib.suppress(BackendError):
                    await self._nodes.created(entry)
            sid = transport.session_id
            if entry.name is not None and entry.session_id == sid:
                with contextlib.suppress(NoNodeError):
                    await transport.delete(entry.path, wait=wait, timeout=self._ctx.request_timeout)
            entry.name = None
            if entry.stray_session in (sid, ANY_SESSION):
                await self._sweep(entry, transport, wait=wait)
            entry.uncertain = False
            entry.stray_session = None  # a stray of an ended session ended with it
        except BaseException:
            if self._ctx.state == "open":
                self._ctx.doomed[entry.key] = entry
            raise

    async def _sweep(self, entry: Entry, transport: ZKTransport, *, wait: bool) -> None:
        """Delete every node carrying ``entry``'s uuid, found by listing its directory.

        Entries join the directory's next round: one listing serves all that joined before
        it started (a storm of cancelled creates would otherwise list the directory once per
        entry: entries times directory size). Raises if the round failed.
        """
        directory = entry.directory
        sweep = self._sweeps.get(directory)
        if sweep is None:
            sweep = self._sweeps[directory] = Sweep()
            if directory not in self._sweepers:
                self._sweepers.add(directory)
                self._ctx.spawn(self._sweeper(directory, transport), "aiodlock-zk-sweeper")
        sweep.prefixes.add(entry.protect)
        sweep.wait = sweep.wait or wait
        await asyncio.shield(sweep.done)

    async def _sweeper(self, directory: str, transport: ZKTransport) -> None:
        """Run the rounds of one directory, one at a time, until no entry waits for one."""
        try:
            while (sweep := self._sweeps.pop(directory, None)) is not None:
                try:
                    names = await self._nodes.children(transport, directory, wait=sweep.wait)
                    strays = [n for n in names if n[:_PROTECT_LENGTH] in sweep.prefixes]
                    if strays:
                        paths = [f"{directory}/{name}" for name in strays]
                        await asyncio.gather(
                            *(self._delete(path, transport, wait=sweep.wait) for path in paths)
                        )
                except asyncio.CancelledError:
                    sweep.done.cancel()
                    raise
                except BaseException as exc:
                    sweep.done.set_exception(exc)
                    # Every entry of the round may have left (cancelled) by now: a failure
                    # nobody awaits is not a "Future exception was never retrieved" per round.
                    sweep.done.exception()
                else:
                    sweep.done.set_result(None)
        finally:
            self._sweepers.discard(directory)
            sweep = self._sweeps.pop(directory, None)
            if sweep is not None:  # closing: nobody will run it
                sweep.done.cancel()

    async def _delete(self, path: str, transport: ZKTransport, *, wait: bool) -> None:
        with contextlib.suppress(NoNodeError):
            await transport.delete(path, wait=wait, timeout=self._ctx.request_timeout)

    def kick_janitor(self) -> None:
        transport = self._ctx.transport
        if not self._ctx.doomed or self._ctx.state != "open" or transport is None:
            return
        if not transport.connected:
            return  # the reconnect kicks it again
        if self._janitor is None or self._janitor.done():
            self._janitor = self._ctx.spawn(self._clean_doomed(transport), "aiodlock-zk-janitor")

    async def settle(self) -> None:
        """Let the janitor go over the doomed nodes now, if the connection allows it, and
        wait for it: twice at most (a node doomed during a round waits for the next one)."""
        for _ in range(2):
            self.kick_janitor()
            janitor = self._janitor
            if janitor is None or janitor.done():
                return
            await asyncio.wait((janitor,))

    async def _clean_doomed(self, transport: ZKTransport) -> None:
        """Remove the nodes of every doomed entry, all at once: known nodes are deleted by
        name, and the unknown ones (lost create replies) by one listing per directory."""
        sid = transport.session_id
        work = []
        for key, entry in list(self._ctx.doomed.items()):
            if (
                entry.creating is None
                and (entry.name is None or entry.session_id != sid)
                and entry.stray_session not in (sid, ANY_SESSION)
            ):
                self._ctx.doomed.pop(key, None)  # nothing of it is left in this session
            else:
                work.append(self._clean_one(key, entry, transport))
        # Still unreachable: the next reconnect or ping retries what is left.
        await asyncio.gather(*work, return_exceptions=True)

    async def _clean_one(self, key: tuple[str, str], entry: Entry, transport: ZKTransport) -> None:
        async with entry.lock:
            if self._ctx.doomed.get(key) is entry:
                await self.remove_nodes(entry, transport)
                self._ctx.doomed.pop(key, None)
