"""PostgreSQL backend: faults on a real server, keys, fencing table, connections, options.

The conformance suite runs on this backend in tests/backends/test_postgres.py; this file
covers what is specific to it: ``pg_terminate_backend`` of a holder, a server restart or crash
under load, sessions left behind by cancelled waiters (``pg_locks``, ``pg_stat_activity``),
hundreds of names held at once, the advisory keys, the fencing table (clock seed, ``fence_ttl``
clean-up, collision check), semaphore limits, option checking and the inventory example.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest

import aiodlock
from aiodlock.testing import History, settle
from aiodlock.testing.conformance import LATE_RENEWAL_SLACK
from tests.helpers import (
    cut_off_grants,
    eventually,
    release_meets_keep_alives,
    taken_once_free,
    wait_until,
)
from tests.servers import TLSFiles, free_port
from tests.support_postgres import PostgresProbe, PostgresServer, advisory_key, fence_key

if TYPE_CHECKING:
    from aiodlock.backends.postgres import PostgresBackend

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ns() -> str:
    return f"pg{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def probe(postgres_url: str) -> AsyncIterator[PostgresProbe]:
    made = await PostgresProbe.open(postgres_url)
    try:
        yield made
    finally:
        await made.aclose()


def connect(url: str, ns: str, **options: object) -> aiodlock.LockClient:
    return aiodlock.connect(url, namespace=ns, **options)


def backend_of(client: aiodlock.LockClient) -> PostgresBackend:
    from aiodlock.backends.postgres import PostgresBackend

    backend = client.backend
    assert isinstance(backend, PostgresBackend)
    return backend


async def _waits_are(probe: PostgresProbe, count: int) -> bool:
    return await probe.waits() == count


async def _waits_at_least(probe: PostgresProbe, count: int) -> bool:
    return await probe.waits() >= count


async def _sessions_are(probe: PostgresProbe, count: int) -> bool:
    return await probe.sessions() == count


# ---------------------------------------------------------------------- pg_terminate_backend


async def test_terminated_holder_is_cancelled_and_next_holder_gets_larger_token(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    loop = asyncio.get_running_loop()
    history = History()
    body_cancelled = asyncio.Event()
    async with connect(postgres_url, ns) as a, connect(postgres_url, ns) as b:
        with pytest.raises(aiodlock.LockLostError, match="ended the session"):
            async with a.lock("stock", ttl=30) as first:
                with history.hold("a", first.fencing_token):
                    waiter = asyncio.create_task(b.lock("stock", ttl=30).acquire(timeout=10))
                    await eventually(lambda: _waits_are(probe, 1))
                    (pid,) = await probe.holders(ns, "stock")
                    terminated_at = loop.time()
                    # From another task: the loss may cancel this body before the reply.
                    killer = asyncio.create_task(probe.terminate(pid))
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        body_cancelled.set()
                        raise
        await killer
        # With ttl=30 the next keep-alive is 10 s away: the socket watch reported the loss.
        noticed = loop.time() - terminated_at
        assert noticed < 1.0, noticed
        assert body_cancelled.is_set() and first.lost.is_set()
        second = await waiter  # woken by the server when the terminated session's lock went
        with history.hold("b", second.fencing_token):
            assert second.fencing_token > first.fencing_token
            assert await a.lock("stock").try_acquire() is None
        await second.release()
    history.check(max_holders=1)
    assert await probe.leftovers(ns) == []


async def test_terminated_semaphore_slot_is_lost_and_refilled(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    async with connect(postgres_url, ns) as a, connect(postgres_url, ns) as b:
        one = await a.semaphore("pool", limit=2).acquire()
        two = await b.semaphore("pool", limit=2).acquire()
        held = {key: pid for pid, key, _, granted in await probe.advisory_locks() if granted}
        slots = [advisory_key(ns, "s", "pool", i) for i in range(2)]
        assert sorted(held) == sorted(slots)
        await probe.terminate(held[slots[0]])
        await asyncio.wait_for(one.lost.wait(), 2)
        assert two.held
        three = await b.semaphore("pool", limit=2).acquire(timeout=2)
        assert three.fencing_token > two.fencing_token > one.fencing_token
        for lease in (two, three):
            await lease.release()
        with pytest.raises(aiodlock.LockNotOwnedError):
            await one.release()
    assert await probe.leftovers(ns) == []


async def test_keys_in_pg_locks_are_the_documented_hashes(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    async with connect(postgres_url, ns) as a:
        async with a.lock("order:42"), a.read_lock("catalog"):
            locks = {(key, mode) for _, key, mode, granted in await probe.advisory_locks()}
            assert locks == {
                (advisory_key(ns, "m", "order:42"), "ExclusiveLock"),
                (advisory_key(ns, "rw", "catalog"), "ShareLock"),
            }
        async with a.write_lock("catalog"):
            locks = {(key, mode) for _, key, mode, granted in await probe.advisory_locks()}
            assert locks == {(advisory_key(ns, "rw", "catalog"), "ExclusiveLock")}
    assert await probe.leftovers(ns) == []


# ---------------------------------------------------------------------- restart / crash


@pytest.fixture(scope="module")
def restartable() -> Iterator[PostgresServer]:
    """A server of its own: restarting the session's server would disturb other tests."""
    with PostgresServer() as server:
        yield server


