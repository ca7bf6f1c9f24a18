"""PostgreSQL transaction locks: ``lock_in_transaction`` on the caller's own connection.

On the harness's real server (and a real PgBouncer in transaction pooling mode in front of
it): exclusion with the backend's session locks both ways, one increasing token sequence across
session and transaction grants, release at COMMIT and at ROLLBACK (a waiter is woken by the
server), a timeout that leaves the caller's transaction usable, the try variant, the fencing
table created on first use, a collision refused, REPEATABLE READ's serialization failure, a
cancelled wait, and the argument and transaction checks.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

import aiodlock
from aiodlock.backends import parse_url
from tests.helpers import eventually
from tests.support_postgres import PostgresProbe, advisory_key, fence_key

if TYPE_CHECKING:
    from tests.support_postgres import PostgresServer

pytestmark = pytest.mark.postgres

Connect = Callable[..., Awaitable[Any]]
"""Opens an asyncpg connection (to the server, or to ``url=``), closed after the test."""

WOKEN_WITHIN = 1.0
"""Seconds a waiter may take to get a lock the server freed (measured: a few ms). Every wait
here is one server-side statement of at least 30 s, so only the server's wake-up is this fast."""


@pytest.fixture
def ns() -> str:
    return f"px{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def probe(postgres_url: str) -> AsyncIterator[PostgresProbe]:
    made = await PostgresProbe.open(postgres_url)
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[Connect]:
    import asyncpg

    opened: list[Any] = []

    async def connect(url: str = postgres_url, **options: Any) -> Any:
        parsed = parse_url(url)
        host, port = parsed.hosts[0]
        conn = await asyncpg.connect(
            host=host,
            port=port,
            user=parsed.username,
            password=parsed.password,
            database=parsed.path.strip("/"),
            **options,
        )
        opened.append(conn)
        return conn

    try:
        yield connect
    finally:
        for conn in opened:
            await conn.close()


def client(url: str, ns: str) -> aiodlock.LockClient:
    # Each server-side wait is one statement of 30 s: a waiter granted sooner was woken.
    return aiodlock.connect(url, namespace=ns, ttl=90, wait_slice=30)


async def _waiting(probe: PostgresProbe, ns: str, longer_than_ms: int = 0) -> bool:
    """One session waits for the mutex ``x`` of ``ns`` (for longer than ``longer_than_ms``):
    ``pg_locks``, that key only, so that no other test's sessions count."""
    rows = await probe.rows(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND NOT l.granted "
        "AND ((l.classid::bigint << 32) | l.objid::bigint) = $1 "
        "AND clock_timestamp() - a.query_start > make_interval(secs => $2::float8 / 1000)",
        advisory_key(ns, "m", "x"),
        longer_than_ms,
    )
    return bool(rows[0][0] == 1)


async def _holds(probe: PostgresProbe, conn: Any, key: int) -> bool:
    """Whether ``conn``'s session holds the advisory key (``pg_locks``)."""
    pid = conn.get_server_pid()
    return any(
        p == pid and k == key and granted for p, k, _, granted in await probe.advisory_locks()
    )


# ---------------------------------------------------------------------- exclusion


