"""The conformance suite on Redis, once per wakeup mode: pub/sub (the default) and BLPOP."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_redis import RedisProbe

pytestmark = pytest.mark.redis
aiodlock_scheme = "redis"  # read by tests/conftest.py at collection (capability deselection)


@pytest.fixture
def aiodlock_url(redis_url: str) -> str:
    return redis_url


@pytest.fixture(params=["pubsub", "blpop"])
def aiodlock_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"wakeup": request.param}


@pytest_asyncio.fixture
async def aiodlock_probe(redis_url: str) -> RedisProbe:
    from tests.support_redis import RedisProbe

    return RedisProbe(redis_url)
