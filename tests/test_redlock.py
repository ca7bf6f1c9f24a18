"""Redlock faults (issue 8): masters stopped, flushed or restarted empty under the lock.

Three independent masters (tests/support_redlock.py), healed after every test. What must
hold: with one master of three stopped the lock is still granted (the quorum goes on after
the per-master timeout) and no two holders overlap; with two stopped nothing is granted, and
the caller is told; a master that loses its data never makes a fencing token go backwards
(the quorum write); a renewal refused by a quorum cancels the body with ``LockLostError``;
``drift_factor`` shrinks the lease; an attempt that fails leaves nothing on any master.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import pytest

import aiodlock
from aiodlock.testing import History, settle
from tests.helpers import eventually, wait_until

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from tests.servers import TLSFiles
    from tests.support_redlock import RedlockMasters

pytestmark = pytest.mark.redis

NS = "faults"


@pytest.fixture
def masters(redlock_masters: RedlockMasters) -> Iterator[RedlockMasters]:
    """The session's three masters, every one of them running again after the test."""
    try:
        yield redlock_masters
    finally:
        redlock_masters.heal()


def _raw(masters: RedlockMasters, i: int) -> aioredis.Redis:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(masters.servers[i].url)


async def _keys(masters: RedlockMasters, i: int, pattern: str) -> list[bytes]:
    raw = _raw(masters, i)
    try:
        return [bytes(k) async for k in raw.scan_iter(match=pattern)]
    finally:
        await raw.aclose()


async def _work(
    client: aiodlock.LockClient, name: str, history: History, rounds: int, timeout: float
) -> None:
    for _ in range(rounds):
        async with client.lock("job", ttl=2, timeout=timeout) as lease:
            with history.hold(name, lease.fencing_token):
                await asyncio.sleep(0.002)


async def test_one_master_stopped_still_grants(masters: RedlockMasters) -> None:
    history = History()
    async with (
        aiodlock.connect(masters.url, namespace=NS + "1") as a,
        aiodlock.connect(masters.url, namespace=NS + "1") as b,
    ):
        async with asyncio.TaskGroup() as tg:
            for i, client in enumerate((a, b)):
                tg.create_task(_work(client, f"c{i}", history, 5, timeout=5))
        masters.servers[2].pause()
        # Each acquire waits for the stopped master only for the per-master timeout (10 % of
        # the 2 s ttl), far within the 1.5 s allowed here.
        async with asyncio.TaskGroup() as tg:
            for i, client in enumerate((a, b)):
                tg.create_task(_work(client, f"c{i}", history, 10, timeout=1.5))
        masters.servers[2].resume()
        await settle(a)
        await settle(b)
    assert len(history.holds) == 30
    history.check(max_holders=1)
    tokens = [h.token for h in sorted(history.holds, key=lambda h: h.start)]
    assert tokens == sorted(set(tokens))


async def test_two_masters_stopped_grant_nothing(masters: RedlockMasters) -> None:
    async with aiodlock.connect(masters.url, namespace=NS + "2") as locks:
        async with locks.lock("job", ttl=2):
            pass
        masters.servers[1].pause()
        masters.servers[2].pause()
        started = time.monotonic()
        with pytest.raises((aiodlock.LockTimeoutError, aiodlock.BackendError)):
            await locks.lock("job", ttl=2).acquire(timeout=1.0)
        assert await locks.lock("job", ttl=2).try_acquire() is None
        assert time.monotonic() - started < 5  # told, not hung on the silent masters
        masters.servers[1].resume()
        masters.servers[2].resume()
        async with locks.lock("job", ttl=2, timeout=10) as lease:
            assert lease.fencing_token > 0
        await settle(locks)


