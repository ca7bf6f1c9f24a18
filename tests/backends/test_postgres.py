"""The conformance suite on a throw-away PostgreSQL server (tests/support_postgres.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_postgres import PostgresProbe

pytestmark = pytest.mark.postgres
aiodlock_scheme = "postgresql"  # read by tests/conftest.py at collection (capability deselection)


@pytest.fixture
def aiodlock_url(postgres_url: str) -> str:
    return postgres_url


@pytest_asyncio.fixture
async def aiodlock_probe(postgres_url: str) -> PostgresProbe:
    from tests.support_postgres import PostgresProbe

    return await PostgresProbe.open(postgres_url)
