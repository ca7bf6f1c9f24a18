"""The conformance suite on Redis behind Sentinel (``redis+sentinel://``), both wakeup modes.

A master, a replica and three sentinels (tests/support_sentinel.py); the client finds the
master through the sentinels. Failovers are in tests/test_redis_sentinel.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_redis import RedisProbe
    from tests.support_sentinel import SentinelDeployment

pytestmark = pytest.mark.redis
aiodlock_scheme = "redis+sentinel"  # read by tests/conftest.py at collection


@pytest.fixture
def aiodlock_url(redis_sentinel: SentinelDeployment) -> str:
    return redis_sentinel.url


@pytest.fixture(params=["pubsub", "blpop"])
def aiodlock_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"wakeup": request.param}


@pytest_asyncio.fixture
async def aiodlock_probe(redis_sentinel: SentinelDeployment) -> RedisProbe:
    from tests.support_redis import RedisProbe

    return RedisProbe(redis_sentinel.master_url())
