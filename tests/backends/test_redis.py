"""The conformance suite on Redis, waiters woken by pub/sub (the default)."""

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


@pytest.fixture
def aiodlock_options() -> dict[str, Any]:
    return {"wakeup": "pubsub"}


@pytest_asyncio.fixture
async def aiodlock_probe(redis_url: str) -> RedisProbe:
    from tests.support_redis import RedisProbe

    return RedisProbe(redis_url)
