"""Every backend declares what it can do, and refuses the rest when the lock is built."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import aiodlock
from aiodlock.backends import Capability
from tests.conftest import Target, capabilities_of


async def test_undeclared_kinds_fail_at_construction(
    backend_name: str, locks: aiodlock.LockClient
) -> None:
    caps = capabilities_of(backend_name)
    builders: dict[Capability, list[Callable[[], object]]] = {
        Capability.SHARED: [lambda: locks.read_lock("x"), lambda: locks.write_lock("x")],
        Capability.COUNTING: [lambda: locks.semaphore("x", limit=2)],
        Capability.FAIR: [lambda: locks.lock("x", fair=True)],
        Capability.EXCLUSIVE: [lambda: locks.lock("x")],
    }
    for capability, makers in builders.items():
        for build in makers:
            if capability in caps:
                build()  # constructs without a round trip
            else:
                with pytest.raises(aiodlock.UnsupportedError, match=capability.value):
                    build()


async def test_every_backend_fences_and_wakes(backend_name: str, target: Target) -> None:
    """The promises of the README: fencing tokens and no sleep-polling, on every backend."""
    caps = capabilities_of(backend_name)
    assert Capability.FENCING in caps
    assert Capability.SERVER_WAKEUP in caps
    assert Capability.EXCLUSIVE in caps
    assert (Capability.TTL_LEASE in caps) != (Capability.SESSION_LEASE in caps)
