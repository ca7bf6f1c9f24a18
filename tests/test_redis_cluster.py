"""Redis Cluster under faults (issue 8): a master killed or handed over (``CLUSTER FAILOVER``)
while clients take a lock in a loop, a held lock's slot moved to another master while waiters
wait, the connections 500 waiters cost, and no ``CROSSSLOT`` for any lock kind.

Each fault test gets its own cluster (three masters with a replica each, tests/
support_redis_cluster.py). What must hold across a failover: fencing tokens keep increasing
in the order the holders began (replication is asynchronous: a grant the dead master had not
passed on can be given again, and only the token orders the two holders); waiters go on once
the replica has taken over; a holder whose key the failover lost is told (``LockLostError``).
Across a slot move: waiters are still woken (through the new master), and the lock stays
exclusive.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

import aiodlock
from aiodlock.testing import History, Hold
from tests.helpers import FailoverLoad, wait_until

if TYPE_CHECKING:
    from tests.support_redis_cluster import ClusterDeployment, ClusterNodeServer

pytestmark = pytest.mark.redis

WAKEUPS = pytest.mark.parametrize("wakeup", ["pubsub", "blpop"])


@pytest.fixture
def cluster() -> Iterator[ClusterDeployment]:
    from tests.support_redis_cluster import ClusterDeployment  # imports the driver

    with ClusterDeployment() as made:
        yield made


@WAKEUPS
async def test_killed_master_under_load(cluster: ClusterDeployment, wakeup: str) -> None:
    load = FailoverLoad(f"{cluster.url}?wakeup={wakeup}")
    master = cluster.master_of(b"{fo:job}")
    replica = cluster.replica_of(master)

    def kill_the_master() -> None:
        master.kill()
        cluster.wait_master(replica)  # the replica takes over the slots

    after = await load.run_through(kill_the_master)
    assert cluster.master_of(b"{fo:job}") is replica
    load.check_fencing_order()
    assert after >= 20


@WAKEUPS
async def test_cluster_failover_under_load(cluster: ClusterDeployment, wakeup: str) -> None:
    load = FailoverLoad(f"{cluster.url}?wakeup={wakeup}")
    master = cluster.master_of(b"{fo:job}")
    new: list[ClusterNodeServer] = []
    after = await load.run_through(lambda: new.append(cluster.failover(master)))
    assert cluster.master_of(b"{fo:job}") is new[0] is not master
    load.check_fencing_order()
    assert after >= 20


async def test_a_lock_lost_in_a_failover_is_reported_and_tokens_still_grow(
    cluster: ClusterDeployment,
) -> None:
    """The replica is paused and cut off while the lock is taken, so the key (and the fencing
    counter) reach the master only; the master dies and the replica takes over without them.
    The holder's next renewal finds no key: its body is cancelled with LockLostError (never a
    resurrected lease), and the next holder's token is still larger."""
    import redis

    master = cluster.master_of(b"{lost:job}")
    replica = cluster.replica_of(master)
    async with (
        aiodlock.connect(cluster.url, namespace="lost") as holder,
        aiodlock.connect(cluster.url, namespace="lost") as other,
    ):
        replica.pause()
        try:
            # Cut the replication link too: what the master wrote to it would still be in the
            # paused replica's socket buffer, and arrive on resume.
            redis.Redis(master.host, master.port).client_kill_filter(_type="replica")
            entered = asyncio.Event()
            tokens: list[int] = []

            async def hold() -> None:
                async with holder.lock("job", ttl=6) as lease:
                    tokens.append(lease.fencing_token)
                    entered.set()
                    await asyncio.Event().wait()  # until the loss cancels it

            held = asyncio.create_task(hold())
            await asyncio.wait_for(entered.wait(), 10)
            master.kill()
        finally:
            replica.resume()
        await asyncio.to_thread(cluster.wait_master, replica)
        assert redis.Redis(replica.host, replica.port).keys("*lost*") == []  # really lost
        with pytest.raises(aiodlock.LockLostError):
            await asyncio.wait_for(held, 15)
        # A command sent on a connection to the dead master fails once (BackendError); the
        # client reads the slot map again before the next, which reaches the new master.
        for _ in range(3):
            with contextlib.suppress(aiodlock.BackendError):
                lease = await other.lock("job").acquire(timeout=10)
                break
        else:
            pytest.fail("no grant from the new master")
        assert lease.fencing_token > tokens[0]
        await lease.release()


