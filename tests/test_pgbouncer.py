"""PostgreSQL behind a real PgBouncer: transaction pooling is refused, and why.

Session-level advisory locks belong to a server session. PgBouncer in session mode gives each
client a server session for the client's life, and the conformance suite runs through it
(tests/backends/test_postgres_pgbouncer.py). In transaction mode a client has a server session
only for the length of a transaction, and two clients may run on the same one: a lock taken
by one is "held" by the other too, and outlives both. This file shows that hazard with raw
asyncpg clients, the contrast in session mode, and that the library refuses such a pool when
it opens: at once, and holding nothing.

The probe connects to PostgreSQL directly (``pg_locks`` shows server sessions, which is what
PgBouncer hides from its clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

import aiodlock
from aiodlock.backends import parse_url
from tests.support_pgbouncer import PgBouncerServer
from tests.support_postgres import PostgresProbe, advisory_key

if TYPE_CHECKING:
    from tests.support_postgres import PostgresServer

pytestmark = pytest.mark.postgres

CONNECT_TIMEOUT = 5.0
TRY_LOCK = "SELECT pg_try_advisory_lock($1)"
BACKEND_PID = "SELECT pg_backend_pid()"


@pytest.fixture
def ns() -> str:
    return f"pgb{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def probe(postgres_url: str) -> AsyncIterator[PostgresProbe]:
    made = await PostgresProbe.open(postgres_url)
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture(scope="module")
def pgbouncer_one_session(postgres_server: PostgresServer) -> Iterator[PgBouncerServer]:
    """Transaction pooling over one server session: every client's transactions run on it.

    Deterministic where a bigger pool only usually lends the session used last.
    """
    with PgBouncerServer(postgres_server, pool_mode="transaction", default_pool_size=1) as server:
        yield server


async def raw_client(url: str) -> Any:
    """A plain asyncpg connection to ``url`` (no library in between)."""
    import asyncpg

    parsed = parse_url(url)
    host, port = parsed.hosts[0]
    return await asyncpg.connect(
        host=host,
        port=port,
        user=parsed.username,
        password=parsed.password,
        database=parsed.path.strip("/"),
        # Unnamed statements only: clients sharing a server session in transaction mode
        # would collide on asyncpg's named ones.
        statement_cache_size=0,
    )


@contextlib.asynccontextmanager
async def two_raw_clients(url: str) -> AsyncIterator[tuple[Any, Any]]:
    a = await raw_client(url)
    try:
        b = await raw_client(url)
        try:
            yield a, b
        finally:
            await b.close()
    finally:
        await a.close()


# ---------------------------------------------------------------------- the library refuses


@pytest.fixture(params=["pool_of_5", "pool_of_1"])
def transaction_pool(request: pytest.FixtureRequest) -> PgBouncerServer:
    """Transaction pooling with the stock pool of the harness, and with a single session."""
    name = "pgbouncer_transaction" if request.param == "pool_of_5" else "pgbouncer_one_session"
    server = request.getfixturevalue(name)
    assert isinstance(server, PgBouncerServer)
    return server


async def test_transaction_pooling_is_refused_at_open_quickly_and_holding_nothing(
    transaction_pool: PgBouncerServer, probe: PostgresProbe, ns: str
) -> None:
    url = f"{transaction_pool.url}?connect_timeout={CONNECT_TIMEOUT:g}"
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(aiodlock.BackendError, match="transaction pooling"):
        async with aiodlock.connect(url, namespace=ns):
            pass
    took = loop.time() - started
    assert took < CONNECT_TIMEOUT, took
    # Whatever the check at open took on the server, it gave it back.
    assert await probe.leftovers(ns) == []


# ---------------------------------------------------------------------- why


async def test_transaction_pooling_lets_two_clients_hold_one_advisory_lock(
    pgbouncer_one_session: PgBouncerServer, probe: PostgresProbe, ns: str
) -> None:
    key = advisory_key(ns, "m", "hazard")
    shared: set[int] = set()
    try:
        async with two_raw_clients(pgbouncer_one_session.url) as (a, b):
            assert await a.fetchval(TRY_LOCK, key) is True
            # Directly, or through session pooling (below), this second try is refused.
            assert await b.fetchval(TRY_LOCK, key) is True
            shared = {await a.fetchval(BACKEND_PID), await b.fetchval(BACKEND_PID)}
            assert len(shared) == 1, shared  # both clients ran on one server session
            assert await probe.holders(ns, "hazard") == sorted(shared)
        # Nor did leaving give it back: the lock stays with the pooled server session, for
        # whichever client PgBouncer lends that session to next.
        assert await probe.holders(ns, "hazard") == sorted(shared)
    finally:
        for pid in shared:  # the server session ends, and its locks with it
            await probe.terminate(pid)
    assert await probe.leftovers(ns) == []


async def test_session_pooling_keeps_an_advisory_lock_to_one_client_until_it_leaves(
    pgbouncer_session: PgBouncerServer, probe: PostgresProbe, ns: str
) -> None:
    key = advisory_key(ns, "m", "contrast")
    async with two_raw_clients(pgbouncer_session.url) as (a, b):
        assert await a.fetchval(TRY_LOCK, key) is True
        assert await b.fetchval(TRY_LOCK, key) is False
        pid_a, pid_b = await a.fetchval(BACKEND_PID), await b.fetchval(BACKEND_PID)
        assert pid_a != pid_b
        assert await probe.holders(ns, "contrast") == [pid_a]
    # PgBouncer resets a session its client left (DISCARD ALL) before lending it again: the
    # lock is gone though the server session stays in the pool.
    assert await probe.leftovers(ns) == []


@pytest.fixture(scope="module")
def pgbouncer_few_sessions(postgres_server: PostgresServer) -> Iterator[PgBouncerServer]:
    """Session pooling over a few server sessions: a client gets the idle ones the clients
    before it left, while any are idle."""
    with PgBouncerServer(postgres_server, pool_mode="session", default_pool_size=4) as server:
        yield server


async def test_a_server_session_lent_to_the_next_client_shows_that_clients_identity(
    pgbouncer_few_sessions: PgBouncerServer, probe: PostgresProbe, ns: str
) -> None:
    """A server session outlives its client behind PgBouncer; the next client's backend
    writes its own identity over the session's row when it opens the connection."""
    url = pgbouncer_few_sessions.url
    async with aiodlock.connect(url, namespace=ns, identity=f"first {ns}") as first:
        await first.lock("lent", ttl=30).acquire()  # released when the client closes
    before = dict(await _identity_rows(probe))
    async with (
        aiodlock.connect(url, namespace=ns, identity=f"second {ns}") as second,
        second.lock("lent", ttl=30) as lease,
    ):
        (pid,) = await probe.holders(ns, "lent")
        (info,) = await second.inspect("lent")
        assert [(h.owner, h.identity) for h in info.holders] == [(lease.owner, second.identity)]
        after = dict(await _identity_rows(probe))
        # The holder is a server session an earlier client left, its row rewritten.
        assert pid in before and before[pid] != second.identity == after[pid]


async def _identity_rows(probe: PostgresProbe) -> list[tuple[Any, ...]]:
    return await probe.rows("SELECT pid, identity FROM aiodlock_fence_sessions")