@pytest.mark.parametrize("fault", ["restart", "crash"])
async def test_server_restart_under_load_never_gives_two_holders(
    restartable: PostgresServer, ns: str, fault: str
) -> None:
    url = restartable.url
    loop = asyncio.get_running_loop()
    history = History()
    outcomes: list[str] = []
    entered = asyncio.Event()
    lost_at = 0.0

    async def holder(client: aiodlock.LockClient) -> None:
        nonlocal lost_at
        try:
            # ttl=30: the next keep-alive is 10 s away, so only the socket watch can be prompt.
            async with client.lock("job", ttl=30) as lease:
                with history.hold("holder", lease.fencing_token):
                    entered.set()
                    await asyncio.sleep(60)
        except aiodlock.LockLostError:
            lost_at = loop.time()
            outcomes.append("holder lost")

    async def waiter(client: aiodlock.LockClient, i: int) -> None:
        try:
            async with client.lock("job", ttl=2, timeout=30) as lease:
                with history.hold(f"w{i}", lease.fencing_token):
                    await asyncio.sleep(0.02)
            outcomes.append("acquired")
        except aiodlock.BackendError:
            outcomes.append("backend error")

    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(connect(url, ns))
        # One client per waiter: tasks of one client take turns locally, so only separate
        # clients put six waits on the server.
        clients = [await stack.enter_async_context(connect(url, ns)) for _ in range(6)]
        hold_task = asyncio.create_task(holder(a))
        await entered.wait()
        waiters = [asyncio.create_task(waiter(clients[i], i)) for i in range(6)]
        probe = await PostgresProbe.open(url)
        try:
            await eventually(lambda: _waits_at_least(probe, 6))
        finally:
            await probe.aclose()
        fault_at = loop.time()
        if fault == "restart":
            await asyncio.to_thread(restartable.restart)
        else:
            await asyncio.to_thread(lambda: restartable.kill().start())
        async with asyncio.timeout(60):
            await asyncio.gather(hold_task, *waiters)
        assert lost_at - fault_at < 3.0, "the holder was told late"
        # The clients are usable again, and the fencing table survived: tokens keep growing.
        async with a.lock("job", timeout=10) as after:
            assert after.fencing_token > max(h.token for h in history.holds)
    assert outcomes.count("holder lost") == 1, outcomes
    assert len(outcomes) == 7 and set(outcomes) <= {"holder lost", "acquired", "backend error"}
    history.check(max_holders=1)


