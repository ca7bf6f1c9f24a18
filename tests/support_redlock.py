"""N independent Redis masters for the Redlock tests, and a probe that looks at all of them.

Imported only by the Redlock test modules' fixtures (it imports the redis driver through
:mod:`tests.support_redis`).

Usage::

    with RedlockMasters(3) as masters:
        masters.url             # "redlock://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/0"
        masters.servers[0].pause()  # SIGSTOP one master (resume() to SIGCONT)
"""

from __future__ import annotations

import contextlib
from types import TracebackType

import aiodlock
from tests.servers import RedisServer
from tests.support_redis import RedisProbe

__all__ = ["RedlockMasters", "RedlockProbe"]


class RedlockMasters:
    """``count`` throw-away redis-servers (no persistence: a restart comes back empty)."""

    def __init__(self, count: int) -> None:
        self.servers = [RedisServer() for _ in range(count)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.servers)
        return f"redlock://{hosts}/0"

    def start(self) -> RedlockMasters:
        try:
            for server in self.servers:
                server.start()
        except BaseException:
            self.close()
            raise
        return self

    def heal(self) -> None:
        """Every master running and answering again (after a test paused or killed one)."""
        for server in self.servers:
            if server.paused:
                server.resume()
            if not server.running:
                server.start()

    def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.close()

    def __enter__(self) -> RedlockMasters:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedlockProbe:
    """A :class:`RedisProbe` on every master: breaks locks everywhere, lists leftovers of all."""

    def __init__(self, masters: RedlockMasters) -> None:
        self.probes = [RedisProbe(s.url) for s in masters.servers]

    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        broken = 0
        for probe in self.probes:
            with contextlib.suppress(AssertionError):  # a master that did not grant it
                await probe.break_lock(client, namespace, name)
                broken += 1
        assert broken, "nothing to break"

    async def leftovers(self, namespace: str) -> list[str]:
        found = []
        for i, probe in enumerate(self.probes):
            found += [f"master {i}: {item}" for item in await probe.leftovers(namespace)]
        return found

    async def aclose(self) -> None:
        for probe in self.probes:
            await probe.aclose()
