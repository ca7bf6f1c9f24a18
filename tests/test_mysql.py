"""MySQL/MariaDB backend: faults on a real server, names, fencing table, connections, example.

The conformance suite runs on this backend in tests/backends/test_mysql.py; this file covers
what is specific to it: ``KILL CONNECTION`` of a holder, a server restart or crash under waiters,
connections left behind by cancelled waiters (``SHOW PROCESSLIST``), hashed long names, the
fencing table, the MySQL-8 whole-second timeout path, option checking and the inventory
example.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest

import aiodlock
from aiodlock.backends import Busy, Kind, LockSpec
from aiodlock.testing import History, settle
from aiodlock.testing.conformance import LATE_RENEWAL_SLACK
from tests.helpers import (
    cut_off_grants,
    eventually,
    release_meets_keep_alives,
    taken_once_free,
    wait_until,
)
from tests.servers import free_port
from tests.support_mysql import MAX_LOCK_NAME, MariaDBServer, MySQLProbe, lock_name

if TYPE_CHECKING:
    from aiodlock.backends.mysql import MySQLBackend

pytestmark = pytest.mark.mysql

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ns() -> str:
    return f"my{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def probe(mysql_url: str) -> AsyncIterator[MySQLProbe]:
    made = await MySQLProbe.open(mysql_url)
    try:
        yield made
    finally:
        await made.aclose()


def connect(url: str, ns: str, **options: object) -> aiodlock.LockClient:
    return aiodlock.connect(url, namespace=ns, **options)


def backend_of(client: aiodlock.LockClient) -> MySQLBackend:
    from aiodlock.backends.mysql import MySQLBackend

    backend = client.backend
    assert isinstance(backend, MySQLBackend)
    return backend


# ---------------------------------------------------------------------- KILL CONNECTION


async def test_kill_connection_cancels_body_and_next_holder_gets_larger_token(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    loop = asyncio.get_running_loop()
    history = History()
    body_cancelled = asyncio.Event()
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        with pytest.raises(aiodlock.LockLostError, match="ended the session"):
            async with a.lock("stock", ttl=30) as first:
                with history.hold("a", first.fencing_token):
                    waiter = asyncio.create_task(b.lock("stock", ttl=30).acquire(timeout=10))
                    await eventually(lambda: _count_waits(probe, ns, 1))
                    (thread,) = (await probe.user_locks(ns)).values()
                    killed_at = loop.time()
                    # From another task: the loss may cancel this body before KILL's reply.
                    killer = asyncio.create_task(probe.kill(thread))
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        body_cancelled.set()
                        raise
        await killer
        # With ttl=30 the next keep-alive is 10 s away: the socket watch reported the loss.
        noticed = loop.time() - killed_at
        assert noticed < 1.0, noticed
        assert body_cancelled.is_set() and first.lost.is_set()
        second = await waiter  # woken by the server when the killed session's lock went
        with history.hold("b", second.fencing_token):
            assert second.fencing_token > first.fencing_token
            assert await a.lock("stock").try_acquire() is None
        await second.release()
    history.check(max_holders=1)
    assert await probe.leftovers(ns) == []


async def test_killed_semaphore_slot_is_lost_and_refilled(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        one = await a.semaphore("pool", limit=2).acquire()
        two = await b.semaphore("pool", limit=2).acquire()
        held = await probe.user_locks(ns)
        assert sorted(held) == [lock_name(ns, "s", "pool", 0), lock_name(ns, "s", "pool", 1)]
        await probe.kill(held[lock_name(ns, "s", "pool", 0)])
        await asyncio.wait_for(one.lost.wait(), 2)
        assert two.held
        three = await b.semaphore("pool", limit=2).acquire(timeout=2)
        assert three.fencing_token > two.fencing_token > one.fencing_token
        for lease in (two, three):
            await lease.release()
        with pytest.raises(aiodlock.LockNotOwnedError):
            await one.release()
    assert await probe.leftovers(ns) == []


# ---------------------------------------------------------------------- restart / crash


@pytest.fixture(scope="module")
def restartable() -> Iterator[MariaDBServer]:
    """A server of its own: restarting the session's server would disturb other tests."""
    with MariaDBServer() as server:
        yield server


