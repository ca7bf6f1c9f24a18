"""ZooKeeper when the service misbehaves without failing outright (issue 33), on real servers.

A SIGSTOPped server (the connection stays open, nothing answers): every call ends as
``aiodlock.BackendError`` (the driver's exception chained) within its bound. A lock broken
through aiodlock (API and CLI) or its node deleted by another client: the holder's body is
cancelled with ``LockLostError`` within 100 ms (a watch on its own node). A hung member of an
ensemble: a new client connects through the others, within one ``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Final

import pytest

import aiodlock
from tests.helpers import holder_process, told_at_once
from tests.servers import LOOPBACK
from tests.support_zookeeper import ZooKeeperEnsemble, ZooKeeperProbe, ZooKeeperServer

if TYPE_CHECKING:
    from aiodlock.backends.zookeeper import ZooKeeperBackend

pytestmark = pytest.mark.zookeeper

TOLD_WITHIN: Final = 0.1
"""Issue 33: a holder hears of a break within 100 ms."""
LOADED_SLACK: Final = 0.15
"""What a loaded 2-core machine (two test workers, Java servers) adds to a latency bound:
measured break -> LockLostError was 3-21 ms idle (max of 20), up to ~55 ms for a break
within the first 50 ms of the hold (the watch is armed 50 ms after the grant)."""
TRIALS: Final = 20


@pytest.fixture
def namespace() -> str:
    return f"g{os.urandom(6).hex()}"


@pytest.fixture
def fresh_server() -> Iterator[ZooKeeperServer]:
    """A standalone server of this test's own, for faults that hit the whole server."""
    with ZooKeeperServer() as server:
        yield server


def backend_of(client: aiodlock.LockClient) -> ZooKeeperBackend:
    from aiodlock.backends.zookeeper import ZooKeeperBackend

    backend = client.backend
    assert isinstance(backend, ZooKeeperBackend)
    return backend


def _is_driver_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("aiozk")


# ---------------------------------------------------------------------- a stalled server


async def test_a_stalled_server_fails_every_call_as_backend_error_within_its_bound(
    fresh_server: ZooKeeperServer, namespace: str
) -> None:
    """SIGSTOP: 8 concurrent acquires and a try_acquire end as BackendError or
    LockTimeoutError, never as the driver's exception, and none waits out several request
    timeouts in a row (26 s with request_timeout=10 before the attempt was bounded)."""
    loop = asyncio.get_running_loop()
    request_timeout = 1.0
    url = f"{fresh_server.url}/?request_timeout={request_timeout:g}&session_timeout=10"
    async with aiodlock.connect(url, namespace=namespace) as locks:
        holder = await locks.lock("held").acquire()
        await asyncio.to_thread(fresh_server.pause)
        try:
            started = loop.time()

            async def acquire(i: int) -> tuple[BaseException | None, float]:
                try:
                    lease = await locks.lock(f"n{i}").acquire(timeout=1)
                except (aiodlock.BackendError, aiodlock.LockTimeoutError) as exc:
                    return exc, loop.time() - started
                await lease.release()
                return None, loop.time() - started

            outcomes = await asyncio.gather(*(acquire(i) for i in range(8)))
            started = loop.time()
            with pytest.raises(aiodlock.BackendError) as info:
                await locks.lock("tried").try_acquire()
            tried = loop.time() - started
        finally:
            await asyncio.to_thread(fresh_server.resume)
        await holder.release()
    for exc, took in outcomes:
        assert exc is not None  # nothing answered: nothing granted
        assert not _is_driver_error(exc)
        assert took < 1 + request_timeout + LOADED_SLACK, outcomes
    assert not _is_driver_error(info.value)
    assert info.value.__cause__ is not None  # what the driver or the timer said, chained
    assert tried < request_timeout + LOADED_SLACK


# ---------------------------------------------------------------------- loss told at once


async def _told_after(
    holder: aiodlock.LockClient, name: str, breaker: Callable[[], Awaitable[object]], hold: float
) -> float:
    """Hold ``name``, ``hold`` seconds later call ``breaker``; seconds from the call to
    the body's LockLostError."""
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()
    told: list[float] = []

    async def body() -> None:
        try:
            async with holder.lock(name, ttl=30):
                entered.set()
                await asyncio.sleep(60)
        except aiodlock.LockLostError:
            told.append(loop.time())

    task = asyncio.create_task(body())
    await entered.wait()
    if hold:
        await asyncio.sleep(hold)
    started = loop.time()
    await breaker()
    await asyncio.wait_for(task, 20)
    assert told, "the body was not told"
    return told[0] - started