@WAKEUPS
async def test_moving_a_held_locks_slot_still_wakes_its_waiters(
    cluster: ClusterDeployment, wakeup: str
) -> None:
    """The lock is held (for far longer than the waiters wait) while its slot is moved to
    another master, keys and all (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE); then released.
    Every waiter must still get the lock, one at a time, within its timeout: woken through
    the new master, not by the lease running out."""
    import redis

    url = f"{cluster.url}?wakeup={wakeup}"
    key = b"{mv:job}"
    slot = cluster.slot_of(key)
    source = cluster.master_of(key)
    target = next(m for m in cluster.masters() if m is not source)
    waiters = 6
    holds: list[Hold] = []
    async with (
        aiodlock.connect(url, namespace="mv") as holder,
        aiodlock.connect(url, namespace="mv") as others,
    ):
        lease = await holder.lock("job", ttl=120).acquire()
        holds_started = asyncio.Event()

        async def wait_for_it(i: int) -> None:
            async with others.lock("job", ttl=10, timeout=30) as got:
                holds_started.set()
                start = time.monotonic()
                await asyncio.sleep(0.01)
                holds.append(Hold(f"w{i}", got.fencing_token, start, time.monotonic()))

        tasks = [asyncio.create_task(wait_for_it(i)) for i in range(waiters)]
        # Waiters of one client on one lock share one wakeup: the first arms it for all.
        await wait_until(lambda: others.statistics().backend["waiters"] == 1)
        await asyncio.to_thread(cluster.move_slot, slot, target)
        assert cluster.master_of(key) is target
        moved = redis.Redis(target.host, target.port)
        assert moved.get(key) == lease.owner.encode()  # the holder's key moved with the slot
        assert 0 < moved.pttl(key) <= 120_000
        assert not holds_started.is_set()  # still exclusive
        if wakeup == "pubsub":
            # The old master dropped the channel with the slot; the waiter subscribed again
            # on the new one (a second master's connection), where the release publishes.
            def moved_over() -> bool:
                stats = others.statistics().backend
                return bool(stats["pubsub_masters"] == 2 and stats["subscribed_channels"] == 1)

            await wait_until(moved_over)
        await lease.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    History(holds).check(max_holders=1)
    assert len(holds) == waiters
    assert all(h.token > lease.fencing_token for h in holds)


async def test_500_waiters_cost_a_handful_of_connections(cluster: ClusterDeployment) -> None:
    """500 waiters of one client on 500 locks spread over the three masters (each its own
    channel: waiters of one lock in one client would share a wakeup): one sharded pub/sub
    connection per master, and a few command connections, on every master -- counted by the
    masters themselves (CLIENT LIST), 22 at most in all for the two clients."""
    import redis

    names = [f"lock{i}" for i in range(500)]
    masters = {cluster.master_of(f"{{many:{n}}}".encode()).port for n in names}
    assert len(masters) == 3  # the locks are spread over every master
    async with (
        aiodlock.connect(cluster.url, namespace="many") as holder,
        aiodlock.connect(cluster.url, namespace="many") as waiting,
    ):
        leases = [await holder.lock(n, ttl=120).acquire() for n in names]

        async def wait(name: str) -> int:
            async with waiting.lock(name, ttl=10, timeout=60) as got:
                return got.fencing_token

        tasks = [asyncio.create_task(wait(n)) for n in names]

        def subscribed() -> bool:  # a waiter counts before the server confirms its channel
            stats = waiting.statistics().backend
            return bool(stats["waiters"] == 500 and stats["subscribed_channels"] == 500)

        await wait_until(subscribed, timeout=60)
        assert waiting.statistics().backend["pubsub_connections"] == 3
        per_master = []
        for master in cluster.masters():
            clients = redis.Redis(master.host, master.port).client_list()
            per_master.append(
                (
                    sum(c["name"] == "aiodlock:pubsub" for c in clients),
                    sum(c["name"].startswith("aiodlock") for c in clients),
                )
            )
        # Per master: one pub/sub connection, and for each of the two clients at most
        # max_connections (2) command connections plus the one it reads the slot map on.
        assert [pubsub for pubsub, _ in per_master] == [1, 1, 1]
        assert all(total <= 1 + 2 * (2 + 1) for _, total in per_master), per_master
        for lease in leases:
            await lease.release()
        tokens = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    # Every waiter got its lock, fenced after the holder's grant. (Tokens are ordered per
    # name only: two names' counters, seeded from the clock, may meet.)
    assert len(tokens) == 500
    assert all(got > lease.fencing_token for got, lease in zip(tokens, leases, strict=True))