@pytest.mark.parametrize("fault", ["flushall", "restart"])
async def test_master_losing_its_data_keeps_tokens_increasing(
    masters: RedlockMasters, fault: str
) -> None:
    """Master 0's counter has run far ahead of the clocks (as after many grants). With master
    2 stopped, the quorum is masters 0 and 1: the grant's token is above master 0's counter,
    and the write phase puts it on master 1 too. Then master 0 loses everything: the next
    grants (again on masters 0 and 1) must still go above it -- master 1 knows it. Without
    the write, master 1 would only have its clock, far below."""
    ns = NS + "3" + fault
    ahead = time.time_ns() // 1000 + 10**12  # µs, far above every master's clock
    raw = _raw(masters, 0)
    try:
        await raw.set(f"{{{ns}:job}}:fence", ahead)
    finally:
        await raw.aclose()
    async with aiodlock.connect(masters.url, namespace=ns) as locks:
        masters.servers[2].pause()
        async with locks.lock("job", ttl=2, timeout=10) as lease:
            first = lease.fencing_token
        assert first > ahead
        if fault == "flushall":
            raw = _raw(masters, 0)
            try:
                await raw.flushall()
            finally:
                await raw.aclose()
        else:
            await asyncio.to_thread(masters.servers[0].restart)  # comes back empty
        tokens = [first]
        for _ in range(3):
            async with locks.lock("job", ttl=2, timeout=10) as lease:
                tokens.append(lease.fencing_token)
        masters.servers[2].resume()
        for _ in range(3):
            async with locks.lock("job", ttl=2, timeout=10) as lease:
                tokens.append(lease.fencing_token)
        assert tokens == sorted(set(tokens))
        await settle(locks)


async def test_renewal_refused_by_a_quorum_cancels_the_body(masters: RedlockMasters) -> None:
    ns = NS + "4"
    reached = asyncio.Event()
    cancelled = False
    async with aiodlock.connect(masters.url, namespace=ns) as locks:
        with pytest.raises(aiodlock.LockLostError):
            async with locks.lock("job", ttl=0.6):
                for i in (0, 1):  # the lease is gone from a quorum (expired, flushed...)
                    raw = _raw(masters, i)
                    try:
                        assert await raw.delete(f"{{{ns}:job}}") == 1
                    finally:
                        await raw.aclose()
                reached.set()
                try:
                    await asyncio.sleep(5)  # the next renewal (at ttl/3) is refused
                except asyncio.CancelledError:
                    cancelled = True
                    raise
        assert reached.is_set() and cancelled
        await settle(locks)
    assert await _keys(masters, 2, f"{{{ns}:job}}") == []  # released where it was left


async def test_renewals_unanswered_by_a_quorum_lose_the_lease(masters: RedlockMasters) -> None:
    async with aiodlock.connect(masters.url, namespace=NS + "5") as locks:
        with pytest.raises(aiodlock.LockLostError):
            async with locks.lock("job", ttl=0.6) as lease:
                masters.servers[0].pause()
                masters.servers[1].pause()
                await asyncio.sleep(5)
        assert lease.lost.is_set()


async def test_drift_factor_shrinks_the_validity(masters: RedlockMasters) -> None:
    loop = asyncio.get_running_loop()
    # A keyword option wins over the query parameter.
    url = masters.url + "?drift_factor=0.5"
    async with (
        aiodlock.connect(url, namespace=NS + "6") as wide,
        aiodlock.connect(url, namespace=NS + "6", drift_factor=0.01) as narrow,
    ):
        async with wide.lock("a", ttl=4) as lease:
            assert lease.valid_until - loop.time() <= 4 * (1 - 0.5)
        async with narrow.lock("b", ttl=4) as lease:
            assert lease.valid_until - loop.time() > 4 * (1 - 0.5)
        await settle(wide)
        await settle(narrow)


@pytest.mark.parametrize("count", [1, 2, 4, 6])
def test_masters_count_must_be_odd_and_at_least_three(count: int) -> None:
    hosts = ",".join(f"127.0.0.1:{7000 + i}" for i in range(count))
    with pytest.raises(ValueError, match=f"names {count}"):
        aiodlock.connect(f"redlock://:s3cret@{hosts}/0")


async def test_password_never_shown(masters: RedlockMasters) -> None:
    hosts = masters.url.removeprefix("redlock://")
    with pytest.raises(aiodlock.BackendError) as caught:
        async with aiodlock.connect(f"redlock://:s3cret@{hosts}", connect_timeout=2):
            pass  # the masters have no password: AUTH fails
    assert "s3cret" not in str(caught.value)
    locks = aiodlock.connect(f"redlock://:s3cret@{hosts}")
    assert "s3cret" not in repr(locks)


