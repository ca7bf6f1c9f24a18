"""The conformance suite on etcd: a single member, and a three-member cluster
(tests/support_etcd.py).

The URL has a prefix, and a lease of 3 s (etcd's shortest is 2 s with the harness's 1 s
election timeout), so a SIGSTOPped holder process is replaced within the suite's 5 s acquire
timeout.
On the cluster, writes go through the leader and each client talks to whichever member it
reached first; leader kills and member pauses are in tests/test_etcd.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_etcd import EtcdProbe

pytestmark = pytest.mark.etcd
aiodlock_scheme = "etcd"  # read by tests/conftest.py at collection (capability deselection)

PREFIX = "/conformance"
SESSION_TTL = 3


@pytest.fixture(params=["single", "cluster"])
def etcd_endpoints(request: pytest.FixtureRequest) -> str:
    if request.param == "single":
        return str(request.getfixturevalue("etcd_server").endpoint)
    return str(request.getfixturevalue("etcd_cluster").endpoints)


@pytest.fixture
def aiodlock_url(etcd_endpoints: str) -> str:
    return f"etcd://{etcd_endpoints}{PREFIX}?session_ttl={SESSION_TTL}"


@pytest_asyncio.fixture
async def aiodlock_probe(etcd_endpoints: str) -> EtcdProbe:
    from tests.support_etcd import EtcdProbe

    return await EtcdProbe(etcd_endpoints.split(",")[0], PREFIX).start()
