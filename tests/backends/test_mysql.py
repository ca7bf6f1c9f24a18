"""The conformance suite on a throw-away MariaDB server (tests/support_mysql.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_mysql import MySQLProbe

pytestmark = pytest.mark.mysql
aiodlock_scheme = "mysql"  # read by tests/conftest.py at collection (capability deselection)


@pytest.fixture
def aiodlock_url(mysql_url: str) -> str:
    return mysql_url


@pytest_asyncio.fixture
async def aiodlock_probe(mysql_url: str) -> MySQLProbe:
    from tests.support_mysql import MySQLProbe

    return await MySQLProbe.open(mysql_url)