async def test_failed_attempt_leaves_nothing_on_any_master(masters: RedlockMasters) -> None:
    """A holds the lock on masters 0 and 1 only; B's attempt is refused there and granted on
    master 2, which is stopped while B asks and answers after B gave up: B's release, sent
    there once that attempt has landed, removes it."""
    ns = NS + "7"
    async with (
        aiodlock.connect(masters.url, namespace=ns) as a,
        aiodlock.connect(masters.url, namespace=ns, socket_timeout=5) as b,
    ):
        async with a.lock("job", ttl=5) as lease:
            raw = _raw(masters, 2)
            try:
                assert await raw.delete(f"{{{ns}:job}}") == 1
            finally:
                await raw.aclose()
            masters.servers[2].pause()
            assert await b.lock("job", ttl=5).try_acquire() is None
            masters.servers[2].resume()
            await settle(b)
            assert await _keys(masters, 2, f"{{{ns}:job}}") == []
            lease.assert_held()
        await settle(a)
    for i in range(3):
        assert await _keys(masters, i, f"{{{ns}:job}}") == []


async def test_inspect_and_break(masters: RedlockMasters) -> None:
    from aiodlock.backends import Breaker, Inspector, Kind, LockSpec

    ns = NS + "8"
    async with aiodlock.connect(masters.url, namespace=ns) as locks:
        backend = locks.backend
        assert isinstance(backend, Inspector) and isinstance(backend, Breaker)
        with pytest.raises(aiodlock.LockLostError):
            async with locks.lock("job", ttl=0.9) as lease:
                found = await backend.inspect(ns)
                assert [(i.name, i.kind, len(i.holders)) for i in found] == [("job", Kind.MUTEX, 1)]
                assert found[0].fencing_token is not None
                assert found[0].fencing_token >= lease.fencing_token
                assert await backend.break_lock(LockSpec(ns, "job", Kind.MUTEX)) == 1
                await asyncio.sleep(5)  # the next renewal is refused
        assert await backend.inspect(ns) == []
        async with locks.lock("job", ttl=2) as after:
            assert after.fencing_token > lease.fencing_token
        await settle(locks)


async def test_identity_and_namespaces_with_a_master_stopped(masters: RedlockMasters) -> None:
    """With one master of three stopped, ``namespaces()`` (the union over the masters that
    answer) still names the namespace in use, and ``inspect`` each reader's identity, as the
    masters stored it with the grant."""
    ns = NS + "9"
    async with (
        aiodlock.connect(masters.url, namespace=ns, identity="worker 1/é") as one,
        aiodlock.connect(masters.url, namespace=ns, identity="worker 2") as two,
    ):
        async with one.read_lock("job", ttl=10) as first, two.read_lock("job", ttl=10) as second:
            masters.servers[0].pause()
            try:
                assert ns in await one.namespaces()
                (info,) = await one.inspect("job")
            finally:
                masters.servers[0].resume()
            assert sorted((h.owner, h.identity) for h in info.holders) == sorted(
                [(first.owner, "worker 1/é"), (second.owner, "worker 2")]
            )
        await settle(one)
        await settle(two)
    for i in range(3):  # the identities went with their holders; only the counter stays
        assert await _keys(masters, i, f"{{{ns}:job}}*") == [f"{{{ns}:job}}:fence".encode()]


