"""The client's one task group, and the share of it each part of the client spawns into.

A client runs every background task — keep-alives, compensating releases, a backend's
read loops, janitors and watches — in one :class:`asyncio.TaskGroup`, held open for the
client's life by a runner task of its own (:class:`TaskRoot`). Nothing of it belongs to the
task that called ``open()``, so a failing child can never cancel the user's code. Each part
(the supervisor, the backend) gets a :class:`Tasks` from the root: it spawns into the group
and cancels or awaits just its own tasks when it closes.

Example (a backend)::

    async def open(self, tasks: Tasks) -> None:
        self._tasks = tasks
        tasks.spawn(self._janitor(), "aiodlock-mybackend-janitor")

    async def aclose(self) -> None:
        await self._tasks.aclose()  # cancels the janitor and waits for it
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["TaskRoot", "Tasks", "retrieve"]

logger = logging.getLogger("aiodlock")


def retrieve(outcome: asyncio.Future[Any]) -> None:
    """Look at a finished outcome nobody may await any more (a reply a caller stopped waiting
    for), so asyncio never logs its error as never retrieved; a done-callback::

        reply.add_done_callback(retrieve)
    """
    if not outcome.cancelled():
        outcome.exception()


class TaskRoot:
    """The client's task group, opened by :meth:`start` and closed by :meth:`stop`.

    A background task that raises is a bug, not a service failure (those are reported
    through lease states and log lines): it is logged once at ERROR with its traceback and
    contained, so one faulty clean-up neither cancels the other tasks nor the client's user.
    """

    __slots__ = ("_children", "_closing", "_group", "_runner", "_stopping")

    def __init__(self) -> None:
        self._children: set[asyncio.Task[None]] = set()
        self._closing = False
        self._group: asyncio.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop` (false from the moment it is called)."""
        return self._group is not None and not self._closing

    async def start(self) -> None:
        """Start the runner task and return once its group is open."""
        if self._runner is not None:
            raise RuntimeError("this TaskRoot was already started")
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._stopping = loop.create_future()
        self._runner = loop.create_task(self._run(ready), name="aiodlock-client")
        await asyncio.shield(ready)

    async def _run(self, ready: asyncio.Future[None]) -> None:
        assert self._stopping is not None
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                ready.set_result(None)
                await self._stopping
        finally:
            self._group = None
            if not ready.done():
                ready.set_result(None)

    def tasks(self) -> Tasks:
        """A new share of the group, for one part of the client."""
        return Tasks(self)

    async def stop(self) -> None:
        """Close the group: cancel what is still running there and wait for it. Idempotent."""
        runner = self._runner
        if runner is None or runner.done():
            return
        assert self._stopping is not None
        self._closing = True  # a part still spawning now sees its Tasks closed, not an error
        for task in list(self._children):
            task.cancel()
        if not self._stopping.done():
            self._stopping.set_result(None)
        await asyncio.shield(runner)

    def spawn(
        self,
        coro: Coroutine[Any, Any, None],
        name: str,
        into: set[asyncio.Task[None]] | None = None,
    ) -> asyncio.Task[None]:
        """Run ``coro`` in the group (RuntimeError once it has ended), kept in ``into`` while
        it runs; parts use :class:`Tasks`."""
        group = self._group
        if group is None or self._closing:
            coro.close()
            raise RuntimeError("this client is not open: its background tasks have ended")
        task = group.create_task(_contained(coro, name), name=name)
        children = self._children
        children.add(task)
        if into is not None:
            into.add(task)

        def done(_: object) -> None:
            children.discard(task)
            if into is not None:
                into.discard(task)
            # A task cancelled before its first step never started ``coro``: close it, so
            # Python does not warn that it was never awaited (a no-op once it ran).
            coro.close()

        task.add_done_callback(done)  # one callback: a task per grant is on the hot path
        return task


class Tasks:
    """One part's share of the client's task group (see the module docstring).

    Example::

        tasks = root.tasks()
        task = tasks.spawn(asyncio.sleep(1), "aiodlock-nap")
        await tasks.wait()   # until it is done
        await tasks.aclose() # cancel the rest; no spawn after this
    """

    __slots__ = ("_closed", "_root", "_running")

    def __init__(self, root: TaskRoot) -> None:
        self._root = root
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` began (or the client's group has ended)."""
        return self._closed or not self._root.running

    def __len__(self) -> int:
        """How many of this share's tasks are running."""
        return len(self._running)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coro`` in the client's group as a task named ``name``.

        Raises:
            RuntimeError: this share is closed, or the client is not open (``coro`` is
                closed unrun).
        """
        if self._closed:
            coro.close()
            raise RuntimeError(f"cannot start {name}: these background tasks are closed")
        return self._root.spawn(coro, name, self._running)

    def try_spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
        """:meth:`spawn`, or ``None`` (``coro`` closed unrun) once :attr:`closed`: for
        best-effort work a closing part may skip, its lease or entry ending by expiry."""
        root = self._root
        if self._closed or root._group is None or root._closing:  # closed, inlined: hot path
            coro.close()
            return None
        return root.spawn(coro, name, self._running)

    async def wait(self) -> None:
        """Return once this share's tasks running now, and any they start, are done."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    async def aclose(self) -> None:
        """Refuse new tasks, cancel those running and wait for them. Idempotent."""
        self._closed = True
        while self._running:
            running = list(self._running)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)


async def _contained(coro: Coroutine[Any, Any, None], name: str) -> None:
    try:
        await coro
    except Exception:
        logger.exception("aiodlock background task %s failed (a bug: please report it)", name)
