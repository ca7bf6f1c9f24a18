"""The conformance suite on a standalone ZooKeeper server, with digest credentials.

As tests/backends/test_zookeeper.py, but every client authenticates as one digest user, so
every node the backend makes is that user's alone (``auth`` scheme, ``world:anyone`` READ):
the suite's clients share the identity and contend as usual, and its probe authenticates as
that user too (its breaks must be allowed). Digest authentication needs no server setting.
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

ROOT = "/conformance-auth"
SESSION_TIMEOUT = 3.0
USER, PASSWORD = "suite", "p@ss:w/rd"  # percent-encoded in the URL


@pytest.fixture
def aiodlock_url(zookeeper_server: ZooKeeperServer) -> str:
    auth = "suite:p%40ss%3Aw%2Frd"
    url = zookeeper_server.url.replace("zookeeper://", f"zookeeper://{auth}@")
    return f"{url}{ROOT}?session_timeout={SESSION_TIMEOUT:g}"


@pytest_asyncio.fixture
async def aiodlock_probe(zookeeper_server: ZooKeeperServer) -> ZooKeeperProbe:
    from tests.support_zookeeper import ZooKeeperProbe

    hosts = f"{zookeeper_server.host}:{zookeeper_server.port}"
    return await ZooKeeperProbe(hosts, ROOT, auth=(USER, PASSWORD)).start()