async def test_a_break_over_slow_links_carries_the_token_to_a_quorum(
    masters: RedlockMasters,
) -> None:
    """Master 0's counter is ahead, so a break must write the new token to the others. Over
    links 150 ms slow each way that write takes 300 ms: within the masters' request timeout,
    the break's budget. (It once had a grant's ``node_timeout`` -- 0.1 of the 2 s request
    timeout taken for a ttl, 200 ms -- and a loaded CI machine failed a break whose deletes had
    landed with "the token write failed".)"""
    from tests.faults import Relay

    ns = NS + "9"
    async with contextlib.AsyncExitStack() as stack:
        relays = [await stack.enter_async_context(Relay(s.host, s.port)) for s in masters.servers]
        url = "redlock://" + ",".join(f"{r.host}:{r.port}" for r in relays) + "/0"
        locks = await stack.enter_async_context(aiodlock.connect(url, namespace=ns))
        lease = await locks.lock("job", ttl=30).acquire()
        raw = _raw(masters, 0)  # after the grant, whose own write would carry it to a quorum
        try:
            await raw.set(f"{{{ns}:job}}:fence", time.time_ns() // 1000 + 10**12)
        finally:
            await raw.aclose()
        for relay in relays:
            relay.latency(0.15)
        assert await locks.break_lock("job") == 1
        for relay in relays:
            await relay.heal()
        await asyncio.wait_for(lease.lost.wait(), 10)  # told by the broken channel
        async with locks.lock("job", ttl=2, timeout=10) as after:
            assert after.fencing_token > lease.fencing_token
        await settle(locks)


async def test_giving_back_a_late_attempt_never_deletes_the_next_grant(
    masters: RedlockMasters,
) -> None:
    """An attempt that master 2 (stopped) answers late is given back there once its reply is
    in; the owner's next attempt on master 2 is sent only after that release, so the release
    cannot delete what the next attempt grants."""
    from aiodlock.backends import Busy, Grant, Kind, LockSpec

    ns = NS + "9"
    spec = LockSpec(ns, "job", Kind.MUTEX)
    owner = "ab" * 12
    async with (
        aiodlock.connect(masters.url, namespace=ns) as a,
        aiodlock.connect(masters.url, namespace=ns, socket_timeout=5) as b,
    ):
        held = await a.lock("job", ttl=5).acquire()
        raw = _raw(masters, 2)
        try:
            assert await raw.delete(f"{{{ns}:job}}") == 1  # A holds masters 0 and 1 only
            masters.servers[2].pause()
            assert isinstance(await b.backend.try_acquire(spec, owner, 5.0), Busy)
            await held.release()
            granted = await b.backend.try_acquire(spec, owner, 5.0)  # masters 0 and 1
            assert isinstance(granted, Grant)
            masters.servers[2].resume()
            await settle(b)
            # Master 2 granted the first attempt late, that grant was given back, and then
            # the second attempt was granted there too: the lease is on all three.
            for i in range(3):
                key = _raw(masters, i)
                try:
                    assert await key.get(f"{{{ns}:job}}") == owner.encode(), f"master {i}"
                finally:
                    await key.aclose()
            assert await b.backend.release(spec, owner)
            await settle(b)
        finally:
            await raw.aclose()
        await settle(a)
    for i in range(3):
        assert await _keys(masters, i, f"{{{ns}:job}}") == []


@pytest.mark.parametrize("query", ["ssl=true&ssl_ca_certs={ca}", "tls=true&tls_ca={ca}"])
async def test_tls_to_every_master(tls_files: TLSFiles, query: str) -> None:
    """``?ssl=true`` with the ``ssl_*`` options of ``rediss://`` (or their shared names
    ``tls``, ``tls_ca``): three TLS-only masters; a waiter is woken by the release (pub/sub
    over TLS too)."""
    from tests.servers import RedisTLSServer

    servers = [RedisTLSServer(tls_files, auth_clients="optional") for _ in range(3)]
    try:
        for server in servers:
            server.start()
        hosts = ",".join(f"{s.host}:{s.port}" for s in servers)
        url = f"redlock://{hosts}/0?{query.format(ca=tls_files.ca)}"
        async with (
            aiodlock.connect(url, namespace="tls") as a,
            aiodlock.connect(url, namespace="tls") as b,
        ):
            first = await a.lock("k", ttl=30).acquire()
            lock = b.lock("k", ttl=30)
            waiting = asyncio.ensure_future(lock.acquire(timeout=10))
            await wait_until(lambda: lock.statistics().waiting == 1)  # refused: release wakes it
            assert not waiting.done()
            await first.release()
            second = await waiting  # woken by the release, not by the 30 s expiry
            assert second.fencing_token > first.fencing_token
            await second.release()
        with pytest.raises(aiodlock.BackendError):  # plain TCP to a TLS-only master fails
            async with aiodlock.connect(f"redlock://{hosts}/0", connect_timeout=1):
                pass
    finally:
        for server in servers:
            server.close()


async def test_master_killed_and_restarted_empty_under_load(masters: RedlockMasters) -> None:
    """Two clients, two workers each, take one lock in a loop while master 1 is killed and
    restarted empty. Holders that were told nothing never overlapped; a holder whose lease
    did not survive is told (``LockLostError``); tokens only grow, across the restart too."""
    from aiodlock.testing import Hold

    clean: list[Hold] = []
    lost = 0
    stop = asyncio.Event()

    async def worker(client: aiodlock.LockClient, who: str) -> None:
        nonlocal lost
        while not stop.is_set():
            try:
                async with client.lock("job", ttl=1, timeout=10) as lease:
                    start = time.monotonic()
                    await asyncio.sleep(0.003)
                    end = time.monotonic()
                clean.append(Hold(who, lease.fencing_token, start, end))
            except aiodlock.LockLostError:
                lost += 1

    async def until(count: int) -> None:
        async with asyncio.timeout(30):
            while len(clean) < count:  # noqa: ASYNC110 - progress of other tasks
                await asyncio.sleep(0.01)

    async with (
        aiodlock.connect(masters.url, namespace=NS + "10") as a,
        aiodlock.connect(masters.url, namespace=NS + "10") as b,
    ):
        async with asyncio.TaskGroup() as tg:
            for c, client in enumerate((a, b)):
                for w in range(2):
                    tg.create_task(worker(client, f"c{c}w{w}"))
            await until(20)
            await asyncio.to_thread(masters.servers[1].kill)
            await until(40)
            await asyncio.to_thread(masters.servers[1].start)  # empty: no persistence
            await until(len(clean) + 20)
            stop.set()
        await settle(a)
        await settle(b)
    History(clean).check(max_holders=1)
    ordered = sorted(clean, key=lambda hold: hold.start)
    assert [h.token for h in ordered] == sorted({h.token for h in ordered})


async def test_a_woken_waiter_asks_the_arbiter_master_first(masters: RedlockMasters) -> None:
    """Waiters woken by one release, in several processes, would split the masters' votes if
    each asked all of them at once; so a woken waiter asks the name's arbiter master first
    (the same for a name everywhere) and the others only once it granted. Here the arbiter
    holds another owner's key, as if a waiter elsewhere had won it there, while the two other
    masters are free: the woken waiter is refused and takes the lock only once that key has
    expired. Had it asked every master at once, it would hold the two free ones at once."""
    name, ns = "arbiter", NS + "arbiter"
    tag, arbiter = _arbiter_of(masters, ns, name)
    loop = asyncio.get_running_loop()
    async with (
        aiodlock.connect(masters.url, namespace=ns) as a,
        aiodlock.connect(masters.url, namespace=ns) as b,
    ):
        first = await a.lock(name, ttl=5).acquire()
        waiting = b.lock(name, ttl=5)
        task = asyncio.create_task(waiting.acquire(timeout=10))
        await wait_until(lambda: waiting.statistics().waiting == 1)
        raw = _raw(masters, arbiter)
        try:
            assert await raw.set(tag, "someone-else", xx=True, px=1000)
        finally:
            await raw.aclose()
        released = loop.time()
        await first.release()  # refused by the arbiter (not ours there), done on the others
        second = await task
        try:
            assert loop.time() - released >= 0.8
            assert second.fencing_token > first.fencing_token
        finally:
            await second.release()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ssl": True, "tls": True}, "two names of one option"),
        ({"socket_timeout": 1, "request_timeout": 1}, "two names of one option"),
        ({"tls": "yes"}, "option tls must be a bool"),
        ({"ssl": "yes"}, "option ssl must be a bool"),
    ],
)
def test_redlock_option_names(options: dict[str, Any], message: str) -> None:
    """``tls`` is the shared name of ``ssl``, ``request_timeout`` of ``socket_timeout``."""
    with pytest.raises((ValueError, TypeError), match=message):
        aiodlock.connect("redlock://h1:1,h2:1,h3:1/0", **options)


