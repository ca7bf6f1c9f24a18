"""The suite's fixtures: the backend under test (:class:`Target`), two clients on a fresh
namespace, the lock kinds, and the autouse check that skips what a backend cannot run."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

import aiodlock
from aiodlock.backends import parse_url

from .. import Probe, settle
from ._needs import KINDS, LockKind, unmet_needs, wants_probe

__all__ = [
    "Target",
    "aiodlock_namespace",
    "aiodlock_requirements",
    "aiodlock_target",
    "locks",
    "make",
    "other",
]


@pytest.fixture
def aiodlock_namespace() -> str:
    """A fresh namespace per test, so tests never see each other's locks."""
    return f"t{uuid.uuid4().hex[:12]}"


@dataclass
class Target:
    """The backend under test: how to connect, and the probe to look behind its back."""

    url: str
    namespace: str
    options: dict[str, Any] = field(default_factory=dict)
    probe: Probe | None = None

    @property
    def scheme(self) -> str:
        return parse_url(self.url).scheme

    def connect(self, **options: Any) -> aiodlock.LockClient:
        """A new client on the test's namespace (open it with ``async with``)."""
        return aiodlock.connect(self.url, namespace=self.namespace, **{**self.options, **options})

    async def break_lock(self, client: aiodlock.LockClient, name: str) -> None:
        """Destroy the lock's state under its holder (as an operator or an expiry would)."""
        if self.probe is None:
            pytest.skip("needs an aiodlock_probe fixture to break a lock under its holder")
        await self.probe.break_lock(client, self.namespace, name)

    async def assert_no_leftovers(self, *clients: aiodlock.LockClient) -> None:
        """Once the clients' compensating releases are done, the namespace must be empty on
        the service (fencing counters excepted). Checked only when there is a probe."""
        for client in clients:
            await settle(client)
        if self.probe is not None:
            assert await self.probe.leftovers(self.namespace) == []


@pytest_asyncio.fixture
async def aiodlock_target(
    aiodlock_url: str,
    aiodlock_namespace: str,
    aiodlock_options: dict[str, Any],
    aiodlock_probe: Probe | None,
) -> AsyncIterator[Target]:
    """The backend under test; closes the probe after the test."""
    try:
        yield Target(aiodlock_url, aiodlock_namespace, dict(aiodlock_options), aiodlock_probe)
    finally:
        if aiodlock_probe is not None:
            await aiodlock_probe.aclose()


@pytest_asyncio.fixture
async def locks(aiodlock_target: Target) -> AsyncIterator[aiodlock.LockClient]:
    """An open client on the test's namespace."""
    async with aiodlock_target.connect() as client:
        yield client


@pytest_asyncio.fixture
async def other(aiodlock_target: Target) -> AsyncIterator[aiodlock.LockClient]:
    """A second, independent client: another process, as far as the service can tell."""
    async with aiodlock_target.connect() as client:
        yield client


@pytest.fixture(params=list(KINDS))
def make(request: pytest.FixtureRequest) -> LockKind:
    """Each kind of exclusive lock in turn: ``make(client, name, **options)`` builds one."""
    return KINDS[request.param]


@pytest.fixture(autouse=True)
def aiodlock_requirements(request: pytest.FixtureRequest) -> None:
    """Skip, with the reason, a test the backend cannot run (see :func:`unmet_needs`)."""
    if "aiodlock_url" not in request.fixturenames:
        return  # not one of the suite's tests
    scheme = parse_url(request.getfixturevalue("aiodlock_url")).scheme
    assert isinstance(request.node, pytest.Item)
    reason = unmet_needs(request.node, scheme)
    if reason is not None:
        pytest.skip(reason)
    if wants_probe(request.function) and request.getfixturevalue("aiodlock_probe") is None:
        pytest.skip("needs an aiodlock_probe fixture to break a lock under its holder")