@pytest.mark.parametrize("fault", ["restart", "crash"])
async def test_server_restart_under_waiters_never_gives_two_holders(
    restartable: MariaDBServer, ns: str, fault: str
) -> None:
    url = restartable.url
    history = History()
    outcomes: list[str] = []
    entered = asyncio.Event()

    async def holder(client: aiodlock.LockClient) -> None:
        try:
            async with client.lock("job", ttl=2) as lease:
                with history.hold("holder", lease.fencing_token):
                    entered.set()
                    await asyncio.sleep(60)
        except aiodlock.LockLostError:
            outcomes.append("holder lost")

    async def waiter(client: aiodlock.LockClient, i: int) -> None:
        try:
            async with client.lock("job", ttl=2, timeout=30) as lease:
                with history.hold(f"w{i}", lease.fencing_token):
                    await asyncio.sleep(0.02)
            outcomes.append("acquired")
        except aiodlock.LockLostError:
            # Granted as the server shut down (it freed the holder's session first), then
            # its own session ended too: told, never two holders.
            outcomes.append("waiter lost")
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
        probe = await MySQLProbe.open(url)
        try:
            await eventually(lambda: _count_waits(probe, ns, 6))
        finally:
            await probe.aclose()
        if fault == "restart":
            await asyncio.to_thread(restartable.restart)
        else:
            await asyncio.to_thread(lambda: restartable.kill().start())
        async with asyncio.timeout(60):
            await asyncio.gather(hold_task, *waiters)
        # The clients are usable again, and the fencing table survived: tokens keep growing.
        async with a.lock("job", timeout=10) as after:
            assert after.fencing_token > max(h.token for h in history.holds)
    assert outcomes.count("holder lost") == 1, outcomes
    assert len(outcomes) == 7
    assert set(outcomes) <= {"holder lost", "acquired", "waiter lost", "backend error"}
    # A shutting-down server frees a lock as it hangs up on its holder, and a waiter may be
    # granted while the holder's body is still being cancelled (measured: 56 us, in this
    # process): tokens order them, and the overlap is never longer than that cancellation.
    ordered = sorted(history.holds, key=lambda h: h.start)
    for earlier, later in itertools.pairwise(ordered):
        assert later.token > earlier.token, ordered
        assert earlier.end - later.start < 0.05, ordered


async def _count_waits(probe: MySQLProbe, ns: str, count: int) -> bool:
    return len(await probe.waits(ns)) >= count


# ---------------------------------------------------------------------- connections