def test_redlock_request_timeout_reaches_every_master() -> None:
    """Per master, ``request_timeout`` (alias ``socket_timeout``; default 2 s)."""
    url = "redlock://h1:1,h2:1,h3:1/0"
    backend: Any = aiodlock.connect(url).backend
    assert [s.request_timeout for s in backend._sources] == [2.0] * 3
    for name in ("request_timeout", "socket_timeout"):
        backend = aiodlock.connect(url, **{name: 0.5}).backend
        assert [s.request_timeout for s in backend._sources] == [0.5] * 3


def _arbiter_of(masters: RedlockMasters, ns: str, name: str) -> tuple[str, int]:
    """The hash tag of ``name``'s keys and the index of its arbiter master (restated: the
    backend's are private)."""
    tag = f"{{{ns}:{name}}}"
    return tag, zlib.crc32(tag.encode()) % len(masters.servers)


async def _attempts(raw: aioredis.Redis) -> int:
    stats = await raw.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("eval", "evalsha"))


async def _subscribed(raws: list[aioredis.Redis], arbiter: int, channel: str) -> bool:
    """Whether a waiter listens on every master: on the arbiter, on its client's own channel
    (``channel:CLIENT``, where a release wakes one registered client); on the others, on the
    lock's channel."""
    for i, raw in enumerate(raws):
        if i == arbiter:
            if not await _client_channels(raw, channel):
                return False
            continue
        [(_, count)] = await raw.pubsub_numsub(channel)
        if count < 1:
            return False
    return True


