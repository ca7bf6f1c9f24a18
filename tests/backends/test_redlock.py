"""The conformance suite on Redlock (``redlock://``) over three and five independent masters.

Each master is its own redis-server (tests/support_redlock.py); the probe looks at all of them,
so a key left behind on any master fails the suite. Faults are in tests/test_redlock.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_redlock import RedlockMasters, RedlockProbe

pytestmark = pytest.mark.redis
aiodlock_scheme = "redlock"  # read by tests/conftest.py at collection


@pytest.fixture(params=[3, 5], ids=["3-masters", "5-masters"])
def redlock_deployment(request: pytest.FixtureRequest) -> RedlockMasters:
    name = "redlock_masters" if request.param == 3 else "redlock_masters5"
    masters: RedlockMasters = request.getfixturevalue(name)
    return masters


@pytest.fixture
def aiodlock_url(redlock_deployment: RedlockMasters) -> str:
    return redlock_deployment.url


@pytest.fixture
def aiodlock_options() -> dict[str, Any]:
    return {}


@pytest_asyncio.fixture
async def aiodlock_probe(redlock_deployment: RedlockMasters) -> RedlockProbe:
    from tests.support_redlock import RedlockProbe

    return RedlockProbe(redlock_deployment)