# ---------------------------------------------------------------------- connections


async def test_hundred_cancelled_waiters_leave_no_lock_and_no_connection(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    baseline = await probe.sessions()
    async with connect(postgres_url, ns) as owner, connect(postgres_url, ns) as c:
        leases = [await owner.lock(f"hot{i}").acquire() for i in range(100)]
        # A hundred held mutexes: two on connections of their own (an idle one was at hand),
        # the rest on the two shared sessions; an idle one may be left by a sweep.
        assert backend_of(owner).statistics()["connections"] <= 5
        tasks = [asyncio.create_task(c.lock(f"hot{i}").acquire()) for i in range(100)]
        # max_connections (8 by default) of them wait on the server, the rest for a
        # connection: the client never goes past its bound, the server never past its own.
        await eventually(lambda: _waits_are(probe, 8), timeout=20)
        await wait_until(lambda: backend_of(c).statistics()["connection_waits"] == 92)
        assert backend_of(c).statistics()["waiters"] == 100
        assert await probe.waits() == 8
        assert await probe.sessions() <= baseline + 3 + 10
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        # asyncpg cancels each wait on the server: nobody waits any more, at once.
        took = await eventually(lambda: _waits_are(probe, 0))
        assert took < 2.0, took
        stats = backend_of(c).statistics()
        assert (stats["waiters"], stats["connection_waits"]) == (0, 0), stats
        # The janitor cleaned the cancelled sessions; the client keeps its small idle list.
        await settle(c)  # the janitor has cleaned the cancelled sessions
        assert await _idle_settled(c)
        assert backend_of(c).statistics()["connections"] <= 10
        mine = (
            backend_of(c).statistics()["connections"]
            + backend_of(owner).statistics()["connections"]
        )
        await eventually(lambda: _sessions_are(probe, baseline + mine))
        held = [key for _, key, _, _ in await probe.advisory_locks()]
        assert sorted(held) == sorted(advisory_key(ns, "m", f"hot{i}") for i in range(100))
        for lease in leases:
            await lease.release()
    await eventually(lambda: _sessions_are(probe, baseline))
    assert await probe.leftovers(ns) == []


async def _idle_settled(client: aiodlock.LockClient) -> bool:
    stats = backend_of(client).statistics()
    return bool(stats["connections"] == stats["idle"] + stats["shared_sessions"])


async def test_three_hundred_names_held_at_once_never_block_each_other(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    async with connect(postgres_url, ns, max_connections=400) as a:
        names = [f"n{i}" for i in range(300)]
        # Each grant opens a server process of its own: the deadline (which counts the
        # connect) is for a loaded machine forking 300 of them, not for one lock's wait.
        leases = await asyncio.gather(*(a.lock(n).acquire(timeout=60) for n in names))
        assert all(lease.held for lease in leases)
        keys = {key for _, key, _, granted in await probe.advisory_locks() if granted}
        assert keys == {advisory_key(ns, "m", n) for n in names}  # 300 distinct keys
        async with connect(postgres_url, ns) as b:
            for name in names[::30]:
                assert await b.lock(name).try_acquire() is None
            assert await b.lock("n300").try_acquire() is not None
        await asyncio.gather(*(lease.release() for lease in leases))
    assert await probe.leftovers(ns) == []


async def test_idle_connections_never_hold_a_lock(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    """The pool trap: a reused session must not carry a lock along."""
    async with connect(postgres_url, ns) as a, connect(postgres_url, ns) as b:
        for i in range(30):
            lease = await a.lock(f"n{i % 3}").acquire()
            assert await b.lock(f"n{i % 3}").try_acquire() is None
            task = asyncio.create_task(b.lock(f"n{i % 3}").acquire())
            await asyncio.sleep(0.002 * (i % 4))
            await lease.release()
            if i % 2:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await (await task).release()
        await settle(a)
        await settle(b)
        assert await probe.leftovers(ns) == []  # no session, idle or in use, holds a lock
        assert backend_of(a).statistics()["held"] == backend_of(b).statistics()["held"] == 0


async def test_a_statement_without_an_answer_is_cut_off_at_query_timeout(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    """The grant and release statements share one timer for all (no timer per statement):
    a grant the server does not answer (its fencing table is locked by an operator) fails
    with BackendError right after query_timeout, and the client goes on working."""
    table = f"fence_{uuid.uuid4().hex[:12]}"

    async def lock_the_table() -> None:
        await probe.rows("BEGIN")
        await probe.rows(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")

    # Long enough that the slack for a loaded machine still tells it from a doubled limit.
    limit = 1.0
    try:
        async with connect(postgres_url, ns, fence_table=table, query_timeout=limit) as c:
            took = await cut_off_grants(
                c,
                lock_the_table,
                lambda: probe.rows("ROLLBACK"),
            )
        assert all(limit <= t < limit + LATE_RENEWAL_SLACK for t in took), took
    finally:
        await probe.rows(f"DROP TABLE IF EXISTS {table}")


async def test_release_while_a_keep_alive_is_in_flight(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    """A release that meets a keep-alive mid-statement waits for it, then unlocks on the
    server: the lock is free when release() returns (a keep-alive cancelled by closing its
    session left the server to free the lock a moment later, after release() returned)."""
    async with connect(postgres_url, ns) as a, connect(postgres_url, ns) as b:
        await release_meets_keep_alives(a, b)
    assert await probe.leftovers(ns) == []


async def test_max_connections_bounds_the_lent_connections(postgres_url: str, ns: str) -> None:
    """Semaphores hold a lent connection each (mutexes share the shared sessions): at
    max_connections a third one waits, then says so after connect_timeout."""
    async with connect(postgres_url, ns, max_connections=2, connect_timeout=0.3) as c:
        first = await c.semaphore("a", limit=1).acquire()
        second = await c.semaphore("b", limit=1).acquire()
        with pytest.raises(aiodlock.BackendError, match="max_connections=2"):
            await c.semaphore("c", limit=1).acquire()
        async with c.lock("m"):  # a mutex still goes through, on a shared session
            pass
        await first.release()
        third = await c.semaphore("c", limit=1).acquire()  # a connection came back
        for lease in (second, third):
            await lease.release()


async def test_grant_inside_a_wait_is_claimed_with_a_new_token(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    async with connect(postgres_url, ns) as a, connect(postgres_url, ns) as b:
        first = await a.lock("x").acquire()
        task = asyncio.create_task(b.lock("x").acquire(timeout=10))
        await eventually(lambda: _waits_are(probe, 1))
        await first.release()
        second = await task
        assert second.fencing_token > first.fencing_token
        # One lock on the server, not two stacked on the waiter's session.
        assert len(await probe.advisory_locks()) == 1
        await second.release()
    assert await probe.leftovers(ns) == []


async def test_a_grant_inside_a_wait_comes_with_its_token(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    """A lock's wait is the fencing statement itself: the waiter granted the lock when the
    holder releases sends no claim for its token (its session's last statement is the wait),
    and its lease is timed from that statement's start, not from the grant."""
    # Slices of ttl/3 (wait_slice too): a 2 s slice outlasts the 0.4 s below however late it
    # comes on a loaded machine, so the wait seen is the one that is granted.
    ttl = 6.0
    loop = asyncio.get_running_loop()
    async with connect(postgres_url, ns) as a, connect(postgres_url, ns, wait_slice=ttl / 3) as b:
        holder = await a.lock("w").acquire()
        waiting = asyncio.create_task(b.lock("w", ttl=ttl).acquire(timeout=5))
        await eventually(lambda: _waits_are(probe, 1))
        await asyncio.sleep(0.4)  # the wait's statement is now >= 0.4 s old (an age, not a guess)
        released_at = loop.time()
        await holder.release()
        lease = await waiting
        assert lease.fencing_token > holder.fencing_token
        (pid,) = await probe.holders(ns, "w")
        [(last,)] = await probe.rows("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
        assert "lock_timeout" in last  # the wait, and no claim after it
        assert lease.valid_until < released_at + ttl - 0.2
        await lease.release()
    assert await probe.leftovers(ns) == []


async def test_a_task_refused_by_its_own_client_sends_nothing_while_it_waits(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    """While a task of a client holds a mutex, its session has the lock: the attempts of the
    client's other tasks are refused by the client itself, unsent, and a waiting task waits on
    the server at once. A holder whose session the server ended refuses nobody."""
    # fence_ttl=0: no janitor sweep, whose statement (due after a client's first grant, on a
    # connection it may still be opening) would be a statement of this client in the window.
    async with connect(postgres_url, ns, fence_ttl=0) as a:
        holder = await a.lock("own").acquire()
        before = await _last_statement_start(probe)
        assert await a.lock("own").try_acquire() is None
        assert await _last_statement_start(probe) == before  # refused without a statement
        waiting = asyncio.create_task(a.lock("own").acquire(timeout=5))
        await eventually(lambda: _waits_are(probe, 1))
        await holder.release()
        lease = await waiting
        assert lease.fencing_token > holder.fencing_token
        (pid,) = await probe.holders(ns, "own")
        await probe.terminate(pid)
        await lease.lost.wait()
        sibling = await taken_once_free(a.lock("own"))
        assert sibling.fencing_token > lease.fencing_token
        await sibling.release()
    assert await probe.leftovers(ns) == []


async def _last_statement_start(probe: PostgresProbe) -> object:
    """When the newest statement of the test role's sessions (the probe's excepted) began."""
    rows = await probe.rows(
        "SELECT max(query_start) FROM pg_stat_activity WHERE usename = current_user "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )
    return rows[0][0]


# ---------------------------------------------------------------------- fencing table


async def test_tokens_start_at_the_server_clock_and_survive_a_deleted_row(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    async with connect(postgres_url, ns) as a:
        before = int(time.time() * 1_000_000)
        async with a.lock("clock") as first:
            pass
        assert abs(first.fencing_token - before) < 60_000_000  # the clock in µs, ±60 s
        await probe.rows("DELETE FROM aiodlock_fence WHERE lock_key = $1", fence_key(ns, "clock"))
        async with a.lock("clock") as second:
            assert second.fencing_token > first.fencing_token


async def test_fence_ttl_deletes_idle_rows_and_tokens_still_increase(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    query = "SELECT count(*) FROM aiodlock_fence WHERE lock_key = $1"
    async with connect(postgres_url, ns, fence_ttl=0.2) as a:
        async with a.lock("old") as first:
            pass
        assert (await probe.rows(query, fence_key(ns, "old")))[0][0] == 1
        await asyncio.sleep(0.4)  # the row's idle time is what the sweep looks at
        async with a.lock("new"):  # a grant after the interval schedules a sweep
            pass
        await eventually(lambda: _row_count_is(probe, fence_key(ns, "old"), 0))
        async with a.lock("old") as again:
            assert again.fencing_token > first.fencing_token
    async with connect(f"{postgres_url}?fence_ttl=0", ns) as keep:
        async with keep.lock("kept"):
            pass
        # Idle longer than the 0.2 s above, on the server's clock (what a sweep looks at).
        await eventually(lambda: _row_idle_for(probe, fence_key(ns, "kept"), 0.3))
        async with keep.lock("other"):  # a grant after the interval would schedule a sweep
            pass
        await settle(keep)  # any sweep under way is done
        assert (await probe.rows(query, fence_key(ns, "kept")))[0][0] == 1


async def test_a_sweep_deletes_a_backlog_in_batches(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    """2500 rows idle for two hours: one sweep (three batches of 1000) deletes them all, and
    no row used within fence_ttl."""
    await _fence_table_made(postgres_url)
    await probe.rows(
        "INSERT INTO aiodlock_fence (lock_key, namespace, name, token, touched) "
        "SELECT -(i + 1000000)::bigint * 7919, $1, 'stale' || i, 1, "
        "clock_timestamp() - interval '2 hours' FROM generate_series(1, 2500) AS i",
        ns,
    )
    count = "SELECT count(*) FROM aiodlock_fence WHERE namespace = $1"
    async with connect(postgres_url, ns, fence_ttl=3600) as a:
        async with a.lock("fresh"):  # the client's first grant schedules a sweep
            pass
        await settle(a)  # the janitor's sweep is done
        assert (await probe.rows(count, ns))[0][0] == 1  # only "fresh" is left


async def _row_idle_for(probe: PostgresProbe, key: int, seconds: float) -> bool:
    rows = await probe.rows(
        "SELECT clock_timestamp() - touched > make_interval(secs => $2) "
        "FROM aiodlock_fence WHERE lock_key = $1",
        key,
        seconds,
    )
    return bool(rows[0][0])


async def _fence_table_made(postgres_url: str) -> None:
    """The default fencing table exists, made by a grant as on first use (in a namespace of
    its own): a test that writes rows into it may be the first of its worker."""
    async with connect(postgres_url, "fence-table") as warm, warm.lock("made"):
        pass


async def _row_count_is(probe: PostgresProbe, key: int, count: int) -> bool:
    rows = await probe.rows("SELECT count(*) FROM aiodlock_fence WHERE lock_key = $1", key)
    return bool(rows[0][0] == count)


async def test_a_fence_key_collision_is_refused_and_leaves_nothing(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    await _fence_table_made(postgres_url)
    # Stand in for a 64-bit collision: the row of "victim" claims to belong to another name.
    await probe.rows(
        "INSERT INTO aiodlock_fence (lock_key, namespace, name, token) VALUES ($1, $2, $3, 1)",
        fence_key(ns, "victim"),
        ns,
        "someone-else",
    )
    async with connect(postgres_url, ns) as a:
        with pytest.raises(aiodlock.BackendError, match="hash collision"):
            await a.lock("victim").acquire()
        await settle(a)
        assert await probe.leftovers(ns) == []
        assert a.statistics().leases == 0


async def test_fencing_table_is_created_on_first_use(postgres_url: str, ns: str) -> None:
    table = f"fence_{uuid.uuid4().hex[:8]}"
    async with connect(postgres_url, ns, fence_table=table) as a, a.lock("x") as lease:
        assert lease.fencing_token > 0
    probe = await PostgresProbe.open(postgres_url)
    try:
        rows = await probe.rows(f"SELECT namespace, name FROM {table}")
        assert rows == [(ns, "x")]
        await probe.rows(f"DROP TABLE {table}")
    finally:
        await probe.aclose()


async def test_stale_semaphore_limit_of_terminated_holders_is_replaced(
    postgres_url: str, ns: str, probe: PostgresProbe
) -> None:
    async with connect(postgres_url, ns) as a, connect(postgres_url, ns) as b:
        lease = await a.semaphore("pool", limit=2).acquire()
        with pytest.raises(aiodlock.LimitMismatchError):
            await b.semaphore("pool", limit=3).acquire(timeout=2)
        (pid,) = await probe.holders(ns, "pool")
        await probe.terminate(pid)
        await asyncio.wait_for(lease.lost.wait(), 2)
        # The recorded limit 2 is stale now that nobody holds a slot of it.
        three = await b.semaphore("pool", limit=3).acquire(timeout=2)
        await three.release()
    assert await probe.leftovers(ns) == []


# ---------------------------------------------------------------------- URL and options


async def test_password_never_shows(postgres_url: str, ns: str) -> None:
    secret = PostgresServer.password
    quoted = quote(secret, safe="")

    def clean(text: str) -> None:
        assert secret not in text and quoted not in text, text

    async with connect(postgres_url, ns) as c:
        clean(repr(c))
        clean(repr(c.lock("x")))
        clean(c.backend.describe())
        clean(str(c.statistics()))
        assert "***" in repr(c)
    wrong = quote("wrong" + secret, safe="")
    bad = postgres_url.replace(quoted, wrong)
    with pytest.raises(aiodlock.BackendError) as info:
        async with connect(bad, ns):
            pass
    clean(str(info.value))
    assert wrong not in str(info.value) and "wrong" + secret not in str(info.value)
    assert info.value.__cause__ is not None
    unreachable = postgres_url.rsplit("@", 1)[0] + f"@127.0.0.1:{free_port()}/db"
    with pytest.raises(aiodlock.BackendError) as info:
        async with connect(unreachable, ns, connect_timeout=2):
            pass
    clean(str(info.value))


async def test_postgres_scheme_alias(postgres_url: str, ns: str) -> None:
    url = postgres_url.replace("postgresql://", "postgres://", 1)
    async with connect(url, ns) as a, connect(postgres_url, ns) as b, a.lock("alias"):
        assert await b.lock("alias").try_acquire() is None


@pytest.mark.parametrize(
    ("url_tail", "options", "error", "message"),
    [
        ("", {}, ValueError, "needs a database"),
        ("/db", {"wait_slice": 0}, ValueError, "wait_slice must be > 0"),
        ("/db", {"fence_ttl": -1}, ValueError, "fence_ttl must be >= 0"),
        ("/db", {"max_connections": 0}, ValueError, "max_connections must be >= 1"),
        ("/db", {"max_idle": "many"}, TypeError, "max_idle must be an int"),
        ("/db", {"fence_table": "f; DROP TABLE x"}, ValueError, "fence_table"),
        ("/db?sslmode=sometimes", {}, ValueError, "sslmode must be one of"),
        ("/db?sslmode=verify-full", {}, ValueError, "needs sslrootcert"),
        ("/db?sslmode=disable&sslrootcert=/ca.pem", {}, ValueError, "contradicts"),
        ("/db?sslcert=/c.pem", {}, ValueError, "go together"),
        ("/db?wait_slice=soon", {}, ValueError, "wait_slice must be a number"),
        ("/db", {"pool_size": 3}, TypeError, "unknown option 'pool_size'"),
    ],
)
def test_bad_options_fail_at_connect(
    url_tail: str, options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        aiodlock.connect(f"postgresql://u:secret@127.0.0.1:1{url_tail}", **options)


def test_unsupported_kinds_fail_at_construction() -> None:
    client = aiodlock.connect("postgresql://u:secret@127.0.0.1:1/db")
    for build in (
        lambda: client.lock("x", fair=True),
        lambda: client.semaphore("x", limit=257),
    ):
        with pytest.raises(aiodlock.UnsupportedError) as info:
            build()
        assert "secret" not in str(info.value)


# ---------------------------------------------------------------------- the example


def test_inventory_example_is_exact(postgres_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "examples/inventory_postgres.py", "--url", postgres_url],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        line[:2]: line
        for line in result.stdout.splitlines()
        if line[:2] in {"1.", "2.", "3.", "4."}
    }
    assert "LOST" in rows["1."] and "OVERSOLD" in rows["1."], result.stdout  # the race is real
    for strategy in ("2.", "3.", "4."):
        assert rows[strategy].rstrip().endswith("exact"), result.stdout
    assert PostgresServer.password not in result.stdout + result.stderr


# ---------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls_server(tls_files: TLSFiles) -> Iterator[PostgresServer]:
    with PostgresServer(tls=tls_files) as server:
        yield server


async def test_tls_verify_full_with_a_client_certificate(
    tls_server: PostgresServer, tls_files: TLSFiles, ns: str
) -> None:
    url = (
        f"{tls_server.url}?sslmode=verify-full&sslrootcert={tls_files.ca}"
        f"&sslcert={tls_files.client}&sslkey={tls_files.client}"
    )
    probe = await PostgresProbe.open(tls_server.url)
    try:
        async with connect(url, ns) as a, connect(tls_server.url, ns) as b, a.lock("tls"):
            assert await b.lock("tls").try_acquire() is None
            # a's sessions show its client certificate (trustme's subject); b presented none.
            sessions = await probe.tls_sessions()
            assert all(ssl for ssl, _ in sessions), sessions
            assert any(dn is not None and "trustme" in dn for _, dn in sessions), sessions
            assert (True, None) in sessions  # b: sslmode=prefer by default
    finally:
        await probe.aclose()


@pytest.mark.parametrize("mode", ["require", "verify-ca"])
async def test_tls_modes_encrypt(
    tls_server: PostgresServer, tls_files: TLSFiles, ns: str, mode: str
) -> None:
    # verify-ca checks the chain, not the name: "localhost" is not in the certificate.
    url = tls_server.url.replace("127.0.0.1", "localhost") + f"?sslmode={mode}"
    if mode == "verify-ca":
        url += f"&sslrootcert={tls_files.ca}"
    probe = await PostgresProbe.open(tls_server.url)
    try:
        async with connect(url, ns) as a, a.lock("tls"):
            encrypted = [ssl for ssl, _ in await probe.tls_sessions()]
            assert encrypted and all(encrypted), encrypted
    finally:
        await probe.aclose()


async def test_tls_refuses_a_wrong_host_name_or_ca(
    tls_server: PostgresServer, tls_files: TLSFiles, ns: str, tmp_path: Path
) -> None:
    import trustme

    wrong_name = tls_server.url.replace("127.0.0.1", "localhost")
    with pytest.raises(aiodlock.BackendError, match="postgres connect failed"):
        async with connect(f"{wrong_name}?sslmode=verify-full&sslrootcert={tls_files.ca}", ns):
            pass
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    with pytest.raises(aiodlock.BackendError, match="postgres connect failed"):
        async with connect(f"{tls_server.url}?sslmode=verify-ca&sslrootcert={other_ca}", ns):
            pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"query_timeout": 1, "request_timeout": 1}, "two names of one option"),
        ({"sslrootcert": "/ca.pem", "tls_ca": "/ca.pem"}, "two names of one option"),
        ({"sslmode": "require", "tls": True}, "two ways to say one thing"),
        ({"tls": False, "tls_ca": "/ca.pem"}, "contradicts"),
        ({"tls_cert": "/c.pem"}, "tls_cert and tls_key go together"),
    ],
)
def test_canonical_option_names_are_checked(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        aiodlock.connect("postgresql://u:secret@127.0.0.1:1/db", **options)


async def test_tls_with_the_canonical_option_names(
    tls_server: PostgresServer, tls_files: TLSFiles, ns: str
) -> None:
    """tls_ca/tls_cert/tls_key verify the server (verify-full) and present a client
    certificate; tls_verify=false encrypts without checking; request_timeout is accepted."""
    verified = (
        f"{tls_server.url}?tls_ca={tls_files.ca}&tls_cert={tls_files.client}"
        f"&tls_key={tls_files.client}&request_timeout=5"
    )
    unverified = f"{tls_server.url}?tls=true&tls_verify=false"
    probe = await PostgresProbe.open(tls_server.url)
    try:
        async with connect(verified, ns) as a, connect(unverified, ns) as b, a.lock("tls"):
            assert await b.lock("tls").try_acquire() is None
            assert all(ssl for ssl, _ in await probe.tls_sessions())
    finally:
        await probe.aclose()