async def _client_channels(raw: aioredis.Redis, channel: str) -> list[bytes]:
    """The waiting clients' own channels of a lock's ``channel`` subscribed on a master."""
    return sorted(
        c.encode() if isinstance(c, str) else c for c in await raw.pubsub_channels(channel + ":*")
    )


@contextlib.asynccontextmanager
async def _a_waiter_refused_at_the_arbiter(
    masters: RedlockMasters, ns: str
) -> AsyncIterator[tuple[list[aioredis.Redis], int, str]]:
    """A client holding ``job`` (ttl 30: no renewal meanwhile) and another client's task
    waiting for it, subscribed on every master; yields raw clients of the masters, the
    arbiter's index and the lock's channel. Its attempts are refused (the lock is held), so
    each wakeup costs one script on the arbiter and nothing on the others."""
    tag, arbiter = _arbiter_of(masters, ns, "job")
    channel = tag + ":signal"
    raws = [_raw(masters, i) for i in range(len(masters.servers))]
    async with (
        aiodlock.connect(masters.url, namespace=ns) as a,
        aiodlock.connect(masters.url, namespace=ns) as b,
    ):
        held = await a.lock("job", ttl=30).acquire()
        task = asyncio.create_task(b.lock("job", ttl=30).acquire(timeout=20))
        try:
            await eventually(partial(_subscribed, raws, arbiter, channel))
            yield raws, arbiter, channel
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await held.release()
            for raw in raws:
                await raw.aclose()


async def _quiet(raw: aioredis.Redis, *, longer_than: float) -> int:
    """The arbiter's script count once it has not moved for ``longer_than`` seconds (beyond
    the lead's grace: a late second attempt would show)."""
    count = await _attempts(raw)
    while True:
        await asyncio.sleep(longer_than)  # nothing would tell us of an attempt not made
        now = await _attempts(raw)
        if now == count:
            return count
        count = now


async def test_a_release_heard_from_every_master_wakes_a_waiter_once(
    masters: RedlockMasters,
) -> None:
    """A give-back (or a break) publishes on every master, so a waiting process hears it
    three times: on its own channel on the arbiter, on the lock's channel on the others. A
    mutex waiter waits on the arbiter's wakeup alone, and asks again once per release, not
    once per copy (it asked up to three times, from every waiting process: a herd). Here
    five releases are published by hand on every master while the lock stays held: five
    refused attempts on the arbiter, not ten or fifteen."""
    async with _a_waiter_refused_at_the_arbiter(masters, NS + "once") as (raws, arbiter, channel):
        [mine] = await _client_channels(raws[arbiter], channel)
        before = await _quiet(raws[arbiter], longer_than=0.3)
        others = [raw for i, raw in enumerate(raws) if i != arbiter]
        for n in range(1, 6):
            # The arbiter's copy last: the others' start the grace, which it cancels. (Had
            # it come first and its re-check begun before them, they would wake the waiter
            # again after the grace: a copy that lands after a re-check may be a new release.)
            await asyncio.gather(*(raw.publish(channel, "1") for raw in others))
            await raws[arbiter].publish(mine, "1")
            await eventually(partial(_at_least, raws[arbiter], before + n))
        assert await _quiet(raws[arbiter], longer_than=0.3) == before + 5


async def _at_least(raw: aioredis.Redis, count: int) -> bool:
    return await _attempts(raw) >= count


async def test_a_release_the_arbiter_did_not_publish_still_wakes_the_waiter(
    masters: RedlockMasters,
) -> None:
    """A release heard from the other masters but not from the arbiter (its copy lost, or
    its master silent) wakes the waiter all the same, after the arbiter's grace (100 ms)."""
    async with _a_waiter_refused_at_the_arbiter(masters, NS + "grace") as (raws, arbiter, channel):
        before = await _quiet(raws[arbiter], longer_than=0.3)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        others = [raw for i, raw in enumerate(raws) if i != arbiter]
        await asyncio.gather(*(raw.publish(channel, "1") for raw in others))
        await eventually(partial(_at_least, raws[arbiter], before + 1))
        assert loop.time() - sent >= 0.09
        assert await _quiet(raws[arbiter], longer_than=0.3) == before + 1


