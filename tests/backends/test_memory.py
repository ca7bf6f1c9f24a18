"""The conformance suite on the in-process backend: no server, no driver."""

from __future__ import annotations

import pytest

import aiodlock
from aiodlock.backends import Breaker, Inspector, Kind, LockSpec, load_backend, parse_url
from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

pytestmark = pytest.mark.memory
aiodlock_scheme = "memory"  # read by tests/conftest.py at collection (capability deselection)

URL = "memory://conformance"


class MemoryProbe:
    """Breaks and inspects locks through the backend's optional BREAK and INSPECT operations,
    on a backend object of its own over the same named store."""

    def __init__(self, url: str) -> None:
        parsed = parse_url(url)
        backend = load_backend(parsed.scheme)(parsed, {})
        assert isinstance(backend, Inspector)
        self.inspector = backend

    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        backend = client.backend
        assert isinstance(backend, Breaker)
        dropped = 0
        for kind in (Kind.MUTEX, Kind.WRITE, Kind.SEMAPHORE):  # one per family
            dropped += await backend.break_lock(LockSpec(namespace, name, kind))
        assert dropped > 0, "nothing to break"

    async def leftovers(self, namespace: str) -> list[str]:
        return [repr(info) for info in await self.inspector.inspect(namespace)]

    async def aclose(self) -> None:
        pass


@pytest.fixture
def aiodlock_url() -> str:
    return URL


@pytest.fixture
def aiodlock_probe() -> MemoryProbe:
    return MemoryProbe(URL)
