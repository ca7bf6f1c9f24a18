"""The conformance suite on a three-server ZooKeeper ensemble (tests/support_zookeeper.py).

The same suite as on a standalone server (tests/backends/test_zookeeper.py), through a quorum:
writes go through the leader, and each client's session lives on whichever member it picked.
Leader kills and member pauses are in tests/test_zookeeper.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_zookeeper import ZooKeeperEnsemble, ZooKeeperProbe

pytestmark = pytest.mark.zookeeper
aiodlock_scheme = "zookeeper"  # read by tests/conftest.py at collection (capability deselection)

ROOT = "/conformance-ensemble"
SESSION_TIMEOUT = 3.0


@pytest.fixture
def aiodlock_url(zookeeper_ensemble: ZooKeeperEnsemble) -> str:
    return f"{zookeeper_ensemble.url}{ROOT}?session_timeout={SESSION_TIMEOUT:g}"


@pytest_asyncio.fixture
async def aiodlock_probe(zookeeper_ensemble: ZooKeeperEnsemble) -> ZooKeeperProbe:
    from tests.support_zookeeper import ZooKeeperProbe

    hosts = ",".join(f"{m.host}:{m.port}" for m in zookeeper_ensemble.members)
    return await ZooKeeperProbe(hosts, ROOT).start()