async def test_every_release_the_arbiter_did_not_publish_wakes_the_waiter(
    masters: RedlockMasters,
) -> None:
    """Not only the first: the other masters' copies of each release are used up by the
    re-check that follows them, so the next release there is heard too (a waiter left
    marked as woken there was passed over by that master's "wake one" ever after)."""
    async with _a_waiter_refused_at_the_arbiter(masters, NS + "each") as (raws, arbiter, channel):
        before = await _quiet(raws[arbiter], longer_than=0.3)
        others = [raw for i, raw in enumerate(raws) if i != arbiter]
        for n in range(1, 4):
            await asyncio.gather(*(raw.publish(channel, "1") for raw in others))
            await eventually(partial(_at_least, raws[arbiter], before + n))
        assert await _quiet(raws[arbiter], longer_than=0.3) == before + 3


async def test_a_wakeup_banked_while_the_arbiter_is_silent_does_not_wedge_it(
    masters: RedlockMasters,
) -> None:
    """An attempt the arbiter did not answer in time is given back there once its reply
    lands, and the waiter's next attempt on the arbiter waits for that give-back. A wakeup
    banked during the attempt starts the next one in the same loop step: the give-back
    must still wait for its own attempt, not the next one (each waited for the other, and
    the arbiter never heard from this waiter again). Once the arbiter answers again, the
    waiter is granted there too, on all three masters."""
    ns = NS + "wedge"
    tag, arbiter = _arbiter_of(masters, ns, "job")
    channel = tag + ":signal"
    raws = [_raw(masters, i) for i in range(len(masters.servers))]
    others = [raw for i, raw in enumerate(raws) if i != arbiter]
    loop = asyncio.get_running_loop()
    try:
        async with (
            aiodlock.connect(masters.url, namespace=ns) as a,
            aiodlock.connect(masters.url, namespace=ns) as b,
        ):
            held = await a.lock("job", ttl=30).acquire()
            waiter = asyncio.create_task(b.lock("job", ttl=10).acquire(timeout=25))
            await eventually(partial(_subscribed, raws, arbiter, channel))
            await _quiet(raws[arbiter], longer_than=0.3)
            masters.servers[arbiter].pause()
            # A release heard from the others only: after the grace the waiter asks the
            # arbiter, which is silent for its patience (ttl/10, 1 s: less than the 2 s
            # request_timeout, so the attempt there is still out when the others refuse).
            await asyncio.gather(*(raw.publish(channel, "1") for raw in others))
            asked = loop.time()
            await asyncio.sleep(0.5)  # within that attempt: no event tells of its progress
            # Another, banked while the attempt is out: the next follows it at once.
            await asyncio.gather(*(raw.publish(channel, "1") for raw in others))
            await asyncio.sleep(max(0.0, asked + 3 - loop.time()))  # both attempts sent
            masters.servers[arbiter].resume()
            await held.release()
            lease = await asyncio.wait_for(waiter, 20)
            assert await _keys(masters, arbiter, tag) == [tag.encode()]
            await lease.release()
    finally:
        masters.servers[arbiter].resume()
        for raw in raws:
            await raw.aclose()


@contextlib.asynccontextmanager
async def _arbiter_raw(
    masters: RedlockMasters, ns: str
) -> AsyncIterator[tuple[str, aioredis.Redis]]:
    """The hash tag of ``job`` in ``ns`` and a raw client of its arbiter master."""
    tag, arbiter = _arbiter_of(masters, ns, "job")
    raw = _raw(masters, arbiter)
    try:
        yield tag, raw
    finally:
        await raw.aclose()


async def _registered(raw: aioredis.Redis, tag: str, count: int) -> bool:
    return bool(await raw.zcard(tag + ":clients") == count)