@pytest.mark.parametrize("hold", [0.0, 0.2], ids=["at-grant", "held"])
async def test_a_break_cancels_the_holder_within_100_ms(
    zookeeper_server: ZooKeeperServer, namespace: str, hold: float
) -> None:
    """break_lock from another client: the holder's watch on its own node fires (not its
    next renewal, 10 s away with ttl=30). ``at-grant``: broken before the watch is armed,
    the arming finds the node gone."""
    async with (
        aiodlock.connect(zookeeper_server.url, namespace=namespace) as holder,
        aiodlock.connect(zookeeper_server.url, namespace=namespace) as operator,
    ):
        latencies = []
        for i in range(TRIALS):
            name = f"b{i}"

            async def breaker(name: str = name) -> None:
                assert await operator.break_lock(name) == 1

            latencies.append(await _told_after(holder, name, breaker, hold))
        requests = backend_of(holder).statistics()["requests"]
    print(f"break -> LockLostError ({hold=}): max {max(latencies) * 1000:.1f} ms")
    told_at_once(latencies, TOLD_WITHIN + LOADED_SLACK)
    if hold == 0.0:
        assert requests.get("get", 0) >= 1  # arming the watch found the node gone


async def test_a_node_deleted_by_another_client_cancels_the_holder_at_once(
    zookeeper_server: ZooKeeperServer, namespace: str
) -> None:
    """Not through aiodlock: a plain ZooKeeper client deletes the holder's node."""
    probe = await ZooKeeperProbe(f"{LOOPBACK}:{zookeeper_server.port}", "").start()
    try:
        async with aiodlock.connect(zookeeper_server.url, namespace=namespace) as holder:

            async def delete() -> None:
                await probe.break_lock(holder, namespace, "deleted")

            took = await _told_after(holder, "deleted", delete, 0.2)
    finally:
        await probe.aclose()
    assert took < TOLD_WITHIN + LOADED_SLACK


async def test_the_cli_break_cancels_the_holder_at_once(
    zookeeper_server: ZooKeeperServer, namespace: str
) -> None:
    """``aiodlock break URL NAME --yes`` in another process: told well before the 10 s
    renewal, within 100 ms of the command's delete (its process start is not counted:
    the body must be told before the command exits)."""
    loop = asyncio.get_running_loop()
    args = [sys.executable, "-m", "aiodlock", "break", zookeeper_server.url, "cli"]
    args += ["--namespace", namespace, "--yes"]
    async with aiodlock.connect(zookeeper_server.url, namespace=namespace) as holder:
        ended: list[float] = []

        async def run_cli() -> None:
            result = await asyncio.to_thread(
                subprocess.run, args, capture_output=True, text=True, timeout=60, check=False
            )
            ended.append(loop.time())
            assert result.returncode == 0, result.stdout + result.stderr

        started = loop.time()
        took = await _told_after(holder, "cli", run_cli, 0.2)
    told = started + 0.2 + took
    assert told < ended[0] + TOLD_WITHIN + LOADED_SLACK


# ---------------------------------------------------------------------- a hung member


def _address(member: ZooKeeperServer) -> str:
    return f"{member.host}:{member.port}"


def _serving_leader(ensemble: ZooKeeperEnsemble) -> ZooKeeperServer:
    """The leader, once the ensemble serves (a hung leader stops the whole ensemble until
    the others elect a new one: the hung-member tests stop a follower)."""
    ensemble.wait_serving()
    return ensemble.leader()


