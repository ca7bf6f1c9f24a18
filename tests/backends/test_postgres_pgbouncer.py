"""The conformance suite on PostgreSQL through PgBouncer in session pooling mode.

As tests/backends/test_postgres.py, but every client of the library connects to PgBouncer
(tests/support_pgbouncer.py), which gives each client connection a server session of its own
for the connection's life: session-level advisory locks work as on a direct connection. The
probe connects to PostgreSQL directly, as in the direct module: it reads ``pg_locks`` and
terminates holders with ``pg_terminate_backend`` on the server itself (PgBouncer then drops
the client whose server session ended). Transaction pooling is refused at open
(tests/test_pgbouncer.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

if TYPE_CHECKING:
    from tests.support_pgbouncer import PgBouncerServer
    from tests.support_postgres import PostgresProbe

pytestmark = pytest.mark.postgres
aiodlock_scheme = "postgresql"  # read by tests/conftest.py at collection (capability deselection)


@pytest.fixture
def aiodlock_url(pgbouncer_session: PgBouncerServer) -> str:
    return pgbouncer_session.url


@pytest_asyncio.fixture
async def aiodlock_probe(postgres_url: str) -> PostgresProbe:
    from tests.support_postgres import PostgresProbe

    return await PostgresProbe.open(postgres_url)
