"""The conformance suite on a standalone ZooKeeper server (tests/support_zookeeper.py).

The URL has a chroot, and a session short enough that a SIGSTOPped holder process is replaced
within the suite's 5 s acquire timeout (its session expires after 3 s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_zookeeper import ZooKeeperProbe, ZooKeeperServer

pytestmark = pytest.mark.zookeeper
aiodlock_scheme = "zookeeper"  # read by tests/conftest.py at collection (capability deselection)

ROOT = "/conformance"
SESSION_TIMEOUT = 3.0


@pytest.fixture
def aiodlock_url(zookeeper_server: ZooKeeperServer) -> str:
    return f"{zookeeper_server.url}{ROOT}?session_timeout={SESSION_TIMEOUT:g}"


@pytest_asyncio.fixture
async def aiodlock_probe(zookeeper_server: ZooKeeperServer) -> ZooKeeperProbe:
    from tests.support_zookeeper import ZooKeeperProbe

    return await ZooKeeperProbe(f"{zookeeper_server.host}:{zookeeper_server.port}", ROOT).start()