async def test_a_new_client_connects_past_a_hung_member(
    zookeeper_ensemble: ZooKeeperEnsemble, namespace: str
) -> None:
    """One member SIGSTOPped (TCP accepted, nothing answered): a new client given all three
    endpoints connects within one connect_timeout, whichever it tries first (each endpoint
    has a share of it), and locks."""
    loop = asyncio.get_running_loop()
    leader = await asyncio.to_thread(_serving_leader, zookeeper_ensemble)
    victim = next(m for m in zookeeper_ensemble.members if m is not leader)
    connect_timeout = 3.0
    url = f"{zookeeper_ensemble.url}/gray?connect_timeout={connect_timeout:g}"
    times = []
    await asyncio.to_thread(victim.pause)
    try:
        for _ in range(6):  # the first endpoint tried is random: the victim, now and then
            started = loop.time()
            async with aiodlock.connect(url, namespace=namespace) as locks:
                times.append(loop.time() - started)
                assert backend_of(locks).statistics()["server"] != _address(victim)
                lease = await locks.lock("through").acquire(timeout=5)
                await lease.release()
    finally:
        await asyncio.to_thread(victim.resume)
        await asyncio.to_thread(zookeeper_ensemble.wait_serving)
    print(f"connect with a hung member: {[round(t, 2) for t in times]} s")
    assert max(times) < connect_timeout


async def test_a_new_client_waits_for_slow_members_beyond_their_share(
    zookeeper_ensemble: ZooKeeperEnsemble, namespace: str
) -> None:
    """Every member 1.2 s away each way (a crawling network): a member's connect takes about
    2.4 s, more than its share of connect_timeout (6 s / 3 members = 2 s). The next member is
    tried beside a slow one, not instead of it, so the first to answer wins and the client
    connects within connect_timeout. (Cut at its share, every member was given up in turn
    and the client never connected: "could not connect ... within 6 s".)"""
    from tests.faults import Relay

    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        relays = [
            await stack.enter_async_context(Relay(m.host, m.port))
            for m in zookeeper_ensemble.members
        ]
        for relay in relays:
            relay.latency(1.2)
        hosts = ",".join(f"{relay.host}:{relay.port}" for relay in relays)
        started = loop.time()
        async with aiodlock.connect(
            f"zookeeper://{hosts}/gray?connect_timeout=6", namespace=namespace
        ) as locks:
            assert loop.time() - started < 6
            assert backend_of(locks).statistics()["server"] in {
                f"{relay.host}:{relay.port}" for relay in relays
            }


async def test_a_session_on_a_hung_member_moves_to_another_and_keeps_locking(
    zookeeper_ensemble: ZooKeeperEnsemble, namespace: str
) -> None:
    """The member a client is connected to is SIGSTOPped: the client gives the connection
    up after 2/3 of its session timeout of silence, reconnects to another member first
    (the one it left is tried last) within the session, and locks again."""
    loop = asyncio.get_running_loop()
    session_timeout = 4.0
    url = f"{zookeeper_ensemble.url}/gray?session_timeout={session_timeout:g}"
    async with contextlib.AsyncExitStack() as stack:
        # A client on a follower (see _serving_leader). The member a client connects to is
        # random: a few clients, until one is on a follower.
        leader = _address(await asyncio.to_thread(_serving_leader, zookeeper_ensemble))
        for _ in range(20):
            locks = await stack.enter_async_context(aiodlock.connect(url, namespace=namespace))
            if backend_of(locks).statistics()["server"] != leader:
                break
        victim = next(
            m
            for m in zookeeper_ensemble.members
            if _address(m) == backend_of(locks).statistics()["server"]
        )
        assert _address(victim) != leader
        session = backend_of(locks).statistics()["session_id"]
        await asyncio.to_thread(victim.pause)
        try:
            started = loop.time()
            lease = await locks.lock("moved").acquire(timeout=session_timeout * 2)
            took = loop.time() - started
            await lease.release()
            stats = backend_of(locks).statistics()
        finally:
            await asyncio.to_thread(victim.resume)
            await asyncio.to_thread(zookeeper_ensemble.wait_serving)
    print(f"session moved off a hung member, locked after {took:.2f} s")
    assert stats["server"] != _address(victim)
    assert stats["session_id"] == session  # moved within the session
    assert took < session_timeout


async def test_max_hold_ends_a_lease_whose_session_is_as_short_as_its_ttl(
    zookeeper_server: ZooKeeperServer, namespace: str
) -> None:
    """The watchdog wakes at the session's deadline, which a keep-alive keeps moving; past
    ``max_hold`` it must not renew there (it once did, so the lease was never lost)."""
    url = f"{zookeeper_server.url}?session_ttl=2"
    async with aiodlock.connect(url, namespace=namespace, max_hold=0.05) as locks:
        lease = await locks.lock("capped", ttl=2).acquire(timeout=5)
        try:
            async with asyncio.timeout(2 + 2):  # the ttl-based deadline, and slack
                await lease.lost.wait()
        finally:
            if lease.held:
                await lease.release()