async def test_hundred_cancelled_waiters_leave_no_connection(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    baseline = await probe.sessions()
    async with connect(mysql_url, ns) as owner, connect(mysql_url, ns) as c:
        leases = [await owner.lock(f"hot{i}").acquire() for i in range(100)]
        # A hundred held locks: two on connections of their own (an idle one was at hand),
        # the rest on the two shared sessions; an idle one may be left by a sweep.
        assert backend_of(owner).statistics()["connections"] <= 5
        tasks = [asyncio.create_task(c.lock(f"hot{i}").acquire()) for i in range(100)]
        # max_connections (8 by default) of them wait on the server, the rest for a
        # connection: within the stock max_connections (151) whatever the load.
        await eventually(lambda: _count_waits(probe, ns, 8), timeout=20)
        await wait_until(lambda: backend_of(c).statistics()["connection_waits"] == 92)
        assert backend_of(c).statistics()["waiters"] == 100
        assert len(await probe.waits(ns)) == 8
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        # The janitor KILLs the abandoned sessions: the server stops waiting at once.
        took = await eventually(lambda: _count_waits_below(probe, ns, 1))
        assert took < 2.0, took
        stats = backend_of(c).statistics()
        assert (stats["waiters"], stats["connection_waits"]) == (0, 0), stats
        # Whatever the client still has open is its small idle list and its shared
        # sessions, holding nothing.
        mine = (
            backend_of(c).statistics()["connections"]
            + backend_of(owner).statistics()["connections"]
        )
        assert backend_of(c).statistics()["connections"] <= 10
        await eventually(lambda: _sessions_are(probe, baseline + mine))
        for lease in leases:
            await lease.release()
    await eventually(lambda: _sessions_are(probe, baseline))
    assert await probe.leftovers(ns) == []


async def _count_waits_below(probe: MySQLProbe, ns: str, count: int) -> bool:
    return len(await probe.waits(ns)) < count


async def _sessions_are(probe: MySQLProbe, count: int) -> bool:
    return await probe.sessions() == count


async def test_idle_connections_never_hold_a_lock(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """The pool trap of aiomysql: a reused session must not carry a lock along."""
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
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
        idle = backend_of(a).statistics()["idle"] + backend_of(b).statistics()["idle"]
        assert idle > 0
        await settle(a)
        await settle(b)
        # A session scrapped by a cancelled acquire frees its lock when the server processes
        # the disconnect, a moment later; no event says when, so the condition is polled.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while (held := await probe.user_locks(ns)) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert held == {}  # no session, idle or in use, holds a lock
        assert backend_of(a).statistics()["held"] == backend_of(b).statistics()["held"] == 0
    assert await probe.leftovers(ns) == []


async def test_max_connections_bounds_the_lent_connections(mysql_url: str, ns: str) -> None:
    # Semaphores hold a lent connection each (mutexes share the shared sessions).
    # connect_timeout bounds the wait for a connection to come back: the third acquire's wait
    # below must outlast a release's round trip on a loaded machine.
    async with connect(mysql_url, ns, max_connections=2, connect_timeout=1) as c:
        one = await c.semaphore("a", limit=1).acquire()
        two = await c.semaphore("b", limit=1).acquire()
        with pytest.raises(aiodlock.BackendError, match="max_connections=2"):
            await c.semaphore("c", limit=1).try_acquire()
        async with c.lock("m"):  # a mutex still goes through, on a shared session
            pass
        third = asyncio.create_task(c.semaphore("c", limit=1).acquire())
        # "c" waits for a connection
        await wait_until(lambda: backend_of(c).statistics()["connection_waits"] == 1)
        await one.release()  # its connection goes idle and is reused for "c"
        await (await third).release()
        await two.release()
        stats = backend_of(c).statistics()
        assert stats["connections"] - stats["shared_sessions"] <= 2


async def test_a_statement_without_an_answer_is_cut_off_at_query_timeout(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """The grant and release statements share one timer for all (no timer per statement):
    a grant the server does not answer (its fencing table is locked by an operator) fails
    with BackendError right after query_timeout, and the client goes on working."""
    table = f"fence_{uuid.uuid4().hex[:12]}"
    try:
        # Long enough that the slack for a loaded machine still tells it from a doubled limit.
        limit = 1.0
        async with connect(mysql_url, ns, fence_table=table, query_timeout=limit) as c:
            took = await cut_off_grants(
                c,
                lambda: probe.rows(f"LOCK TABLES {table} WRITE"),
                lambda: probe.rows("UNLOCK TABLES"),
            )
        assert all(limit <= t < limit + LATE_RENEWAL_SLACK for t in took), took
    finally:
        await probe.rows(f"DROP TABLE IF EXISTS {table}")


async def test_release_while_a_keep_alive_is_in_flight(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """A release that meets a keep-alive mid-statement waits for it, then releases on the
    server: the lock is free when release() returns (a keep-alive cancelled by closing its
    session left the server to free the lock a moment later, after release() returned)."""
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        await release_meets_keep_alives(a, b)
    assert await probe.leftovers(ns) == []


# ---------------------------------------------------------------------- the waiting handoff


async def test_waiter_leaving_with_an_unclaimed_server_grant_releases_it(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """GET_LOCK succeeded inside wait(), then the acquisition went away before claiming it."""
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        backend = backend_of(b)
        spec = LockSpec(ns, "handoff", Kind.MUTEX)
        holder = await a.lock("handoff").acquire()
        for how in ("normal exit", "cancelled"):
            owner = uuid.uuid4().hex
            assert isinstance(await backend.try_acquire(spec, owner, 5.0), Busy)
            with pytest.raises(asyncio.CancelledError) if how == "cancelled" else _nothing():
                async with backend.waiter(spec, owner) as waiter:
                    await holder.release()
                    await waiter.wait(5)  # the server grants it to this connection
                    assert len(await probe.user_locks(ns)) == 1
                    if how == "cancelled":
                        raise asyncio.CancelledError
            assert await probe.user_locks(ns) == {}, how
            assert await backend.release(spec, owner) is False
            holder = await a.lock("handoff").acquire(timeout=1)
        await holder.release()
    assert await probe.leftovers(ns) == []


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def test_grant_inside_wait_is_claimed_not_raced(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """The connection that GET_LOCK'd during the wait is the holder: no release-then-race."""
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        holder = await a.lock("h").acquire()
        waiting = asyncio.create_task(b.lock("h").acquire(timeout=5))
        await eventually(lambda: _count_waits(probe, ns, 1))  # inside GET_LOCK on its connection
        waiting_conns = backend_of(b).statistics()["connections"]
        await holder.release()
        lease = await waiting
        assert backend_of(b).statistics()["connections"] == waiting_conns
        assert lease.fencing_token == holder.fencing_token + 1
        await lease.release()


async def test_a_grant_inside_a_wait_comes_with_its_token(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """A mutex's wait is the fencing statement itself: the waiter granted the lock when the
    holder releases sends no further statement for its token, and its lease is timed from
    that statement's start (the server's idle clock starts later), not from the grant."""
    # Slices of ttl/3 (wait_slice too): a 2 s slice outlasts the 0.4 s below however late it
    # comes on a loaded machine, so the wait seen is the one that is granted.
    ttl = 6.0
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns, wait_slice=ttl / 3) as b:
        holder = await a.lock("w").acquire()
        waiting = asyncio.create_task(b.lock("w", ttl=ttl).acquire(timeout=5))
        waits: list[tuple[int, str]] = []

        async def one_wait() -> bool:
            # One look: a second query may fall between two of the wait's slices.
            waits[:] = await probe.waits(ns)
            return len(waits) == 1

        await eventually(one_wait)
        [(_, statement)] = waits
        assert statement.startswith("INSERT INTO")
        await asyncio.sleep(0.4)  # the wait's statement is now >= 0.4 s old (an age, not a guess)
        inserts = await _inserts(probe)
        released_at = asyncio.get_running_loop().time()
        await holder.release()
        lease = await waiting
        assert await _inserts(probe) == inserts  # no fencing statement after the grant
        assert lease.fencing_token == holder.fencing_token + 1
        assert lease.valid_until < released_at + ttl - 0.2
        await lease.release()
    assert await probe.leftovers(ns) == []


async def test_a_task_refused_by_its_own_client_sends_nothing_while_it_waits(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """While a task of a client holds a mutex, its session has the lock: the attempts of the
    client's other tasks are refused by the client itself, unsent, and a waiting task's only
    statement is its (fenced) wait, granted the moment the holder releases. A holder whose
    session the server ended refuses nobody: its sibling gets the lock."""
    async with connect(mysql_url, ns) as a:
        holder = await a.lock("own").acquire()
        inserts = await _inserts(probe)
        assert await a.lock("own").try_acquire() is None
        assert await _inserts(probe) == inserts  # refused without a statement
        waiting = asyncio.create_task(a.lock("own").acquire(timeout=5))
        await eventually(lambda: _count_waits(probe, ns, 1))
        assert await _inserts(probe) == inserts + 1  # its wait, and nothing before it
        await holder.release()
        lease = await waiting
        assert await _inserts(probe) == inserts + 1  # the wait's grant came with its token
        assert lease.fencing_token == holder.fencing_token + 1
        (thread,) = (await probe.user_locks(ns)).values()
        await probe.kill(thread)
        await lease.lost.wait()
        sibling = await taken_once_free(a.lock("own"))
        assert sibling.fencing_token > lease.fencing_token
        await sibling.release()
    assert await probe.leftovers(ns) == []


async def _inserts(probe: MySQLProbe) -> int:
    """The server's count of INSERT statements (plain and INSERT ... SELECT) so far."""
    rows = await probe.rows(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_insert', 'Com_insert_select')"
    )
    return sum(int(value) for _, value in rows)


async def test_mysql8_whole_second_timeouts(mysql_url: str, ns: str, probe: MySQLProbe) -> None:
    """MySQL rounds GET_LOCK's timeout to seconds: sub-second waits are cut on the client."""
    loop = asyncio.get_running_loop()
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        backend_of(b).fractional_timeouts = False  # behave as against MySQL 8
        holder = await a.lock("w").acquire()
        started = loop.time()
        with pytest.raises(aiodlock.LockTimeoutError):
            await b.lock("w").acquire(timeout=0.3)
        assert 0.3 - 1e-3 <= loop.time() - started < 0.9  # uvloop keeps time in whole ms
        # The timed-out wait's whole second on the server is over: what is seen next is ours.
        await eventually(lambda: _count_waits_below(probe, ns, 1))
        waiting = asyncio.create_task(b.lock("w").acquire(timeout=5))
        await eventually(lambda: _count_waits(probe, ns, 1))  # inside a whole-second GET_LOCK
        await holder.release()
        lease = await waiting
        assert lease.fencing_token > holder.fencing_token
        await lease.release()
    assert await probe.leftovers(ns) == []


async def test_semaphore_waiter_notices_any_freed_slot_within_a_slice(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """A waiter waits on one slot per slice: any other freed slot is seen by the slice's end."""
    loop = asyncio.get_running_loop()
    wait_slice = 0.3
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns, wait_slice=wait_slice) as b:
        for victim in range(3):  # slots are taken in order: lease i holds slot i
            leases = [await a.semaphore("sem", limit=3).acquire() for _ in range(3)]
            waiting = asyncio.create_task(b.semaphore("sem", limit=3).acquire(timeout=5))
            await eventually(lambda: _count_waits(probe, ns, 1))  # waiting on one slot
            released_at = loop.time()
            await leases.pop(victim).release()
            got = await waiting
            # By the end of the slice (if it waited on another slot), plus the slack.
            assert loop.time() - released_at < wait_slice + LATE_RENEWAL_SLACK
            for lease in [got, *leases]:
                await lease.release()


# ---------------------------------------------------------------------- names


async def test_long_names_are_hashed_and_do_not_collide(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    stem = "order/" + "x" * 120
    names = [stem + "a", stem + "b", "Order:42", "order:42", "ünï", "uni", "a b", "a_b"]
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        leases = [await (a if i % 2 else b).lock(n).acquire(timeout=2) for i, n in enumerate(names)]
        for name in names:  # each is held, by exactly one of them
            assert await a.lock(name).try_acquire() is None
        held = await probe.user_locks(ns)
        assert len(held) == len(names)
        assert all(len(n) <= MAX_LOCK_NAME and n.isascii() for n in held)
        assert lock_name(ns, "m", stem + "a") in held and "~" in lock_name(ns, "m", stem + "a")
        sems = [await a.semaphore(stem + s, limit=2).acquire() for s in "ab"]
        assert len(await probe.user_locks(ns)) == len(names) + 2
        for lease in leases + sems:
            await lease.release()
    assert await probe.leftovers(ns) == []


def test_name_encoding() -> None:
    assert lock_name("shop", "m", "order:42") == "shop:m:order:42"
    assert lock_name("shop", "s", "quota", 3) == "shop:s:quota#3"
    hashed = lock_name("shop", "m", "Order:42")
    assert hashed.startswith("shop:m:order:42~") and len(hashed) == len("shop:m:order:42~") + 40
    long_a, long_b = (lock_name("ns", "m", "y" * 200 + c) for c in "ab")
    assert long_a != long_b and len(long_a) == len(long_b) == MAX_LOCK_NAME
    assert long_a[:23] == long_b[:23]  # same readable prefix; the hash tells them apart
    # A slot suffix and a name that looks like one stay apart.
    assert lock_name("ns", "s", "a#1", 0) != lock_name("ns", "s", "a", 1)
    assert lock_name("ns", "m", "x", None) != lock_name("ns", "s", "x", 0)


async def test_mutex_and_semaphore_families_are_independent(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """A mutex and a semaphore of one name are two locks (two server names): each is taken at
    once while the other is held, and each really excludes."""
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        mutex = await a.lock("x").try_acquire()
        assert mutex is not None
        permit = await a.semaphore("x", limit=1).try_acquire()
        assert permit is not None, "the semaphore was refused while the mutex was held"
        assert sorted(await probe.user_locks(ns)) == sorted(
            [lock_name(ns, "m", "x"), lock_name(ns, "s", "x", 0)]
        )
        assert await b.lock("x").try_acquire() is None
        assert await b.semaphore("x", limit=1).try_acquire() is None
        for lease in (mutex, permit):
            await lease.release()
    assert await probe.leftovers(ns) == []


# ---------------------------------------------------------------------- fencing table


async def test_fencing_table_is_created_on_first_use(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    table = f"fence_{uuid.uuid4().hex[:12]}"
    exists = f"SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_NAME = '{table}'"
    assert (await probe.rows(exists))[0][0] == 0
    try:
        async with connect(mysql_url, ns, fence_table=table) as a:
            tokens = []
            for _ in range(3):
                async with a.lock("t") as lease:
                    tokens.append(lease.fencing_token)
            async with a.semaphore("t", limit=2) as lease:  # the families share the row
                tokens.append(lease.fencing_token)
        # A new row starts from the server's clock in microseconds, then counts by one.
        clock = "SELECT UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))"
        (now_us,) = (await probe.rows(clock))[0]
        assert now_us - 60_000_000 < tokens[0] <= now_us
        assert tokens == [tokens[0] + i for i in range(4)]
        assert (await probe.rows(exists))[0][0] == 1
        assert (await probe.rows(f"SELECT token FROM {table}")) == [(tokens[3],)]
    finally:
        await probe.rows(f"DROP TABLE IF EXISTS {table}")


async def test_fencing_table_without_sem_limit_gets_the_column(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """A fence table made before semaphore limits (and the operators' columns) were recorded
    is upgraded on first use; its rows and tokens are kept, and inspect sees its names."""
    table = f"fence_{uuid.uuid4().hex[:12]}"
    await probe.rows(
        f"CREATE TABLE {table} (lock_key BINARY(32) NOT NULL PRIMARY KEY, "
        "lock_name VARCHAR(64) CHARACTER SET ascii NOT NULL, token BIGINT UNSIGNED NOT NULL)"
    )
    try:
        async with (
            connect(mysql_url, ns, fence_table=table) as a,
            connect(mysql_url, ns, fence_table=table) as b,
        ):
            async with a.lock("t") as first:
                (info,) = await b.inspect()
                assert (info.name, info.fencing_token) == ("t", first.fencing_token)
                assert [h.owner for h in info.holders] == [first.owner]
            async with a.semaphore("t", limit=2) as lease:
                assert lease.fencing_token == first.fencing_token + 1
                with pytest.raises(aiodlock.LimitMismatchError, match="limit 2"):
                    await b.semaphore("t", limit=3).acquire(timeout=2)
        # The refused attempt took a slot and a token before its check: tokens only increase.
        assert await probe.rows(f"SELECT token, sem_limit FROM {table}") == [
            (first.fencing_token + 2, 2)
        ]
    finally:
        await probe.rows(f"DROP TABLE IF EXISTS {table}")


async def test_idle_fencing_rows_are_swept_and_tokens_still_increase(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """A fencing row unused for ``fence_ttl`` is deleted by the next client's sweep (the table
    does not grow with every name ever locked), and the name's next token is still larger
    than every earlier one. ``fence_ttl=0`` keeps rows."""
    table = f"fence_{uuid.uuid4().hex[:12]}"
    try:
        async with connect(mysql_url, ns, fence_table=table, fence_ttl=60) as a:
            for i in range(5):
                async with a.lock(f"old{i}") as lease:
                    pass
            before = lease.fencing_token
        # Ten minutes idle, as far as the sweep can tell (no waiting in a test).
        await probe.rows(f"UPDATE {table} SET touched = touched - INTERVAL 10 MINUTE")
        async with connect(mysql_url, ns, fence_table=table, fence_ttl=0) as keeper:
            async with keeper.lock("fresh"):
                pass
            await settle(keeper)
        assert len(await probe.rows(f"SELECT lock_key FROM {table}")) == 6

        async with connect(mysql_url, ns, fence_table=table, fence_ttl=60) as b:
            async with b.lock("fresh"):
                pass

            async def swept() -> bool:
                return len(await probe.rows(f"SELECT lock_key FROM {table}")) == 1

            await eventually(swept)
            async with b.lock("old4") as again:
                assert again.fencing_token > before
    finally:
        await probe.rows(f"DROP TABLE IF EXISTS {table}")


def test_fence_ttl_is_checked() -> None:
    with pytest.raises(ValueError, match="fence_ttl"):
        aiodlock.connect("mysql://u@127.0.0.1:1/db", fence_ttl=-1)


async def test_killed_holders_limit_is_stale_and_replaced(
    mysql_url: str, ns: str, probe: MySQLProbe
) -> None:
    """The recorded limit outlives a killed holder's session, but with no slot of it taken
    any more it is stale: a new limit replaces it (and is then enforced)."""
    async with connect(mysql_url, ns) as a, connect(mysql_url, ns) as b:
        old = await a.semaphore("pool", limit=2).acquire()
        with pytest.raises(aiodlock.LimitMismatchError):
            await b.semaphore("pool", limit=1).acquire(timeout=2)  # its only slot is taken
        await probe.kill((await probe.user_locks(ns))[lock_name(ns, "s", "pool", 0)])
        await asyncio.wait_for(old.lost.wait(), 2)
        async with b.semaphore("pool", limit=1, timeout=2):
            with pytest.raises(aiodlock.LimitMismatchError, match="asks for limit 2"):
                await a.semaphore("pool", limit=2).acquire(timeout=2)
    assert await probe.leftovers(ns) == []


# ---------------------------------------------------------------------- URL and options


async def test_password_never_shows(mysql_url: str, ns: str) -> None:
    secret = MariaDBServer.password
    quoted = quote(secret, safe="")

    def clean(text: str) -> None:
        assert secret not in text and quoted not in text, text

    async with connect(mysql_url, ns) as c:
        clean(repr(c))
        clean(repr(c.lock("x")))
        clean(c.backend.describe())
        clean(str(c.statistics()))
        assert "***" in repr(c)
    wrong = quote("wrong" + secret, safe="")
    bad = mysql_url.replace(quoted, wrong)
    with pytest.raises(aiodlock.BackendError) as info:
        async with connect(bad, ns):
            pass
    clean(str(info.value))
    assert wrong not in str(info.value) and "wrong" + secret not in str(info.value)
    assert info.value.__cause__ is not None
    unreachable = mysql_url.rsplit("@", 1)[0] + f"@127.0.0.1:{free_port()}/db"
    with pytest.raises(aiodlock.BackendError) as info:
        async with connect(unreachable, ns, connect_timeout=2):
            pass
    clean(str(info.value))


async def test_unix_socket_option(mariadb_server: MariaDBServer, ns: str) -> None:
    password = quote(MariaDBServer.password, safe="")
    url = (
        f"mysql://{MariaDBServer.user}:{password}@localhost/{MariaDBServer.database}"
        f"?unix_socket={mariadb_server.socket_path}&wait_slice=0.5"
    )
    async with connect(url, ns) as a, connect(mariadb_server.url, ns) as b:
        async with a.lock("sock") as lease:
            assert await b.lock("sock").try_acquire() is None
        assert lease.fencing_token >= 1


@pytest.mark.parametrize(
    ("url_tail", "options", "error", "message"),
    [
        ("", {}, ValueError, "needs a database"),
        ("/db", {"wait_slice": 0}, ValueError, "wait_slice must be > 0"),
        ("/db", {"max_connections": 0}, ValueError, "max_connections must be >= 1"),
        ("/db", {"max_idle": "many"}, TypeError, "max_idle must be an int"),
        ("/db", {"fence_table": "f; DROP TABLE x"}, ValueError, "fence_table"),
        ("/db", {"unix_socket": 3}, TypeError, "unix_socket"),
        ("/db?wait_slice=soon", {}, ValueError, "wait_slice must be a number"),
        ("/db", {"pool_size": 3}, TypeError, "unknown option 'pool_size'"),
    ],
)
def test_bad_options_fail_at_connect(
    url_tail: str, options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        aiodlock.connect(f"mysql://u:secret@127.0.0.1:1{url_tail}", **options)


def test_unsupported_kinds_fail_at_construction() -> None:
    client = aiodlock.connect("mysql://u:secret@127.0.0.1:1/db")
    for build in (
        lambda: client.read_lock("x"),
        lambda: client.write_lock("x"),
        lambda: client.lock("x", fair=True),
        lambda: client.semaphore("x", limit=257),
    ):
        with pytest.raises(aiodlock.UnsupportedError) as info:
            build()
        assert "secret" not in str(info.value)


# ---------------------------------------------------------------------- the example


def test_inventory_example_is_exact(mysql_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "examples/inventory.py", "--url", mysql_url],
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
    assert MariaDBServer.password not in result.stdout + result.stderr


def test_request_timeout_is_the_canonical_name_of_query_timeout() -> None:
    aiodlock.connect("mysql://u@127.0.0.1:1/db", request_timeout=2)
    aiodlock.connect("mysql://u@127.0.0.1:1/db?query_timeout=2")
    with pytest.raises(ValueError, match="two names of one option"):
        aiodlock.connect("mysql://u@127.0.0.1:1/db", query_timeout=1, request_timeout=1)
