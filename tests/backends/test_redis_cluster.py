"""The conformance suite on Redis Cluster (``redis+cluster://``), both wakeup modes.

Three masters with a replica each (tests/support_redis_cluster.py); every lock step is routed
by the slot of its lock's hash tag, and waiters are woken by sharded pub/sub (SPUBLISH) or
BLPOP on the master of that slot. The probe looks for leftovers on every master. Failovers,
slot moves and connection counts are in tests/test_redis_cluster.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_redis import RedisClusterProbe
    from tests.support_redis_cluster import ClusterDeployment

pytestmark = pytest.mark.redis
aiodlock_scheme = "redis+cluster"  # read by tests/conftest.py at collection


@pytest.fixture
def aiodlock_url(redis_cluster: ClusterDeployment) -> str:
    return redis_cluster.url


@pytest.fixture(params=["pubsub", "blpop"])
def aiodlock_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"wakeup": request.param}


@pytest_asyncio.fixture
async def aiodlock_probe(redis_cluster: ClusterDeployment) -> RedisClusterProbe:
    from tests.support_redis import RedisClusterProbe

    return RedisClusterProbe(redis_cluster.seed_url())