@WAKEUPS
async def test_no_crossslot_for_any_kind(redis_cluster: ClusterDeployment, wakeup: str) -> None:
    """Every kind, contended (so waiting, queueing and notifying run too), works on names that
    play with the hash-tag braces -- a CROSSSLOT would fail the step with BackendError -- and
    while a waiter waits, every key of the name is in the slot of its hash tag."""
    from redis.asyncio.cluster import RedisCluster

    names = ["plain", "a}b{c", "{x}", "}{", "{", "}", "é{ü}"]
    url = f"{redis_cluster.url}?wakeup={wakeup}"
    raw = RedisCluster.from_url(redis_cluster.seed_url())
    async with (
        aiodlock.connect(url, namespace="cs") as a,
        aiodlock.connect(url, namespace="cs") as b,
    ):
        for name in names:
            tag = f"{{cs:{name}}}".encode()
            makers: list[Any] = [
                lambda c, n=name: c.lock(n, ttl=5),
                lambda c, n=name: c.lock(n, ttl=5, fair=True),
                lambda c, n=name: c.write_lock(n, ttl=5),
                lambda c, n=name: c.semaphore(n, limit=1, ttl=5),
            ]
            for make in makers:
                first = await make(a).acquire(timeout=5)
                second = asyncio.create_task(make(b).acquire(timeout=10))
                await wait_until(lambda: b.statistics().backend["waiters"] >= 1)
                keys = [k async for k in raw.scan_iter(match=b"*" + _glob(tag) + b"*")]
                assert tag in keys or len(keys) >= 2, keys  # the lock's own keys are there
                assert {raw.keyslot(k) for k in keys} == {raw.keyslot(tag)}, keys
                await first.release()
                lease = await second
                await lease.release()
            async with a.read_lock(name, ttl=5), b.read_lock(name, ttl=5):
                pass
    await raw.aclose()


def _glob(text: bytes) -> bytes:
    """Escape glob metacharacters for SCAN MATCH."""
    return b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in text)


async def test_cluster_urls_are_checked_and_never_show_the_password() -> None:
    """Seed nodes are required, there is no database to choose, ``wait_replicas`` is not
    offered; the password shows neither in ``repr()`` nor in a connect error."""
    with pytest.raises(ValueError, match="needs seed nodes"):
        aiodlock.connect("redis+cluster://")
    with pytest.raises(ValueError, match="database 0 only"):
        aiodlock.connect("redis+cluster://127.0.0.1:7000/3")
    with pytest.raises(ValueError, match="option db is not supported"):
        aiodlock.connect("redis+cluster://127.0.0.1:7000", db=1)
    with pytest.raises(ValueError, match="redis_client is not supported"):
        aiodlock.connect("redis+cluster://", redis_client=object())
    with pytest.raises(ValueError, match="wait_replicas is not supported"):
        aiodlock.connect("redis+cluster://127.0.0.1:7000?wait_replicas=1")
    from tests.servers import free_port

    url = f"redis+cluster://user:s3cret@127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    client = aiodlock.connect(url, connect_timeout=1)
    assert "s3cret" not in repr(client) and "***" in repr(client)
    with pytest.raises(aiodlock.BackendError) as failed:
        async with client:
            pass
    assert "s3cret" not in str(failed.value) and "user:***@" in str(failed.value)