async def test_a_session_lock_excludes_a_transaction_lock(
    postgres_url: str, ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction, try_lock_in_transaction

    conn = await pg()
    loop = asyncio.get_running_loop()
    async with client(postgres_url, ns) as locks:
        lease = await locks.lock("x").acquire()
        async with conn.transaction():
            assert await try_lock_in_transaction(conn, "x", namespace=ns) is None
            started = loop.time()
            with pytest.raises(aiodlock.LockTimeoutError, match=r"lock 'x' within 0.2 s"):
                await lock_in_transaction(conn, "x", namespace=ns, timeout=0.2)
            assert loop.time() - started >= 0.19  # it waited on the server, then gave up
            # Another namespace's "x" is another lock.
            assert await try_lock_in_transaction(conn, "x", namespace=f"{ns}b") is not None

            waiter = asyncio.create_task(lock_in_transaction(conn, "x", namespace=ns))
            await eventually(lambda: _waiting(probe, ns))
            await lease.release()
            released = loop.time()
            token = await asyncio.wait_for(waiter, 10)
            assert loop.time() - released < WOKEN_WITHIN
            assert token > lease.fencing_token
            assert await _holds(probe, conn, advisory_key(ns, "m", "x"))
        assert await probe.leftovers(ns) == []


async def test_a_transaction_lock_excludes_a_session_lock(
    postgres_url: str, ns: str, pg: Connect
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction

    conn = await pg()
    loop = asyncio.get_running_loop()
    async with client(postgres_url, ns) as locks:
        transaction = conn.transaction()
        await transaction.start()
        token = await lock_in_transaction(conn, "x", namespace=ns)
        assert await locks.lock("x").try_acquire() is None
        started = loop.time()
        with pytest.raises(aiodlock.LockTimeoutError):
            await locks.lock("x").acquire(timeout=0.2)
        assert loop.time() - started >= 0.19
        await transaction.commit()
        async with locks.lock("x", timeout=0) as lease:  # free the moment COMMIT returned
            assert lease.fencing_token > token


# ---------------------------------------------------------------------- fencing


async def test_tokens_increase_across_session_and_transaction_grants(
    postgres_url: str, ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction, try_lock_in_transaction

    conn = await pg()
    tokens: list[int] = []
    # Both on their default fencing table: the same counter proves it is the same table.
    async with aiodlock.connect(postgres_url, namespace=ns) as locks:
        for _ in range(5):
            async with locks.lock("x") as lease:
                tokens.append(lease.fencing_token)
            async with conn.transaction():
                tokens.append(await lock_in_transaction(conn, "x", namespace=ns, timeout=5))
            async with conn.transaction():
                token = await try_lock_in_transaction(conn, "x", namespace=ns)
                assert token is not None
                tokens.append(token)
            # A rolled-back grant's bump is undone; the next token is still larger (every
            # token is at least the server clock in µs at its grant).
            transaction = conn.transaction()
            await transaction.start()
            tokens.append(await lock_in_transaction(conn, "x", namespace=ns))
            await transaction.rollback()
    assert tokens == sorted(set(tokens)), tokens
    rows = await probe.rows(
        "SELECT namespace, name, token, sem_limit FROM aiodlock_fence WHERE lock_key = $1",
        fence_key(ns, "x"),
    )
    assert rows == [(ns, "x", tokens[-2], None)]  # the last committed grant's


async def test_the_fencing_table_is_created_in_the_transaction(
    postgres_url: str, ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction, try_lock_in_transaction

    conn = await pg()
    table = f"fence_{uuid.uuid4().hex[:8]}"
    try:
        # Rolled back: the table goes with the transaction, and comes back next time.
        transaction = conn.transaction()
        await transaction.start()
        assert await try_lock_in_transaction(conn, "x", namespace=ns, fence_table=table)
        await transaction.rollback()
        assert await probe.rows("SELECT to_regclass($1) IS NULL", table) == [(True,)]

        async with conn.transaction():
            token = await lock_in_transaction(conn, "x", namespace=ns, fence_table=table)
        assert await probe.rows(f"SELECT namespace, name, token FROM {table}") == [(ns, "x", token)]
        index = await probe.rows("SELECT indexname FROM pg_indexes WHERE tablename = $1", table)
        assert (f"{table}_touched",) in index
        comment = await probe.rows("SELECT obj_description($1::regclass, 'pg_class')", table)
        assert "aiodlock fencing tokens" in comment[0][0]
        upper = table.upper()  # checked and folded as the backend does
        async with (
            aiodlock.connect(postgres_url, namespace=ns, fence_table=upper) as locks,
            locks.lock("x") as lease,
        ):
            assert lease.fencing_token > token
    finally:
        await probe.rows(f"DROP TABLE IF EXISTS {table}")


async def test_a_fencing_row_collision_is_refused_and_the_transaction_goes_on(
    ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction, try_lock_in_transaction

    conn = await pg()
    async with conn.transaction():  # the fencing table exists from here on
        assert await try_lock_in_transaction(conn, "setup", namespace=ns) is not None
    # Stand in for a 64-bit collision: the row of "victim" claims to belong to another name.
    await probe.rows(
        "INSERT INTO aiodlock_fence (lock_key, namespace, name, token) VALUES ($1, $2, $3, 1)",
        fence_key(ns, "victim"),
        ns,
        "someone-else",
    )
    async with conn.transaction():
        await conn.execute("CREATE TEMPORARY TABLE work (n int) ON COMMIT DROP")
        await conn.execute("INSERT INTO work VALUES (1)")
        for take in (lock_in_transaction, try_lock_in_transaction):
            with pytest.raises(aiodlock.BackendError, match=r"'victim'.*hash collision"):
                await take(conn, "victim", namespace=ns)
            # The key went with the savepoint; the caller's transaction is intact.
            assert not await _holds(probe, conn, advisory_key(ns, "m", "victim"))
            assert await conn.fetchval("SELECT count(*) FROM work") == 1
    rows = await probe.rows(
        "SELECT name, token FROM aiodlock_fence WHERE lock_key = $1", fence_key(ns, "victim")
    )
    assert rows == [("someone-else", 1)]


# ---------------------------------------------------------------------- release


@pytest.mark.parametrize("end", ["commit", "rollback"])
@pytest.mark.parametrize("waiter_kind", ["session", "transaction"])
async def test_the_lock_is_released_when_the_transaction_ends(
    postgres_url: str, ns: str, pg: Connect, probe: PostgresProbe, end: str, waiter_kind: str
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction

    holder, other = await pg(), await pg()
    loop = asyncio.get_running_loop()
    async with client(postgres_url, ns) as locks:
        transaction = holder.transaction()
        await transaction.start()
        token = await lock_in_transaction(holder, "x", namespace=ns)
        other_transaction = other.transaction()
        if waiter_kind == "session":
            waiter = asyncio.create_task(_session_token(locks, "x"))
        else:
            await other_transaction.start()
            waiter = asyncio.create_task(lock_in_transaction(other, "x", namespace=ns))
        await eventually(lambda: _waiting(probe, ns))
        await (transaction.commit() if end == "commit" else transaction.rollback())
        ended = loop.time()
        second = await asyncio.wait_for(waiter, 10)
        assert loop.time() - ended < WOKEN_WITHIN
        assert second > token
        if waiter_kind == "transaction":
            assert await _holds(probe, other, advisory_key(ns, "m", "x"))
            await other_transaction.commit()
    assert await probe.leftovers(ns) == []


async def _session_token(locks: aiodlock.LockClient, name: str) -> int:
    async with locks.lock(name, timeout=30) as lease:
        return lease.fencing_token


async def test_a_cancelled_wait_leaves_nothing_once_the_transaction_ends(
    postgres_url: str, ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction

    conn = await pg()

    async def wait_in_transaction() -> None:
        async with conn.transaction():
            await lock_in_transaction(conn, "x", namespace=ns)

    async with client(postgres_url, ns) as locks, locks.lock("x"):
        waiter = asyncio.create_task(wait_in_transaction())
        await eventually(lambda: _waiting(probe, ns))
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not conn.is_in_transaction()  # rolled back on the way out
    assert await probe.leftovers(ns) == []
    async with conn.transaction():  # and the connection serves on
        assert await lock_in_transaction(conn, "x", namespace=ns, timeout=0) > 0


# ---------------------------------------------------------------------- timeouts


async def test_a_timeout_leaves_the_callers_transaction_usable(
    ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction

    holder, conn = await pg(), await pg()
    async with holder.transaction():
        first = await lock_in_transaction(holder, "x", namespace=ns)
        transaction = conn.transaction()
        await transaction.start()
        await conn.execute("SET LOCAL lock_timeout = '7s'")
        await conn.execute("CREATE TEMPORARY TABLE work (n int) ON COMMIT DROP")
        await conn.execute("INSERT INTO work VALUES (1)")
        for timeout in (0.05, 0):
            with pytest.raises(aiodlock.LockTimeoutError) as caught:
                await lock_in_transaction(conn, "x", namespace=ns, timeout=timeout)
            assert isinstance(caught.value, TimeoutError)
            assert await conn.fetchval("SELECT current_setting('lock_timeout')") == "7s"
            assert await conn.fetchval("SELECT count(*) FROM work") == 1
            assert not await _holds(probe, conn, advisory_key(ns, "m", "x"))
        await conn.execute("INSERT INTO work VALUES (2)")
    # The holder committed: the same transaction now gets it, and its setting is back after.
    second = await lock_in_transaction(conn, "x", namespace=ns, timeout=5)
    assert second > first
    assert await conn.fetchval("SELECT current_setting('lock_timeout')") == "7s"
    assert await conn.fetchval("SELECT sum(n) FROM work") == 3
    await transaction.commit()
    assert await probe.leftovers(ns) == []


async def test_no_timeout_waits_past_the_callers_own_lock_timeout(
    ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction

    holder, conn = await pg(), await pg()
    async with conn.transaction():
        await conn.execute("SET LOCAL lock_timeout = '1ms'")
        async with holder.transaction():
            first = await lock_in_transaction(holder, "x", namespace=ns)
            waiter = asyncio.create_task(lock_in_transaction(conn, "x", namespace=ns))
            # Still waiting 50 times past the caller's own lock_timeout.
            await eventually(lambda: _waiting(probe, ns, longer_than_ms=50))
        assert await asyncio.wait_for(waiter, 10) > first
        assert await conn.fetchval("SELECT current_setting('lock_timeout')") == "1ms"


async def test_repeatable_read_reports_a_contended_grant_as_a_serialization_failure(
    ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    """At REPEATABLE READ the bump cannot see a token committed after the transaction's
    snapshot (taken before the wait): the documented 40001, which such a caller retries."""
    from aiodlock.backends.postgres import lock_in_transaction

    holder, conn = await pg(), await pg()
    async with holder.transaction():  # the fencing table exists before the snapshot
        await lock_in_transaction(holder, "warm", namespace=ns)
    async with conn.transaction(isolation="repeatable_read"):
        async with holder.transaction():
            first = await lock_in_transaction(holder, "x", namespace=ns)
            waiter = asyncio.create_task(lock_in_transaction(conn, "x", namespace=ns))
            await eventually(lambda: _waiting(probe, ns))
        with pytest.raises(aiodlock.BackendError, match="SerializationError") as caught:
            await waiter
        assert getattr(caught.value.__cause__, "sqlstate", None) == "40001"
        assert not await _holds(probe, conn, advisory_key(ns, "m", "x"))
        assert await conn.fetchval("SELECT 1") == 1  # the savepoint took the failure
    async with conn.transaction(isolation="repeatable_read"):  # the retry
        assert await lock_in_transaction(conn, "x", namespace=ns) > first


# ---------------------------------------------------------------------- checks


async def test_outside_a_transaction_is_a_runtime_error(ns: str, pg: Connect) -> None:
    from aiodlock.backends.postgres import lock_in_transaction, try_lock_in_transaction

    conn = await pg()
    with pytest.raises(RuntimeError, match=r"conn\.transaction\(\)"):
        await lock_in_transaction(conn, "x", namespace=ns)
    with pytest.raises(RuntimeError, match="needs a transaction"):
        await try_lock_in_transaction(conn, "x", namespace=ns)
    # A transaction asyncpg did not start (plain BEGIN) is one too.
    await conn.execute("BEGIN")
    assert await try_lock_in_transaction(conn, "x", namespace=ns) is not None
    await conn.execute("COMMIT")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"name": ""}, ValueError, "name must not be empty"),
        ({"name": 42}, TypeError, "name must be a str"),
        ({"name": "a\x00b"}, ValueError, "NUL"),
        ({"namespace": "a:b"}, ValueError, "namespace must not contain"),
        ({"namespace": ""}, ValueError, "namespace must not be empty"),
        ({"timeout": -1}, ValueError, "timeout must be >= 0"),
        ({"timeout": float("nan")}, ValueError, "timeout must be finite"),
        ({"timeout": "5"}, TypeError, "timeout must be a number"),
        ({"fence_table": "fence; DROP TABLE x"}, ValueError, "plain SQL identifier"),
        ({"fence_table": "f" * 64}, ValueError, "at most 63"),
        ({"fence_table": None}, TypeError, "fence_table must be a str"),
        ({"conn": object()}, TypeError, "asyncpg connection"),
    ],
)
async def test_bad_arguments(
    pg: Connect, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    from aiodlock.backends.postgres import lock_in_transaction, try_lock_in_transaction

    conn = await pg()
    arguments: dict[str, Any] = {"conn": conn, "name": "x", **options}
    async with conn.transaction():
        with pytest.raises(error, match=message):
            await lock_in_transaction(**arguments)
        if "timeout" not in options:
            with pytest.raises(error, match=message):
                await try_lock_in_transaction(**arguments)
        assert await conn.fetchval("SELECT 1") == 1  # nothing was sent


# ---------------------------------------------------------------------- PgBouncer


@pytest.fixture(scope="module")
def pgbouncer_url(postgres_server: PostgresServer) -> Iterator[str]:
    """PgBouncer in transaction pooling mode with ONE server connection in its pool: every
    client transaction runs on the same server session."""
    from tests.support_pgbouncer import PgBouncerServer

    with PgBouncerServer(postgres_server, pool_mode="transaction", default_pool_size=1) as bouncer:
        yield bouncer.url


async def test_through_pgbouncer_transaction_pooling(
    postgres_url: str, pgbouncer_url: str, ns: str, pg: Connect, probe: PostgresProbe
) -> None:
    """Two clients of PgBouncer share its one server session, transaction by transaction: the
    lock ends with each transaction, and nothing of it stays on the shared session."""
    import asyncpg

    from aiodlock.backends.postgres import lock_in_transaction, try_lock_in_transaction

    a = await pg(pgbouncer_url, statement_cache_size=0)
    b = await pg(pgbouncer_url, statement_cache_size=0)
    async with client(postgres_url, ns) as locks:  # the backend itself connects directly
        async with a.transaction():
            pid = await a.fetchval("SELECT pg_backend_pid()")
            first = await lock_in_transaction(a, "x", namespace=ns, timeout=5)
            assert await locks.lock("x").try_acquire() is None
        async with locks.lock("x", timeout=0) as lease:  # the shared session holds nothing
            assert lease.fencing_token > first
            async with b.transaction():
                assert await b.fetchval("SELECT pg_backend_pid()") == pid  # the same session
                assert await try_lock_in_transaction(b, "x", namespace=ns) is None
                with pytest.raises(aiodlock.LockTimeoutError):
                    await lock_in_transaction(b, "x", namespace=ns, timeout=0.05)
                assert await b.fetchval("SELECT current_setting('lock_timeout')") == "0"
        async with b.transaction():
            assert await lock_in_transaction(b, "x", namespace=ns) > lease.fencing_token
        # The docstring's pool, as an application would set it up behind PgBouncer.
        parsed = parse_url(pgbouncer_url)
        host, port = parsed.hosts[0]
        async with (
            asyncpg.create_pool(
                host=host,
                port=port,
                user=parsed.username,
                password=parsed.password,
                database=parsed.path.strip("/"),
                statement_cache_size=0,
                min_size=1,
                max_size=2,
            ) as pool,
            pool.acquire() as conn,
            conn.transaction(),
        ):
            assert await lock_in_transaction(conn, "y", namespace=ns, timeout=5) > 0
    assert await probe.leftovers(ns) == []
