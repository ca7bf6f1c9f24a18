"""A fault-injecting TCP relay for the tests: partitions, slow links, resets, half-open links.

A :class:`Relay` listens on a free loopback port and forwards every connection to one
server (``upstream``). A client given the relay's address instead of the server's talks to
the server as usual until the test breaks the link::

    async with Relay(server.host, server.port) as relay:
        url = f"redis://{relay.host}:{relay.port}/0"   # the client goes through the relay
        relay.blackhole()        # a partition: nothing crosses, connections stay open
        relay.blackhole(drop=True)   # one that outlives TCP's retransmissions
        relay.latency(2.0)       # every chunk, each way, arrives 2 s late
        relay.reset()            # every connection aborted with RST, new ones refused
        relay.half_open()        # requests reach the server, replies are dropped
        relay.heal()             # forward everything again

Modes, as a client and a server see them:

- ``blackhole()``: nothing crosses either way and connections stay open (no FIN, no RST, as
  on a cut network); new connections are accepted and get nothing (the server hears of them
  at the heal). What was sent meanwhile is held and delivered at the heal, in order, as TCP
  retransmits it across a partition shorter than its retransmission timeout (minutes): late
  requests and late replies, ends of stream included, are part of the fault.
- ``blackhole(drop=True)``: the same while it lasts, but what was sent is dropped, as after
  a partition that outlived TCP's retransmissions: such a connection is aborted at the heal.
- ``latency(seconds)``: every chunk is delivered ``seconds`` after it was read, each way, in
  order. Changing the delay applies to what is read from then on.
- ``reset``: every connection through the relay is aborted with an RST (``SO_LINGER`` 0) and
  the relay stops listening, so a new connection is refused, until :meth:`heal`.
- ``half_open``: what the client sends reaches the server; what the server sends is dropped.
- ``heal()``: forward everything again. A connection that lost bytes during the fault cannot
  go on (a byte stream with a hole in it means nothing to either side), nor can one that a
  peer reset meanwhile: both are aborted with an RST at the heal, as a real peer answers a
  retransmission of a connection it no longer knows. Other connections go on.

Why a relay of our own and not toxiproxy: toxiproxy is not packaged for Debian, PyPI or npm
here (only clients of it are), and a relay in the test's own event loop needs no process,
no port of a control API and no clean-up beyond its ``async with``. ``tc netem`` needs a
kernel module these machines lack.

Every task is owned: one :class:`asyncio.TaskGroup` per relay (entered by ``async with``)
runs a task per connection, which runs a task per direction; leaving the ``async with``
closes the listener, aborts every connection and waits for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Self

from tests.servers import LOOPBACK

__all__ = ["Mode", "Relay"]

_CHUNK = 65536
# SO_LINGER on, 0 s: close() sends an RST instead of a FIN.
_LINGER_RST = struct.pack("ii", 1, 0)


class Mode(Enum):
    """What a :class:`Relay` does with the bytes it reads."""

    FORWARD = "forward"
    BLACKHOLE = "blackhole"
    LATENCY = "latency"
    RESET = "reset"
    HALF_OPEN = "half_open"


@dataclass(eq=False)
class _Link:
    """One client connection, its connection to the server, and the task that serves both."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    task: asyncio.Task[None]
    # Lost bytes, or an end of stream that did not cross: the stream means nothing to the
    # other side any more, so the heal aborts it.
    broken: bool = False

    def abort(self) -> None:
        """Close both sides with an RST (a peer sees ``ECONNRESET``) and end the task."""
        for writer in (self.client, self.server):
            _abort(writer)
        self.task.cancel()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), once: a closed transport is left alone (uvloop raises
    on its socket)."""
    if writer.transport.is_closing():
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()


class Relay:
    """A TCP relay on a free loopback port in front of ``upstream_host:upstream_port``.

    See the module docstring for the modes. ``port`` is known once the relay is entered
    and stays the same for its life (also across :meth:`reset` and :meth:`heal`).
    ``connections`` counts the connections it has accepted and ``dropped`` the bytes it
    lost, for tests that want to know that a client did connect through it, or that a
    fault did hit a request. The modes that only change what is forwarded are
    plain methods; :meth:`reset` and :meth:`heal`, which close or reopen the listener, are
    coroutines.
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, host: str = LOOPBACK) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port = 0
        self.connections = 0
        self.dropped = 0  # bytes lost to a half-open link, a dropping blackhole or a reset
        self._mode = Mode.FORWARD
        self._delay = 0.0
        self._drop_held = False
        # Set while bytes may cross: a blackhole clears it, and senders wait on it.
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[_Link] = set()
        # Connections accepted during a blackhole, not yet connected to the server.
        self._held: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._listener: asyncio.Server | None = None
        self._group = asyncio.TaskGroup()
        self._entered = False

    def __repr__(self) -> str:
        return (
            f"<Relay {self.host}:{self.port} -> {self.upstream[0]}:{self.upstream[1]} "
            f"{self._mode.value} links={len(self._links)}>"
        )

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._group.__aenter__()
        self._entered = True
        try:
            await self._listen()
        except BaseException as exc:
            await self._group.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._close_all()
        await self._group.__aexit__(None, None, None)

    async def _listen(self) -> None:
        # reuse_address: the port of a listener closed by reset() is taken again at heal().
        self._listener = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_address=True
        )
        self.port = int(self._listener.sockets[0].getsockname()[1])

    async def _close_all(self) -> None:
        """Stop listening and abort every link (before waiting for the listener: from 3.12
        ``wait_closed`` waits for the connections it accepted)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for link in list(self._links):
            link.abort()
        for task, writer in list(self._held.items()):
            writer.transport.abort()
            task.cancel()
        if listener is not None:
            await listener.wait_closed()

    # -- modes ----------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self._mode

    def blackhole(self, *, drop: bool = False) -> None:
        """Let nothing cross either way; keep connections open; accept new ones, give them
        nothing. What is sent meanwhile is held for the heal, or dropped if ``drop``."""
        self._mode = Mode.BLACKHOLE
        self._drop_held = drop
        self._flowing.clear()

    def half_open(self) -> None:
        """Deliver what the client sends; drop what the server sends."""
        self._mode = Mode.HALF_OPEN
        self._flowing.set()

    def latency(self, seconds: float) -> None:
        """Deliver every chunk ``seconds`` after it was read, each way, in order."""
        if not seconds >= 0:
            raise ValueError(f"latency must be >= 0 seconds, not {seconds!r}")
        self._mode = Mode.LATENCY
        self._delay = seconds
        self._flowing.set()

    async def reset(self) -> None:
        """Abort every connection with an RST and refuse new ones until :meth:`heal`."""
        self._check_entered()
        self._mode = Mode.RESET
        self._flowing.clear()
        await self._close_all()

    async def heal(self) -> None:
        """Forward everything again (see the module docstring for what a heal aborts)."""
        self._check_entered()
        self._mode = Mode.FORWARD
        self._delay = 0.0
        self._drop_held = False
        self._flowing.set()
        for link in list(self._links):
            if link.broken:
                link.abort()
        if self._listener is None:
            await self._listen()

    def _check_entered(self) -> None:
        if not self._entered:
            raise RuntimeError("enter the relay with `async with` first")

    def _drops(self, *, to_client: bool) -> bool:
        """Whether a chunk read now is lost (not merely held back by a blackhole)."""
        mode = self._mode
        if mode is Mode.HALF_OPEN:
            return to_client
        return mode is Mode.RESET or (mode is Mode.BLACKHOLE and self._drop_held)

    # -- forwarding -----------------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._mode is Mode.RESET:  # accepted just before the listener closed
            _abort(writer)
            return
        self.connections += 1
        serve = self._serve(reader, writer)
        try:
            self._group.create_task(serve, name="relay-link")
        except RuntimeError:  # the relay is closing: so is this connection
            serve.close()
            _abort(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Across a partition the server hears of a new connection only at the heal (the
        # client's bytes wait in the kernel's buffer meanwhile).
        task = asyncio.current_task()
        assert task is not None
        self._held[task] = writer
        try:
            await self._flowing.wait()
        finally:
            del self._held[task]
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()  # the server refused: so does the relay
            return
        link = _Link(writer, up_writer, task)
        self._links.add(link)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pipe(link, reader, up_writer, to_client=False))
                group.create_task(self._pipe(link, up_reader, writer, to_client=True))
        except asyncio.CancelledError:
            pass  # aborted by reset(), heal() or the relay's exit: the link's end, not an error
        finally:
            self._links.discard(link)
            writer.close()
            up_writer.close()

    async def _pipe(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        to_client: bool,
    ) -> None:
        """Copy one direction, applying the mode to each chunk as it is read.

        Chunks go through a queue to a sender of their own, so a slow or blackholed link
        still reads (and timestamps) what arrives meanwhile and delivers it in order, each at
        its time; a blackhole holds the sender (and the end of stream) until the heal.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def send() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                await self._flowing.wait()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if self._drops(to_client=to_client):  # the fault began while it was delayed
                    link.broken = True
                    self.dropped += len(data)
                    continue
                if writer.transport.is_closing():  # aborted: uvloop raises on a write
                    raise ConnectionResetError("the relay aborted this side")
                writer.write(data)
                await writer.drain()
            await self._flowing.wait()  # the end of stream crosses at the heal too

        reset = False
        try:
            async with asyncio.TaskGroup() as group:
                sender = group.create_task(send())
                while data := await reader.read(_CHUNK):
                    if self._drops(to_client=to_client):
                        link.broken = True
                        self.dropped += len(data)
                        continue
                    delay = self._delay if self._mode is Mode.LATENCY else 0.0
                    queue.put_nowait((loop.time() + delay, data))
                queue.put_nowait(None)  # the sender delivers what is queued, then ends
                await sender
        except* OSError:  # reset by a peer (reading, or the sender writing)
            reset = True
        if reset:
            link.broken = True
            if self._flowing.is_set() and not self._drops(to_client=to_client):
                link.abort()  # the reset crosses: the other side is reset too
            return  # else the other side learns of it at the heal
        if self._drops(to_client=to_client):
            link.broken = True  # the end of stream is lost with the bytes: reset at the heal
            return
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()  # a half-close passes on as one
