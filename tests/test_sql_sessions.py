"""Many held locks on a few server sessions (MySQL/MariaDB and PostgreSQL).

A free mutex is granted on one of the client's shared sessions (two by default); only a
contended acquire waits on a connection of its own. These tests run against the harness's
servers at their stock connection limits (PostgreSQL 100, MariaDB 151), where a session per
held lock ran a client out of connections at 99 and 100 held locks.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import pytest
import pytest_asyncio

import aiodlock
from aiodlock.testing import settle
from tests.helpers import eventually, told_at_once

TOLD_WITHIN: Final = 0.1
SCHEDULING_SLACK: Final = 0.15
HANDOVER_WITHIN: Final = 0.02  # the target: granted within 20 ms of the release


@dataclass
class Server:
    """One SQL server, seen from outside: sessions, who holds a lock, and ending a session."""

    url: str
    sessions: Callable[[], Awaitable[int]]
    holder_of: Callable[[str, str], Awaitable[list[int]]]
    end_session: Callable[[int], Awaitable[None]]
    leftovers: Callable[[str], Awaitable[list[str]]]


@pytest_asyncio.fixture(
    params=[
        pytest.param("mysql", marks=pytest.mark.mysql),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    probe: Any
    if request.param == "mysql":
        from tests.support_mysql import MySQLProbe, lock_name

        url = str(request.getfixturevalue("mysql_url"))
        probe = await MySQLProbe.open(url)

        async def mysql_holder(namespace: str, name: str) -> list[int]:
            thread = (await probe.user_locks(namespace)).get(lock_name(namespace, "m", name))
            return [] if thread is None else [thread]

        yield Server(url, probe.sessions, mysql_holder, probe.kill, probe.leftovers)
    else:
        from tests.support_postgres import PostgresProbe

        url = str(request.getfixturevalue("postgres_url"))
        probe = await PostgresProbe.open(url)
        yield Server(url, probe.sessions, probe.holders, probe.terminate, probe.leftovers)
    await probe.aclose()


def _namespace() -> str:
    return f"shared-{uuid.uuid4().hex[:10]}"


def _connections(client: aiodlock.LockClient) -> int:
    return int(client.statistics().backend["connections"])


async def test_a_thousand_held_locks_on_at_most_ten_connections(server: Server) -> None:
    namespace = _namespace()
    baseline = await server.sessions()
    used: dict[int, int] = {}
    async with (
        aiodlock.connect(server.url, namespace=namespace) as a,
        aiodlock.connect(server.url, namespace=namespace) as b,
    ):
        leases: list[aiodlock.Lease] = []
        for count in (10, 100, 1000):
            more = [a.lock(f"order:{i}").acquire() for i in range(len(leases), count)]
            leases += await asyncio.gather(*more)
            used[count] = _connections(a)
            assert used[count] <= 10, used
        assert a.statistics().backend["held"] == 1000
        # The server sees it too: both clients together stay far below its limit.
        assert await server.sessions() - baseline <= 10 + _connections(b)
        # Another client is refused those names and granted others.
        for i in range(0, 1000, 50):
            assert await b.lock(f"order:{i}").try_acquire() is None
        others = [await b.lock(f"invoice:{i}").acquire() for i in range(20)]
        tokens = [lease.fencing_token for lease in leases]
        assert len(set(tokens)) == 1000
        for lease in others + leases:
            await lease.release()
        # Released means free: the other client takes every name at once.
        for i in range(0, 1000, 50):
            taken = await b.lock(f"order:{i}").try_acquire()
            assert taken is not None and taken.fencing_token > tokens[i]
            await taken.release()
        await settle(a)
        await settle(b)
    print(f"connections for 10/100/1000 held locks: {used}")  # for the closing note
    assert await server.leftovers(namespace) == []


async def test_a_killed_shared_session_loses_every_lease_on_it_at_once(server: Server) -> None:
    namespace = _namespace()
    loop = asyncio.get_running_loop()
    baseline = await server.sessions()
    async with (
        aiodlock.connect(server.url, namespace=namespace) as a,
        aiodlock.connect(server.url, namespace=namespace) as b,
    ):
        names = [f"job:{i}" for i in range(40)]
        entered = {name: asyncio.Event() for name in names}
        told: dict[str, float] = {}

        async def hold(name: str) -> None:
            try:
                async with a.lock(name):  # the default ttl: 30 s, renewals 10 s apart
                    entered[name].set()
                    await asyncio.Event().wait()
            except aiodlock.LockLostError:
                told[name] = loop.time()

        bodies = [asyncio.create_task(hold(name)) for name in names]
        for event in entered.values():
            await event.wait()
        sessions = {name: (await server.holder_of(namespace, name)) for name in names}
        assert all(len(s) == 1 for s in sessions.values()), sessions
        by_session: dict[int, list[str]] = {}
        for name, (session,) in sessions.items():
            by_session.setdefault(session, []).append(name)
        # The client's shared sessions, and its first lock on the idle connection it had.
        assert len(by_session) <= 3, by_session
        victim, doomed = max(by_session.items(), key=lambda item: len(item[1]))
        killed_at = loop.time()
        await server.end_session(victim)
        await asyncio.wait([bodies[names.index(n)] for n in doomed], timeout=15)
        # Every lease on the ended session is told at once (not at its next renewal, 10 s
        # away), the others keep their locks.
        assert sorted(told) == sorted(doomed)
        delays = [told[n] - killed_at for n in doomed]
        told_at_once(delays, TOLD_WITHIN + SCHEDULING_SLACK)
        print(f"{len(doomed)} leases told {min(delays) * 1000:.1f}-{max(delays) * 1000:.1f} ms")
        survivors = [n for n in names if n not in doomed]
        assert not any(bodies[names.index(n)].done() for n in survivors)
        # The server freed them with the session: another client takes them.
        for name in doomed:
            lease = await b.lock(name).try_acquire()
            assert lease is not None, name
            await lease.release()
        for body in bodies:
            body.cancel()
        await asyncio.gather(*bodies, return_exceptions=True)
        await settle(a)
        # New grants go to a new shared session: the client carries on.
        async with a.lock(doomed[0], timeout=5):
            pass
    assert await server.leftovers(namespace) == []

    async def all_closed() -> bool:
        return await server.sessions() <= baseline

    await eventually(all_closed)  # no connection left behind either


async def test_a_contended_acquire_is_granted_within_20_ms_of_the_release(
    server: Server,
) -> None:
    namespace = _namespace()
    loop = asyncio.get_running_loop()
    handovers = []
    async with (
        aiodlock.connect(server.url, namespace=namespace) as a,
        aiodlock.connect(server.url, namespace=namespace) as b,
    ):
        for trial in range(8):
            name = f"hot:{trial}"
            held = await a.lock(name).acquire()
            waiting = asyncio.create_task(b.lock(name).acquire(timeout=10))

            async def waits_on_the_server(waiting: asyncio.Task[Any] = waiting) -> bool:
                return b.statistics().backend["waiters"] == 1 and not waiting.done()

            await eventually(waits_on_the_server)
            await asyncio.sleep(0.05)  # the wait statement reaches the server (no event for it)
            released_at = loop.time()
            await held.release()
            lease = await waiting
            handovers.append(loop.time() - released_at)
            assert lease.fencing_token > held.fencing_token
            await lease.release()
    told_at_once(handovers, HANDOVER_WITHIN + SCHEDULING_SLACK)
    print(f"handover after release: {[round(t * 1000, 1) for t in handovers]} ms")
    assert await server.leftovers(namespace) == []


async def test_a_refused_try_leaves_the_shared_sessions_idle_timeout_alone(
    server: Server,
) -> None:
    """A refused try with a short ttl on a session that holds longer leases: the server must
    not end the session (and those leases) after the short ttl. The wait is the server's own
    timer, which nothing announces."""
    namespace = _namespace()
    async with (
        # One shared session: the refused try runs on the session that holds "kept".
        aiodlock.connect(server.url, namespace=namespace, shared_sessions=1) as a,
        aiodlock.connect(server.url, namespace=namespace) as b,
        a.lock("first", ttl=30),  # on the client's idle connection: the next ones share
        a.lock("kept", ttl=30) as kept,
        b.lock("busy", ttl=30),
    ):
        assert await a.lock("busy", ttl=1).try_acquire() is None
        # Its owner is still named (the session's name is not reset by the refusal).
        (info,) = [i for i in await b.inspect() if i.name == "kept"]
        assert [h.owner for h in info.holders] == [kept.owner]
        await asyncio.sleep(2.5)  # past the refused try's ttl (1 s), short of kept's renewal
        assert not kept.lost.is_set()
        assert await server.holder_of(namespace, "kept")
    assert await server.leftovers(namespace) == []


@pytest.mark.postgres
async def test_a_grant_the_server_answers_with_an_error_keeps_the_shared_session(
    postgres_url: str,
) -> None:
    """A grant statement that fails on the server (here a trigger on the fencing table; in
    the field, the lock table out of memory) leaves nothing held and the session's other
    leases alone: only a session in doubt is given up."""
    from tests.support_postgres import PostgresProbe, advisory_key

    namespace, table = _namespace(), f"fence_{uuid.uuid4().hex[:10]}"
    probe = await PostgresProbe.open(postgres_url)
    try:
        async with (
            # One connection of its own (max_connections=1), which "first" takes: the next
            # grants go to the shared session, not to a connection the fencing sweep left
            # idle, where a failed grant is cleaned in the background instead.
            aiodlock.connect(
                postgres_url,
                namespace=namespace,
                fence_table=table,
                shared_sessions=1,
                max_connections=1,
            ) as a,
            a.lock("first"),
            a.lock("kept") as kept,
        ):
            await probe.rows(
                f"CREATE FUNCTION {table}_poison() RETURNS trigger LANGUAGE plpgsql AS "
                "$$BEGIN IF NEW.name = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF; "
                "RETURN NEW; END$$"
            )
            await probe.rows(
                f"CREATE TRIGGER poison BEFORE INSERT ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {table}_poison()"
            )
            with pytest.raises(aiodlock.BackendError, match="poisoned"):
                await a.lock("poison").try_acquire()
            held = {key for _, key, _, granted in await probe.advisory_locks() if granted}
            assert advisory_key(namespace, "m", "poison") not in held
            assert advisory_key(namespace, "m", "kept") in held
            assert not kept.lost.is_set()
            stats = a.statistics().backend
            assert stats["shared_leases"] == 1, stats
            async with a.lock("fine", timeout=5):
                pass
    finally:
        await probe.rows(f"DROP TABLE IF EXISTS {table}")
        await probe.rows(f"DROP FUNCTION IF EXISTS {table}_poison()")
        await probe.aclose()