async def test_a_release_wakes_one_waiting_client(masters: RedlockMasters) -> None:
    """A release on the arbiter wakes the longest-registered waiting client alone, on its
    own channel, and tells nobody on the other masters: one attempt per release, however
    many processes wait (each woken process asked the arbiter, and all but one were
    refused). Here three clients wait; each release lets exactly one of them in, with one
    attempt on the arbiter, until all three held the lock."""
    ns = NS + "one"
    async with _arbiter_raw(masters, ns) as (tag, raw), contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(aiodlock.connect(masters.url, namespace=ns))
            for _ in range(4)
        ]
        # Every master's counter far ahead of its clock, and the same: each grant then gets
        # the same token everywhere, and no write phase adds a script to the count.
        fence = time.time_ns() // 1000 + 10**12
        for i in range(len(masters.servers)):
            other = _raw(masters, i)
            try:
                await other.set(tag + ":fence", fence)
            finally:
                await other.aclose()
        lease = await clients[0].lock("job", ttl=30).acquire()
        waiting = {
            asyncio.create_task(c.lock("job", ttl=30).acquire(timeout=20)) for c in clients[1:]
        }
        await eventually(partial(_registered, raw, tag, 3))
        while waiting:
            before = await _quiet(raw, longer_than=0.3)
            await lease.release()
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            [task] = done
            lease = task.result()
            # The release and the one attempt it woke; nobody else asked.
            assert await _quiet(raw, longer_than=0.3) == before + 2
            assert await _registered(raw, tag, len(waiting))
        await lease.release()


async def test_a_wakeup_for_a_client_that_stopped_waiting_goes_on(
    masters: RedlockMasters,
) -> None:
    """A release wakes a registered client whose waiter has just given up (its channel still
    lingers): that client passes the wakeup on to the next registered one (``WAKE_NEXT``),
    which would otherwise wait for the holder's lease (30 s) to run out."""
    ns = NS + "passon"
    async with (
        _arbiter_raw(masters, ns) as (tag, raw),
        aiodlock.connect(masters.url, namespace=ns) as a,
        aiodlock.connect(masters.url, namespace=ns) as b,
        aiodlock.connect(masters.url, namespace=ns) as c,
    ):
        lease = await a.lock("job", ttl=30).acquire()
        gives_up = asyncio.create_task(b.lock("job", ttl=30).acquire(timeout=20))
        await eventually(partial(_registered, raw, tag, 1))
        [head] = await raw.zrange(tag + ":clients", 0, -1, withscores=True)
        first, score = cast("tuple[bytes, float]", head)
        stays = asyncio.create_task(c.lock("job", ttl=30).acquire(timeout=20))
        await eventually(partial(_registered, raw, tag, 2))
        gives_up.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gives_up
        # It left the registry as it gave up; put it back at the head, as if its removal
        # had not landed yet, while its channel still lingers (1 s).
        await eventually(partial(_registered, raw, tag, 1))
        await raw.zadd(tag + ":clients", {first: score})
        await lease.release()
        second = await asyncio.wait_for(stays, 10)
        await second.release()


async def test_a_release_the_arbiter_did_not_confirm_is_published_on_the_others(
    masters: RedlockMasters,
) -> None:
    """A holder that was not granted on the arbiter (or whose release there fails) cannot
    count on it to wake anyone: its release publishes on the other masters, and the
    waiter is let in after the lead's grace, not when the holder's lease (30 s) ends."""
    ns = NS + "fallback"
    async with (
        _arbiter_raw(masters, ns) as (tag, raw),
        aiodlock.connect(masters.url, namespace=ns) as a,
        aiodlock.connect(masters.url, namespace=ns) as b,
    ):
        lease = await a.lock("job", ttl=30).acquire()
        waiting = asyncio.create_task(b.lock("job", ttl=30).acquire(timeout=20))
        await eventually(partial(_registered, raw, tag, 1))
        assert await raw.delete(tag) == 1  # held on the two others: still a quorum
        await lease.release()
        second = await asyncio.wait_for(waiting, 10)
        await second.release()


async def test_a_waiter_is_granted_while_the_arbiter_is_stopped(masters: RedlockMasters) -> None:
    """A waiter's re-check asks the arbiter first and the other masters once its patience
    (the per-master timeout) is over; the round then gives those their own timeout. (It
    gave up at the first timeout, before they could answer: while the arbiter was silent a
    waiter was never granted, though two masters of three were free.)"""
    ns = NS + "silent"
    _, arbiter = _arbiter_of(masters, ns, "job")
    async with (
        aiodlock.connect(masters.url, namespace=ns) as a,
        aiodlock.connect(masters.url, namespace=ns) as b,
    ):
        lease = await a.lock("job", ttl=30).acquire()
        waiting = b.lock("job", ttl=5)
        task = asyncio.create_task(waiting.acquire(timeout=20))
        await wait_until(lambda: waiting.statistics().waiting == 1)
        masters.servers[arbiter].pause()
        try:
            await lease.release()
            second = await asyncio.wait_for(task, 10)
            await second.release()
        finally:
            masters.servers[arbiter].resume()
