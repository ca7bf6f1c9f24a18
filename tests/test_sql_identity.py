"""Holder identity and namespaces on MySQL/MariaDB and PostgreSQL.

Each server session of a client records the client's ``identity`` once, when the backend opens
it, in the sessions table beside the fencing table (``aiodlock_fence_sessions``); ``inspect``
reads it for every holder. These tests look at that table from outside: whoever holds a lock
(a shared session, a session of its own, a semaphore permit, a reader) shows its client's
identity; a row of an ended session is neither shown nor kept; a holder without a row (older
code) shows None.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

import aiodlock
from aiodlock.testing import settle
from tests.helpers import eventually

SESSIONS = "aiodlock_fence_sessions"


@dataclass
class Server:
    """One SQL server seen from a plain session: its URL, a statement, who is connected."""

    scheme: str
    url: str
    rows: Callable[[str], Awaitable[list[tuple[Any, ...]]]]
    live: Callable[[], Awaitable[set[int]]]
    """The ids of the server's sessions now (pids, connection ids)."""


@pytest_asyncio.fixture(
    params=[
        pytest.param("mysql", marks=pytest.mark.mysql),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    probe: Any
    if request.param == "mysql":
        from tests.support_mysql import MySQLProbe

        url = str(request.getfixturevalue("mysql_url"))
        probe = await MySQLProbe.open(url)

        async def mysql_live() -> set[int]:
            rows = await probe.rows("SELECT ID FROM information_schema.PROCESSLIST")
            return {int(r[0]) for r in rows}

        yield Server("mysql", url, probe.rows, mysql_live)
    else:
        from tests.support_postgres import PostgresProbe

        url = str(request.getfixturevalue("postgres_url"))
        probe = await PostgresProbe.open(url)

        async def pg_live() -> set[int]:
            return {int(r[0]) for r in await probe.rows("SELECT pid FROM pg_stat_activity")}

        yield Server("postgres", url, probe.rows, pg_live)
    await probe.aclose()


def _namespace() -> str:
    return f"who-{uuid.uuid4().hex[:10]}"


def _session_key(server: Server) -> str:
    return "connection" if server.scheme == "mysql" else "pid"


async def _rows_of(server: Server, identity: str) -> list[int]:
    """The session ids whose row names ``identity``."""
    rows = await server.rows(f"SELECT {_session_key(server)}, identity FROM {SESSIONS}")
    return sorted(int(s) for s, who in rows if _text(who) == identity)


def _text(value: Any) -> str:
    return bytes(value).decode() if isinstance(value, bytes | bytearray) else str(value)


async def _identities(client: aiodlock.LockClient, pattern: str = "*") -> dict[str, set[Any]]:
    return {info.name: {h.identity for h in info.holders} for info in await client.inspect(pattern)}


async def test_every_kind_of_holder_shows_its_clients_identity(server: Server) -> None:
    """Mutexes on the shared sessions and on a session of their own, semaphore permits of two
    clients, readers (PostgreSQL): each holder names its own client."""
    ns = _namespace()
    async with (
        aiodlock.connect(server.url, namespace=ns, identity="client a: 'ä'") as a,
        aiodlock.connect(server.url, namespace=ns, identity="client b / pod-7") as b,
    ):
        many = await asyncio.gather(*(a.lock(f"many:{i}", ttl=30).acquire() for i in range(12)))
        assert a.statistics().backend["shared_leases"] > 0  # some are on shared sessions
        # A contended acquire waits, and is granted, on a session of its own.
        first = await a.lock("handed", ttl=30).acquire()
        waiting = asyncio.ensure_future(b.lock("handed", ttl=30).acquire())
        await eventually(lambda: _has_waiter(a, "handed"))
        await first.release()
        handed = await waiting
        permits = [
            await a.semaphore("pool", limit=3, ttl=30).acquire(),
            await b.semaphore("pool", limit=3, ttl=30).acquire(),
        ]
        readers = []
        if server.scheme == "postgres":
            readers = [await c.read_lock("doc", ttl=30).acquire() for c in (a, b)]
        found = await _identities(b)
        assert {found[f"many:{i}"] == {a.identity} for i in range(12)} == {True}
        assert found["handed"] == {b.identity}
        assert found["pool"] == {a.identity, b.identity}
        if readers:
            assert found["doc"] == {a.identity, b.identity}
        for lease in [*many, handed, *permits, *readers]:
            await lease.release()


async def _has_waiter(client: aiodlock.LockClient, name: str) -> bool:
    return any(info.waiters for info in await client.inspect(name))


async def test_a_holder_without_a_row_shows_no_identity(server: Server) -> None:
    """A session that recorded nothing (opened by an older aiodlock) is shown with
    ``identity=None``, its owner as before."""
    ns, identity = _namespace(), f"older {uuid.uuid4().hex}"
    async with aiodlock.connect(server.url, namespace=ns, identity=identity) as old:
        lease = await old.lock("legacy", ttl=30).acquire()
        await server.rows(f"DELETE FROM {SESSIONS} WHERE identity = {_literal(server, identity)}")
        (info,) = await old.inspect("legacy")
        assert [(h.owner, h.identity) for h in info.holders] == [(lease.owner, None)]
        await lease.release()


def _literal(server: Server, text: str) -> str:
    hexed = text.encode().hex()
    if server.scheme == "mysql":
        return f"X'{hexed}'"
    return f"convert_from(decode('{hexed}', 'hex'), 'UTF8')"


@pytest.mark.postgres
async def test_a_row_of_an_earlier_session_with_the_same_pid_is_not_shown(
    postgres_url: str,
) -> None:
    """PostgreSQL reuses pids: a row counts only for the session that wrote it (its
    ``backend_start``), not for a later one with that pid (here: the row made older)."""
    from tests.support_postgres import PostgresProbe

    probe = await PostgresProbe.open(postgres_url)
    ns, identity = _namespace(), f"reused {uuid.uuid4().hex}"
    try:
        async with (
            aiodlock.connect(postgres_url, namespace=ns, identity=identity) as locks,
            locks.lock("pid", ttl=30) as lease,
        ):
            (pid,) = await probe.holders(ns, "pid")
            await probe.rows(
                f"UPDATE {SESSIONS} SET backend_start = backend_start - interval '1 hour' "
                "WHERE pid = $1",
                pid,
            )
            (info,) = await locks.inspect("pid")
            assert [(h.owner, h.identity) for h in info.holders] == [(lease.owner, None)]
    finally:
        await probe.aclose()


async def test_the_rows_of_ended_sessions_go_at_the_next_sweep(server: Server) -> None:
    """A closed client's rows are deleted by the fencing sweep of any client (the first grant
    of a client sweeps); the rows of live sessions stay."""
    ns, identity = _namespace(), f"leaving {uuid.uuid4().hex}"
    async with aiodlock.connect(server.url, namespace=ns, identity=identity) as leaving:
        async with leaving.lock("bye", ttl=30):
            pass
        ended = await _rows_of(server, identity)
        assert ended
    await eventually(lambda: _all_gone(server, ended))
    staying = f"staying {uuid.uuid4().hex}"
    async with aiodlock.connect(server.url, namespace=ns, identity=staying) as sweeper:

        async def swept() -> bool:
            # A sweep finds no idle connection while the grant holds the only one: it is
            # then left to the next grant.
            async with sweeper.lock("sweep", ttl=30):
                pass
            await settle(sweeper)
            return await _rows_of(server, identity) == []

        await eventually(swept)
        assert await _rows_of(server, staying)  # its own live sessions keep theirs


async def _all_gone(server: Server, sessions: list[int]) -> bool:
    return not set(sessions) & await server.live()


async def test_the_sessions_table_is_added_beside_an_older_fencing_table(server: Server) -> None:
    """A fencing table made by an older aiodlock gets its sessions table when the next
    client starts, as it gets a missing column."""
    table = f"who_{uuid.uuid4().hex[:10]}"
    sessions = f"{table}_sessions"
    try:
        async with (
            aiodlock.connect(server.url, fence_table=table) as first,
            first.lock("made", ttl=30),
        ):
            pass
        await server.rows(f"DROP TABLE {sessions}")
        async with (
            aiodlock.connect(server.url, fence_table=table, identity="upgraded") as up,
            up.lock("made", ttl=30),
        ):
            (info,) = await up.inspect("made")
            assert [h.identity for h in info.holders] == ["upgraded"]
    finally:
        await server.rows(f"DROP TABLE IF EXISTS {sessions}")
        await server.rows(f"DROP TABLE IF EXISTS {table}")


async def test_namespaces_lists_each_namespace_in_use_sorted(server: Server) -> None:
    names = sorted(f"{_namespace()} {tail}" for tail in ("b/é", "a 'x'"))
    async with (
        aiodlock.connect(server.url, namespace=names[1]) as one,
        aiodlock.connect(server.url, namespace=names[0]) as two,
        one.lock("x", ttl=30),
        two.semaphore("y", limit=2, ttl=30),
    ):
        found = await one.namespaces()
        assert found == sorted(found)
        assert [ns for ns in found if ns in names] == names