# ---------------------------------------------------------------------- ttl means the same

CRASH_SLACK: Final = 1.0
"""Issue 33 item 4: a SIGKILLed holder is replaced within ttl + 1 s (measured: ~3.0-3.1 s
with ttl=3 on the test server, whose 200 ms tick lets it grant a 3 s session)."""


async def test_a_sigkilled_holder_with_ttl_3_is_replaced_within_ttl_plus_1_s(
    zookeeper_server: ZooKeeperServer, namespace: str
) -> None:
    """A holder process SIGKILLed with ``ttl=3`` on a client whose ``session_ttl`` is the
    default 10 s: its lock was kept on a 3 s session of its own, so the waiter is granted
    about 3 s after the kill (before: 10 s, the session timeout governed, not the ttl)."""
    ttl = 3
    url = zookeeper_server.url
    async with (
        holder_process(url, namespace, "crash", ttl) as holder,
        aiodlock.connect(url, namespace=namespace) as locks,
    ):
        first = holder.token
        assert await locks.lock("crash", ttl=ttl).try_acquire() is None  # it holds
        killed_at = holder.kill()
        lease = await locks.lock("crash", ttl=ttl).acquire(timeout=15)
        replaced = asyncio.get_running_loop().time() - killed_at
        short = backend_of(locks).statistics()["short_sessions"]
        await lease.release()
    print(f"ttl={ttl}: SIGKILLed holder replaced after {replaced:.3f} s")
    assert lease.fencing_token > first
    assert list(short) == [3.0]  # the waiter's lock went on a 3 s session too
    # The server expires sessions in ticks (200 ms here): never before the session timeout
    # less a tick, since the holder's last ping.
    assert ttl - 0.5 <= replaced <= ttl + CRASH_SLACK


async def test_each_short_ttl_has_one_session_of_its_own(
    zookeeper_server: ZooKeeperServer, namespace: str
) -> None:
    """Locks of ttl 3, 3.5, 2.9, 30 and 10 (``session_ttl=10``): sessions of 3 and 2 s open
    at their first use, shared by every lock of the same step; 30 and 10 use the main one.
    The counters are summed over the sessions, the nodes are on the session of their ttl."""
    probe = await ZooKeeperProbe(f"{LOOPBACK}:{zookeeper_server.port}", "").start()

    async def owner_of(name: str) -> str:
        [path] = await probe.lock_nodes(namespace, name)
        stat = await probe.stat(path)
        assert stat is not None, path
        return f"{stat.ephemeral_owner:#x}"

    try:
        async with aiodlock.connect(zookeeper_server.url, namespace=namespace) as locks:
            backend = backend_of(locks)
            main = backend.statistics()["session_id"]
            assert backend.statistics()["short_sessions"] == {}
            owners = {}
            for name, ttl in (("a", 3.0), ("b", 3.5), ("c", 2.9), ("d", 30.0), ("e", 10.0)):
                async with locks.lock(name, ttl=ttl):
                    owners[name] = await owner_of(name)
            stats = backend.statistics()
        after = backend.statistics()
    finally:
        await probe.aclose()
    short = stats["short_sessions"]
    assert list(short) == [2.0, 3.0]
    assert owners == {
        "a": short[3.0], "b": short[3.0], "c": short[2.0], "d": main, "e": main,
    }  # fmt: skip
    assert stats["sessions"] == 3  # established: the main one and two shorter ones
    assert stats["requests"]["create"] >= 5
    assert after["short_sessions"] == {}  # closed with the client


def test_a_ttl_picks_the_session_it_is_kept_on() -> None:
    """The largest step not above the ttl (1 s at least); the main session at or above
    ``session_ttl``."""
    from aiodlock.backends.zookeeper import session_timeout_for  # the driver: not at collection

    assert session_timeout_for(30, 10) is None
    assert session_timeout_for(10, 10) is None
    assert session_timeout_for(3, 10) == 3.0
    assert session_timeout_for(3.7, 10) == 3.0
    assert session_timeout_for(0.2, 10) == 1.0
    assert session_timeout_for(9, 8.5) is None
    assert session_timeout_for(8.2, 8.5) == 8.0
