"""Redis-only behaviour: what waiting costs, and surviving the server's faults."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING

import pytest

import aiodlock
from aiodlock.backends import parse_url, schemes
from aiodlock.testing import abandon, settle
from aiodlock.testing.conformance import LATE_RENEWAL_SLACK
from tests.helpers import eventually, wait_until

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from tests.servers import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def connections_named(raw: aioredis.Redis, prefix: str) -> int:
    clients = await raw.client_list()
    return sum(1 for c in clients if str(c.get("name", "")).startswith(prefix))


async def test_thousand_waiters_share_three_connections(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """1000 waiting readers are 1000 subscriptions on one pub/sub connection; the channel
    stays subscribed for a moment after the last one leaves (the next wait need not
    subscribe again), then it is unsubscribed."""
    async with aiodlock.connect(redis_url, namespace="thousand") as locks:
        writer = await locks.write_lock("hot").acquire()
        inside = 0
        all_in = asyncio.Event()

        async def reader() -> None:
            nonlocal inside
            async with locks.read_lock("hot", timeout=30):
                inside += 1
                if inside == 1000:
                    all_in.set()
                await all_in.wait()  # every reader holds at once: shared

        readers = [asyncio.create_task(reader()) for _ in range(1000)]
        await wait_until(lambda: locks.statistics().backend["waiters"] >= 1000)
        assert 2 <= await connections_named(raw, "aiodlock") <= 3  # commands + pub/sub
        await writer.release()
        await all_in.wait()  # the last waiter left its channel just now, not 1000 releases ago
        assert locks.statistics().backend["waiters"] == 0
        assert locks.statistics().backend["subscribed_channels"] == 1  # lingers
        await asyncio.gather(*readers)
        await wait_until(lambda: locks.statistics().backend["subscribed_channels"] == 0)
    channel = "{thousand:hot}:rw:signal"
    assert await raw.pubsub_numsub(channel) == [(channel.encode(), 0)]


async def test_local_waiters_take_turns_and_cost_one_server_waiter(redis_url: str) -> None:
    """Tasks of one client queue locally for a mutex: one of them waits at the service, a
    releasing task cannot barge in ahead of them, and they are served in arrival order."""
    async with aiodlock.connect(redis_url, namespace="turns") as locks:
        lock = locks.lock("hot")
        holder = await lock.acquire()
        order: list[int] = []

        async def worker(i: int) -> None:
            async with lock:
                order.append(i)

        workers = []
        for i in range(200):
            workers.append(asyncio.create_task(worker(i)))
            await asyncio.sleep(0)  # let it queue: arrival order is creation order
        await wait_until(lambda: lock.statistics().waiting >= 200)
        assert locks.statistics().backend["waiters"] == 1
        await holder.release()
        await asyncio.gather(*workers)
        assert order == list(range(200))


async def _registered(raw: aioredis.Redis, namespace: str, name: str) -> list[bytes]:
    """The clients registered as waiting for a mutex, longest-waiting first (pub/sub mode)."""
    members = await raw.zrange(f"{{{namespace}:{name}}}:clients", 0, -1)
    return [m for m in members if isinstance(m, bytes)]


async def test_a_release_wakes_the_longest_waiting_client_only(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """Pub/sub mode wakes one client per release, the one that registered first, rather than
    every waiting process (which all try at once, and the fastest wins): five clients that
    began waiting one after another get the lock in that order, each woken by the release
    before it. With the holder's 30 s lease, a wakeup that went missing would time out."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(aiodlock.connect(redis_url, namespace="wakeone"))
            for _ in range(6)
        ]
        holder = await clients[0].lock("k", ttl=30).acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            async with clients[i].lock("k", ttl=30, timeout=20):
                order.append(i)

        tasks = []
        for i in range(1, 6):
            tasks.append(asyncio.create_task(waiter(i)))
            await eventually(partial(_has, raw, "wakeone", "k", i))
        await holder.release()
        await asyncio.gather(*tasks)
        assert await _registered(raw, "wakeone", "k") == []
    assert order == [1, 2, 3, 4, 5]


async def _has(raw: aioredis.Redis, namespace: str, name: str, count: int) -> bool:
    return len(await _registered(raw, namespace, name)) == count


def _waits_here(locks: aiodlock.LockClient, count: int) -> bool:
    """``count`` tasks of ``locks`` wait for a wakeup (armed on its pub/sub hub)."""
    return bool(locks.statistics().backend["waiters"] == count)


async def test_a_registered_client_that_is_gone_does_not_swallow_the_release(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """A client that registered as waiting and then died (its channel has no subscriber) is
    skipped: the release wakes the next registered client, long before the 30 s lease."""
    async with (
        aiodlock.connect(redis_url, namespace="gone") as a,
        aiodlock.connect(redis_url, namespace="gone") as b,
    ):
        holder = await a.lock("k", ttl=30).acquire()
        await raw.zadd("{gone:k}:clients", {"0123456789abcdef": 0})  # first in line, dead
        waiting = asyncio.create_task(b.lock("k", ttl=30).acquire(timeout=10))
        await eventually(partial(_has, raw, "gone", "k", 2))
        await holder.release()
        lease = await waiting
        await lease.release()
        assert await _registered(raw, "gone", "k") == []


async def test_a_wakeup_that_finds_its_waiter_gone_is_passed_on(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """A client whose waiter gave up takes itself off the registry, but a release can pick it
    before that lands (here it is put back at the head by hand), while its channel stays
    subscribed for a moment (LINGER): the release wakes nobody there, so the client hands the
    wakeup on to the next registered client rather than leaving it to wait out the holder's
    30 s lease."""
    async with (
        aiodlock.connect(redis_url, namespace="passon") as a,
        aiodlock.connect(redis_url, namespace="passon") as b,
        aiodlock.connect(redis_url, namespace="passon") as c,
    ):
        holder = await a.lock("k", ttl=30).acquire()
        gives_up = asyncio.create_task(b.lock("k", ttl=30).acquire(timeout=20))
        await eventually(partial(_has, raw, "passon", "k", 1))
        [b_id] = await _registered(raw, "passon", "k")
        patient = asyncio.create_task(c.lock("k", ttl=30).acquire(timeout=20))
        await eventually(partial(_has, raw, "passon", "k", 2))
        gives_up.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gives_up
        await eventually(partial(_has, raw, "passon", "k", 1))  # b left the registry
        await raw.zadd("{passon:k}:clients", {b_id: 0})  # as if the release came first
        assert b.statistics().backend["subscribed_channels"] == 1  # it lingers
        await holder.release()
        lease = await patient
        await lease.release()
        assert b.statistics().backend["wakeups_passed_on"] == 1


async def _publishes(raw: aioredis.Redis) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


async def test_a_release_hands_the_lock_to_a_waiter_of_its_own_client(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """With no other client waiting longer, a release gives the lock straight to the next
    waiter of the same client, in the release's own script: nothing is published, and the
    waiter's grant needs no attempt of its own. Its fencing token is the next one."""
    async with aiodlock.connect(redis_url, namespace="handoff") as locks:
        first = await locks.lock("k", ttl=30).acquire()
        second = asyncio.create_task(locks.lock("k", ttl=30).acquire(timeout=20))
        await wait_until(partial(_waits_here, locks, 1))  # refused by its own client
        published = await _publishes(raw)
        await first.release()
        lease = await second
        assert await _publishes(raw) == published
        assert lease.fencing_token > first.fencing_token
        assert await raw.get("{handoff:k}") is not None
        await lease.release()
        assert await raw.get("{handoff:k}") is None


async def _scripts(raw: aioredis.Redis) -> int:
    stats = await raw.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("eval", "evalsha"))


async def test_a_task_refused_by_its_own_client_sends_nothing_while_it_waits(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """While a task of a client holds a mutex, the attempt of the task whose turn is next
    (and its re-check after arming) is refused by the client itself, once its channel for the
    lock is live: the server runs nothing for it until the release hands it the lock."""
    async with aiodlock.connect(redis_url, namespace="heldhere") as locks:
        first = await locks.lock("k", ttl=30).acquire()
        second = asyncio.create_task(locks.lock("k", ttl=30).acquire(timeout=20))
        await wait_until(partial(_waits_here, locks, 1))  # asked the server: not subscribed yet
        third = asyncio.create_task(locks.lock("k", ttl=30).acquire(timeout=20))
        await wait_until(lambda: locks.statistics().backend["subscribed_channels"] == 1)
        before = await _scripts(raw)
        await first.release()  # hands the lock to the second; the third's turn comes
        lease = await second
        await wait_until(partial(_waits_here, locks, 1))  # the third is armed
        assert await _scripts(raw) == before + 1  # the handoff: nothing for the third
        await lease.release()
        last = await third
        assert await _scripts(raw) == before + 2
        assert first.fencing_token < lease.fencing_token < last.fencing_token
        await last.release()
        assert await raw.get("{heldhere:k}") is None


async def test_a_blpop_release_knows_a_waiter_of_its_own_client_as_its_registration_is_sent(
    redis_url: str, raw: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BLPOP mode: a release that the server runs after a waiter's registration, before its
    client has read the reply, must not take that waiter for another client's and stay out
    for the courtesy: the waiter would be refused by its own client's yield for 30 ms."""
    async with aiodlock.connect(redis_url, namespace="armrace", wakeup="blpop") as locks:
        holder = await locks.lock("k", ttl=30).acquire()
        scripts = type(locks.backend._signals._commands)  # type: ignore[attr-defined]
        arm = scripts.arm_waiter
        yielded: list[int] = []

        async def arm_then_release(self: object, registry: bytes, owner: str) -> None:
            await arm(self, registry, owner)
            await holder.release()  # while the waiter's registration is still under way
            yielded.append(await raw.exists("{armrace:k}:yield"))

        monkeypatch.setattr(scripts, "arm_waiter", arm_then_release)
        lease = await locks.lock("k", ttl=30).acquire(timeout=20)
        assert yielded == [0]
        assert lease.fencing_token > holder.fencing_token
        await lease.release()


async def test_a_blpop_wait_that_starts_as_its_last_blpop_ends_blocks_again(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """A waiter's BLPOP that timed out on the server while the waiter was re-checking ends its
    task; the waiter's next wait() can start in the very loop step that task ended, before the
    task's clean-up callback has run. That wait must send a BLPOP of its own: counting on the
    ended one left a waiter deaf to every release until its own timer ran out (across 10
    processes, 10 s stalls, the lease of the lock it waited for)."""
    key, registry = b"{gap:k}:signal", b"{gap:k}:waiters"
    async with aiodlock.connect(redis_url, namespace="gap", wakeup="blpop") as locks:
        signals = locks.backend._signals  # type: ignore[attr-defined]
        async with signals.waiter(key, "w", registry=registry, lists=(key,)) as waiter:
            for _ in range(5):  # until our timer ends a wait before the server's reply comes
                await waiter.wait(0.05)
                read = waiter._read
                if read is not None and not read.done():
                    break
            assert read is not None and not read.done()
            # Step by step until the server's timeout reply ends the task: awaiting the task
            # itself would resume us only after its clean-up callback, the state not under test.
            while not read.done():  # noqa: ASYNC110
                await asyncio.sleep(0)

            async def token_later() -> None:
                await asyncio.sleep(0.2)
                await raw.lpush(key, b"1")

            pusher = asyncio.create_task(token_later())
            loop = asyncio.get_running_loop()
            began = loop.time()
            await waiter.wait(5)  # started in this step: the ended task is not cleaned up yet
            assert loop.time() - began < 2, "the wait missed the token pushed after 0.2 s"
            await pusher


async def test_a_handoff_yields_to_a_client_that_waited_longer(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """A client's own waiter does not jump the line: when another client registered first,
    the release wakes that client, and the local waiter's turn comes after it. The local
    waiter was refused by its own client (nothing registered it): the release registers its
    client as it yields, so the other client's release wakes it, long before the holder's
    30 s lease would have ended its wait."""
    order: list[str] = []
    async with (
        aiodlock.connect(redis_url, namespace="nojump") as x,
        aiodlock.connect(redis_url, namespace="nojump") as y,
    ):
        holder = await x.lock("k", ttl=30).acquire()

        async def take(who: str, locks: aiodlock.LockClient) -> None:
            async with locks.lock("k", ttl=30, timeout=20):
                order.append(who)

        other = asyncio.create_task(take("y", y))
        await eventually(partial(_has, raw, "nojump", "k", 1))
        local = asyncio.create_task(take("x", x))
        await wait_until(partial(_waits_here, x, 1))  # refused by x itself: not registered
        await holder.release()
        await asyncio.gather(other, local)
    assert order == ["y", "x"]


async def test_a_release_that_yields_registers_a_waiter_its_client_refused(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """x's second task is refused by x itself while x's first task holds (nothing registers
    x); y registered meanwhile. The release yields to y and registers x in the same script,
    so y's release wakes x: the second task gets the lock long before the holder's 30 s
    lease would have ended its wait."""
    order: list[str] = []
    entered: dict[str, float] = {}
    go = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def take(who: str, locks: aiodlock.LockClient) -> None:
        async with locks.lock("k", ttl=30, timeout=10):
            order.append(who)
            entered[who] = loop.time()
            await go.wait()

    async with (
        aiodlock.connect(redis_url, namespace="yieldreg", burst=0) as x,
        aiodlock.connect(redis_url, namespace="yieldreg", burst=0) as y,
    ):
        first = await y.lock("k", ttl=30).acquire()
        x1 = asyncio.create_task(take("x1", x))
        await eventually(partial(_has, raw, "yieldreg", "k", 1))  # x waits: its channel is live
        await first.release()
        await wait_until(lambda: order == ["x1"])
        x2 = asyncio.create_task(take("x2", x))
        await wait_until(partial(_waits_here, x, 1))  # refused by x itself, and armed
        other = asyncio.create_task(take("y", y))
        await eventually(partial(_has, raw, "yieldreg", "k", 1))  # only y is registered
        go.set()
        went = loop.time()
        await asyncio.gather(x1, x2, other)
    assert order == ["x1", "y", "x2"]
    # Woken by y's release, not let in by the last attempt its 10 s timeout makes.
    assert entered["x2"] - went < 5


async def test_a_lock_handed_to_a_waiter_that_left_is_given_back(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """The waiter a release picks is cancelled while the handoff is on its way: the grant it
    can no longer use is released behind it, so nobody is left holding the lock."""
    async with aiodlock.connect(redis_url, namespace="giveback") as locks:
        holder = await locks.lock("k", ttl=30).acquire()
        waiting = asyncio.create_task(locks.lock("k", ttl=30).acquire(timeout=20))
        await wait_until(partial(_waits_here, locks, 1))  # refused by its own client
        waiting.cancel()  # takes effect once the release below is on its way
        await holder.release()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await settle(locks)
        assert await raw.get("{giveback:k}") is None
        again = await locks.lock("k", ttl=30).acquire(timeout=0)
        await again.release()


@pytest.mark.parametrize("steps", range(1, 6))
async def test_a_release_cancelled_during_a_handoff_leaves_the_lock_to_its_taker(
    redis_url: str, raw: aioredis.Redis, steps: int
) -> None:
    """The releasing task is cancelled after 1, 2, 3... loop iterations, while the handoff
    may be on its way: the waiter still gets the lock (long before the 30 s lease), and once
    it is done nothing is left held."""
    async with aiodlock.connect(redis_url, namespace="cutoff") as locks:
        holder = await locks.lock("k", ttl=30).acquire()
        waiting = asyncio.create_task(locks.lock("k", ttl=30).acquire(timeout=20))
        await wait_until(partial(_waits_here, locks, 1))  # refused by its own client
        releasing = asyncio.create_task(holder.release())
        for _ in range(steps):
            await asyncio.sleep(0)
        releasing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await releasing
        lease = await waiting
        await lease.release()
        await settle(locks)
        assert await raw.get("{cutoff:k}") is None


@contextlib.asynccontextmanager
async def _logging_every_command(raw: aioredis.Redis) -> AsyncIterator[None]:
    """The server's slow log records every command (with its arguments) meanwhile."""
    config = await raw.config_get("slowlog-*")
    slower, length = str(config["slowlog-log-slower-than"]), str(config["slowlog-max-len"])
    await raw.config_set("slowlog-log-slower-than", 0)
    await raw.config_set("slowlog-max-len", 10000)
    await raw.slowlog_reset()
    try:
        yield
    finally:
        await raw.config_set("slowlog-log-slower-than", slower)
        await raw.config_set("slowlog-max-len", length)


async def _commands_naming(raw: aioredis.Redis, text: str) -> list[int]:
    """Ids (in the order the server ran them) of the logged commands with ``text`` among
    their arguments."""
    needle = text.encode()
    return sorted(
        entry["id"]
        for entry in await raw.slowlog_get(10000)
        if any(needle == arg for arg in entry["command"].split())
    )


async def _scripts_naming(raw: aioredis.Redis, owner: bytes, count: int) -> bool:
    """Whether the slow log holds ``count`` scripts run with ``owner`` among their arguments."""
    entries = await raw.slowlog_get(10000)
    scripts = [e for e in entries if e["command"].split()[0] in (b"EVALSHA", b"EVAL")]
    return sum(1 for e in scripts if owner in e["command"].split()) >= count


async def test_a_fair_release_hands_the_lock_to_the_head_of_the_queue(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """The release of a fair lock gives it straight to the head of the queue, in the same
    script: the head (another client) runs no command of its own to take it, holds the key,
    and has the next fencing token."""
    async with (
        aiodlock.connect(redis_url, namespace="fairhand") as a,
        aiodlock.connect(redis_url, namespace="fairhand") as b,
        _logging_every_command(raw),
    ):
        holder = await a.lock("k", fair=True, ttl=30).acquire()
        waiting = asyncio.create_task(b.lock("k", fair=True, ttl=30).acquire(timeout=20))
        await eventually(lambda: _in_queue(raw, "{fairhand:k}", 1))
        [head] = await raw.lrange("{fairhand:k}:queue", 0, -1)
        assert isinstance(head, bytes)
        # Refused, then re-checked once its wakeup was armed: it waits now. (Released before
        # the re-check came, the lock would be taken by that re-check, a command of its own.)
        await eventually(lambda: _scripts_naming(raw, head, 2))
        await holder.release()
        lease = await waiting
        released = await _commands_naming(raw, holder.owner)
        taken = await _commands_naming(raw, lease.owner)
        assert released and taken
        assert max(taken) < max(released)  # nothing of the head's ran after the release
        assert lease.fencing_token > holder.fencing_token
        assert await raw.get("{fairhand:k}") == lease.owner.encode()
        assert 0 < await raw.pttl("{fairhand:k}") <= 30_000
        await lease.release()
        assert await raw.get("{fairhand:k}") is None


async def test_a_fair_release_wakes_only_the_process_of_the_head(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """A fair release publishes its wakeup on the channel of the head's client alone: a
    process waiting further back hears nothing. (On the lock's shared channel, every release
    woke every process with a waiter: nine wakeups per grant with ten processes.)"""
    listener = raw.pubsub()
    await listener.psubscribe("{fairherd:k}:signal*")
    async with (
        aiodlock.connect(redis_url, namespace="fairherd") as a,
        aiodlock.connect(redis_url, namespace="fairherd") as b,
        aiodlock.connect(redis_url, namespace="fairherd") as c,
    ):
        holder = await a.lock("k", fair=True).acquire()
        first = asyncio.create_task(b.lock("k", fair=True).acquire(timeout=20))
        await eventually(lambda: _in_queue(raw, "{fairherd:k}", 1))
        second = asyncio.create_task(c.lock("k", fair=True).acquire(timeout=20))
        await eventually(lambda: _in_queue(raw, "{fairherd:k}", 2))
        await holder.release()
        lease = await first
        await lease.release()
        last = await second
        await last.release()
    await raw.publish("{fairherd:k}:signal:end", "end")  # everything before it was heard
    heard: list[tuple[bytes, bytes]] = []
    async with asyncio.timeout(10):
        async for message in listener.listen():
            if message["type"] != "pmessage":
                continue
            if message["channel"] == b"{fairherd:k}:signal:end":
                break
            heard.append((message["channel"], message["data"]))
    await listener.aclose()  # type: ignore[no-untyped-call]
    to_b = [channel for channel, data in heard if data.startswith(lease.owner.encode())]
    to_c = [channel for channel, data in heard if data.startswith(last.owner.encode())]
    assert len(to_b) == 1 and len(to_c) == 1, heard
    assert b"{fairherd:k}:signal" not in (channel for channel, _ in heard)
    assert to_b[0] != to_c[0]  # one channel per client
    assert all(channel.startswith(b"{fairherd:k}:signal:") for channel in to_b + to_c)


async def _in_queue(raw: aioredis.Redis, lock: str, count: int) -> bool:
    return int(await raw.llen(f"{lock}:queue")) == count


async def test_a_fair_lock_handed_to_a_dead_head_is_held_only_until_its_deadline(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """The head of the queue is a waiter that stopped trying (its process died): the
    release hands it the lock all the same, for no longer than its place in the queue would
    have lasted (its liveness deadline); then the next waiter gets the lock."""
    async with aiodlock.connect(redis_url, namespace="deadhead") as locks:
        holder = await locks.lock("k", fair=True, ttl=30).acquire()
        seconds, micros = await raw.time()
        # Still alive when the release comes, however slowly the waiter below queues.
        liveness_ms = 500 + int(LATE_RENEWAL_SLACK * 1000)
        deadline = seconds * 1000 + micros // 1000 + liveness_ms
        # What a waiter's refused attempt leaves (see the key layout in docs/redis.md).
        await raw.rpush("{deadhead:k}:queue", "dead")
        await raw.zadd("{deadhead:k}:qdeadline", {"dead": deadline})
        waiting = asyncio.create_task(locks.lock("k", fair=True, ttl=30).acquire(timeout=10))
        await eventually(lambda: _in_queue(raw, "{deadhead:k}", 2))
        await holder.release()
        assert await raw.get("{deadhead:k}") == b"dead"
        assert 0 < await raw.pttl("{deadhead:k}") <= liveness_ms
        lease = await waiting  # long before its 10 s timeout, and the 30 s ttl
        assert lease.fencing_token > holder.fencing_token + 1  # the dead head had one
        await lease.release()


async def test_a_fair_head_that_missed_its_handoff_takes_the_lock_at_its_next_attempt(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """The head's pub/sub connection is gone when the release hands it the lock, so the
    wakeup is lost: once reconnected it re-checks, and that attempt confirms the lock is its
    own (without it, the head would wait out its own 30 s lease and time out)."""
    async with (
        aiodlock.connect(redis_url, namespace="missed") as a,
        aiodlock.connect(redis_url, namespace="missed") as b,
    ):
        holder = await a.lock("k", fair=True, ttl=30).acquire()
        waiting = asyncio.create_task(b.lock("k", fair=True, ttl=30).acquire(timeout=10))
        await wait_until(lambda: b.statistics().backend["waiters"] >= 1)
        await eventually(lambda: _in_queue(raw, "{missed:k}", 1))
        await raw.client_kill_filter(_type="pubsub")
        await holder.release()  # b reconnects after a backoff of at least 25 ms
        lease = await waiting
        assert await raw.get("{missed:k}") == lease.owner.encode()
        await lease.release()


async def test_renew_never_resurrects(redis_url: str, raw: aioredis.Redis) -> None:
    async with aiodlock.connect(redis_url, namespace="resurrect", ttl=0.3) as locks:
        lease = await locks.lock("k").acquire()
        await raw.delete("{resurrect:k}")
        await asyncio.wait_for(lease.lost.wait(), 2)
        assert await raw.exists("{resurrect:k}") == 0


async def test_waiter_is_woken_after_pubsub_connection_is_killed(
    redis_url: str, raw: aioredis.Redis
) -> None:
    async with (
        aiodlock.connect(redis_url, namespace="killsub") as locks,
        aiodlock.connect(redis_url, namespace="killsub") as other,
    ):
        loop = asyncio.get_running_loop()
        holder = await locks.lock("k", ttl=30).acquire()
        waiting = asyncio.create_task(other.lock("k", ttl=30).acquire(timeout=10))
        await wait_until(lambda: other.statistics().backend["waiters"] >= 1)
        channels = "{killsub:k}:signal*"  # the waiting client's channel for the mutex
        await eventually(partial(_subscribed, raw, channels))
        assert await raw.client_kill_filter(_type="pubsub") >= 1
        assert await raw.pubsub_channels(channels) == []  # gone with its connection
        # The subscriber noticed, reconnected and subscribed again (on the server's word).
        await eventually(partial(_subscribed, raw, channels))
        assert not waiting.done()
        released_at = loop.time()
        await holder.release()
        lease = await waiting
        # Well before the 30 s lease (and the 10 s timeout): a wakeup, not an expiry.
        assert loop.time() - released_at < 5
        assert lease.fencing_token > holder.fencing_token
        await lease.release()


async def _subscribed(raw: aioredis.Redis, pattern: str) -> bool:
    return await raw.pubsub_channels(pattern) != []


async def test_unreachable_server_is_a_backend_error_without_the_password() -> None:
    from tests.servers import RedisServer

    server = RedisServer()
    port = server.port  # a free port nobody listens on
    with pytest.raises(aiodlock.BackendError) as info:
        async with aiodlock.connect(f"redis://:hunter2@127.0.0.1:{port}/0", connect_timeout=1):
            pass
    assert "hunter2" not in str(info.value)
    assert "127.0.0.1" in str(info.value)
    server.close()


async def test_holder_survives_server_restart_as_a_loss_not_a_hang(
    redis_url: str,
) -> None:
    """A restarted server forgets every lock: holders must hear about it, not hang."""
    from tests.servers import RedisServer

    server = RedisServer().start()
    try:
        async with aiodlock.connect(server.url, namespace="restart", ttl=0.6) as locks:
            with pytest.raises(aiodlock.LockLostError):
                async with locks.lock("k"):
                    await asyncio.to_thread(server.restart)
                    await asyncio.sleep(5)
    finally:
        server.close()


# ---------------------------------------------------------------------- outages


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of the test's own, to stop, pause and restart."""
    from tests.servers import RedisServer

    with RedisServer() as server:
        yield server


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "aiodlock" and r.levelno == level]


async def test_an_outage_is_logged_once_not_per_request(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 12: a stopped Redis under load used to log a WARNING per failed release and per
    compensating release of an acquire that never reached the server. Now: one WARNING when
    requests start failing, DEBUG for the rest, one INFO when the server answers again; and
    an acquire that could not even connect leaves nothing to undo (no background release)."""
    caplog.set_level(logging.DEBUG, logger="aiodlock")
    options = {"namespace": "outage", "connect_timeout": 0.5, "socket_timeout": 0.5}
    async with aiodlock.connect(own_server.url, **options) as locks:
        inside = asyncio.Barrier(21)
        leave = asyncio.Event()

        async def holder(i: int) -> None:
            async with locks.lock(f"k{i}", ttl=30):
                await inside.wait()
                await leave.wait()

        holders = [asyncio.create_task(holder(i)) for i in range(20)]
        await inside.wait()
        await asyncio.to_thread(own_server.stop)
        leave.set()
        await asyncio.gather(*holders)  # their releases fail: logged, not raised
        for i in range(100):
            with pytest.raises(aiodlock.BackendError) as failure:
                await locks.lock(f"new{i}").acquire()
            assert failure.value.request_sent is False
        await settle(locks)
        assert len(_records(caplog, logging.WARNING)) == 1
        assert not [r for r in caplog.records if "background release" in r.getMessage()]
        await asyncio.to_thread(own_server.start)
        async with locks.lock("back"):
            pass
        [recovered] = _records(caplog, logging.INFO)
        assert "answers again" in recovered.getMessage()
        assert len(_records(caplog, logging.WARNING)) == 1


async def test_a_lost_lease_leaves_its_block_at_once_on_a_paused_server(
    own_server: RedisServer,
) -> None:
    """Issue 12: with the server paused, the body was cancelled at the loss but the block
    raised LockLostError only a socket timeout later (its release waited for the server).
    A lease known to be lost is given back in the background: the block ends at once."""
    loop = asyncio.get_running_loop()
    socket_timeout = 5
    async with aiodlock.connect(
        own_server.url, namespace="paused", socket_timeout=socket_timeout
    ) as locks:
        lease_lost_at = 0.0
        with pytest.raises(aiodlock.LockLostError):
            async with locks.lock("k", ttl=0.6) as lease:
                await asyncio.to_thread(own_server.pause)
                try:
                    await asyncio.sleep(10)
                finally:
                    lease_lost_at = loop.time()
        left_at = loop.time()
        own_server.resume()
        assert lease.lost.is_set()
        # At once, not a socket timeout later: a few loop turns, with room (over three times
        # LATE_RENEWAL_SLACK) for a loaded loop.
        assert left_at - lease_lost_at < socket_timeout / 4


async def test_command_deadlines_are_precise(own_server: RedisServer) -> None:
    """Issue 12: deadlines landed up to a quarter of ``socket_timeout`` late (a 5 s limit
    fired after 5-6.25 s). Now within 25 ms of it, plus the loop's own lateness: under
    LATE_RENEWAL_SLACK on a loaded machine. The limit is long enough that the old sweeper
    (every limit/4 = 1 s) would be later than that for some of the three phases."""
    loop = asyncio.get_running_loop()
    took = []
    limit = 4.0
    period = limit / 4  # the old sweeper's: 1 s, well over LATE_RENEWAL_SLACK
    async with aiodlock.connect(own_server.url, namespace="late", socket_timeout=limit) as locks:
        await asyncio.to_thread(own_server.pause)
        try:
            for phase in (0.25, 0.5, 0.75):  # the old sweeper cut them off late
                await asyncio.sleep(phase * period)  # not in step with a periodic sweeper
                started = loop.time()
                with pytest.raises(aiodlock.BackendError, match=r"within (request_timeout \()?4 s"):
                    await locks.lock("k").try_acquire()
                took.append(loop.time() - started)
        finally:
            own_server.resume()
    assert all(limit <= t < limit + LATE_RENEWAL_SLACK for t in took), took


# ---------------------------------------------------------------------- fencing counters


async def test_tokens_keep_increasing_when_the_counter_is_lost(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """Issue 12: a counter lost with a restart, a failover or an eviction used to start again
    at 1, and a fenced resource that had stored a larger token refused every later holder.
    A missing counter now starts from the server clock in microseconds."""
    async with aiodlock.connect(redis_url, namespace="lostfence") as locks:
        tokens = []
        for kind in ("mutex", "fair", "write", "read", "semaphore"):
            for _ in range(2):
                async with _one(locks, kind, "k") as lease:
                    tokens.append(lease.fencing_token)
                await raw.delete("{lostfence:k}:fence")  # as a restart would
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
    seconds, micros = await raw.time()
    assert tokens[-1] <= seconds * 1_000_000 + micros  # seeded from the clock, then +1


def _one(locks: aiodlock.LockClient, kind: str, name: str) -> aiodlock.BaseLock:
    if kind == "fair":
        return locks.lock(name, fair=True)
    if kind == "write":
        return locks.write_lock(name)
    if kind == "read":
        return locks.read_lock(name)
    if kind == "semaphore":
        return locks.semaphore(name, limit=2)
    return locks.lock(name)


async def test_fencing_counter_expires_after_fence_ttl(redis_url: str, raw: aioredis.Redis) -> None:
    """A counter no longer lives forever (72 bytes per lock name ever used): it expires
    ``fence_ttl`` after the last grant (default 7 days); ``fence_ttl=0`` keeps it."""
    key = "{fencettl:k}:fence"
    async with aiodlock.connect(redis_url, namespace="fencettl") as locks:
        async with locks.lock("k"):
            pass
        assert 7 * 86400_000 - 60_000 < await raw.pttl(key) <= 7 * 86400_000
    # fence_ttl=1: still there when we look right after the release, on a loaded machine too.
    async with aiodlock.connect(f"{redis_url}?fence_ttl=1", namespace="fencettl") as locks:
        async with locks.semaphore("k", limit=1) as first:
            pass
        assert 0 < await raw.pttl(key) <= 1000
        await eventually(lambda: _gone(raw, key), timeout=5)
        async with locks.lock("k") as second:
            assert second.fencing_token > first.fencing_token
    async with aiodlock.connect(redis_url, namespace="fencettl", fence_ttl=0) as locks:
        async with locks.read_lock("k"):
            pass
        assert await raw.pttl(key) == -1


async def _gone(raw: aioredis.Redis, key: str) -> bool:
    return not await raw.exists(key)


@pytest.mark.parametrize("value", [-1, float("nan"), "soon", None, True])
def test_fence_ttl_is_checked(value: object) -> None:
    with pytest.raises((TypeError, ValueError), match="fence_ttl"):
        aiodlock.connect("redis://127.0.0.1:1/0", fence_ttl=value)


@pytest.mark.parametrize("value", [-1, float("nan"), "soon", None, True])
def test_burst_is_checked(value: object) -> None:
    with pytest.raises((TypeError, ValueError), match="burst"):
        aiodlock.connect("redis://127.0.0.1:1/0", burst=value)


@pytest.mark.parametrize(("burst", "expected"), [(30.0, "a a b"), (0.0, "a b a")])
async def test_a_client_keeps_the_lock_for_its_run_then_lets_the_woken_client_in(
    redis_url: str, raw: aioredis.Redis, burst: float, expected: str
) -> None:
    """A client granted the lock while another client waits may take it back for ``burst``
    seconds (here its next task takes it over, although the other client registered first);
    when the run is over, or with ``burst=0``, the client that waited longer goes first."""
    order: list[str] = []
    space = f"run{int(burst)}"
    async with (
        aiodlock.connect(redis_url, namespace=space, burst=burst) as a,
        aiodlock.connect(redis_url, namespace=space, burst=burst) as b,
        aiodlock.connect(redis_url, namespace=space, burst=burst) as c,
    ):
        holder = await c.lock("k", ttl=30).acquire()

        async def take(who: str, locks: aiodlock.LockClient, then: asyncio.Event) -> None:
            async with locks.lock("k", ttl=30, timeout=20):
                order.append(who)
                await then.wait()

        go = [asyncio.Event() for _ in range(3)]
        first = asyncio.create_task(take("a", a, go[0]))
        await eventually(partial(_has, raw, space, "k", 1))
        other = asyncio.create_task(take("b", b, go[2]))
        await eventually(partial(_has, raw, space, "k", 2))  # b waits behind a
        await holder.release()
        await wait_until(lambda: order == ["a"])  # granted while b waits: a's run starts
        second = asyncio.create_task(take("a", a, go[1]))
        await wait_until(lambda: a.statistics().backend["waiters"] >= 1)
        for event in go:
            event.set()
        await asyncio.gather(first, second, other)
    assert " ".join(order) == expected


async def test_tokens_keep_increasing_across_a_restart_under_contention() -> None:
    """Issues 12 and 16.6: tasks of two clients contend for one lock while the server (no
    persistence) is restarted under them. Holders at the restart are told (their renewal
    finds the key gone), waiters ride over the outage, grants resume, and every token handed
    out after the restart is larger than every token before it, so a fenced resource accepts
    the new holders (it refused them all when the counter restarted at 1)."""
    from tests.servers import RedisServer

    before: list[int] = []
    after: list[int] = []
    restarted = False
    enough = asyncio.Event()
    done = asyncio.Event()

    async def worker(locks: aiodlock.LockClient) -> None:
        while not done.is_set():
            try:
                async with locks.lock("k", timeout=10) as lease:
                    tokens = after if restarted else before
                    tokens.append(lease.fencing_token)
                    if len(before) >= 20:
                        enough.set()
                    if len(after) >= 20:
                        done.set()
                    await asyncio.sleep(random.uniform(0, 0.003))
            except (aiodlock.LockLostError, aiodlock.BackendError):
                await asyncio.sleep(0.01)  # the server is down: try again shortly

    server = RedisServer().start()
    try:
        options = {"namespace": "restart", "ttl": 0.6, "socket_timeout": 1, "connect_timeout": 1}
        async with (
            aiodlock.connect(server.url, **options) as a,
            aiodlock.connect(server.url, **options) as b,
        ):
            workers = [asyncio.create_task(worker(c)) for c in (a, b) for _ in range(5)]
            await asyncio.wait_for(enough.wait(), 10)
            await asyncio.to_thread(server.restart)
            restarted = True
            await asyncio.wait_for(done.wait(), 20)
            await asyncio.gather(*workers)
    finally:
        server.close()
    assert min(after) > max(before), (before, after)


async def _storm(
    clients: Sequence[aiodlock.LockClient],
    name: str,
    *,
    fair: bool,
    stop: asyncio.Event,
    tasks: int,
) -> int:
    """Tasks that take ``name`` in a loop until ``stop`` is set, each attempt cancelled after
    0-50 ms (at whatever await point it has reached), holding it 0-2 ms; returns how many
    grants they got."""
    grants = 0

    async def contender(locks: aiodlock.LockClient) -> None:
        nonlocal grants
        while not stop.is_set():
            try:
                async with asyncio.timeout(random.uniform(0, 0.05)):
                    async with locks.lock(name, fair=fair, ttl=5):
                        grants += 1
                        await asyncio.sleep(random.uniform(0, 0.002))
            except TimeoutError:
                pass

    await asyncio.gather(*(contender(locks) for locks in clients for _ in range(tasks)))
    return grants


async def _storm_for(
    seconds: float, clients: Sequence[aiodlock.LockClient], name: str, *, fair: bool
) -> int:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    return await _storm(clients, name, fair=fair, stop=stop, tasks=40)


def _queued(lock: aiodlock.Lock) -> bool:
    return lock.statistics().waiting == 1  # its first attempt was refused: it is in the queue


async def _fair_leftovers(raw: aioredis.Redis, namespace: str, name: str) -> list[bytes]:
    keys = [k async for k in raw.scan_iter(match=f"{{{namespace}:{name}}}*")]
    channels = await raw.pubsub_channels(f"{{{namespace}:{name}}}*")
    return [k for k in keys if not k.endswith(b":fence")] + channels


async def test_fair_queue_keeps_pace_under_a_cancellation_storm(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """Issue 16 item 4: tasks of two clients contend for one lock and are cancelled at random
    await points. A cancelled fair waiter must pass its turn on at once (it used to hold the
    queue until its compensating release got through a backlog, or until its deadline), so
    the fair lock keeps up with the unfair one under the same storm, and nothing of the fair
    queue is left behind: no entry, no key but the fencing counter, no subscription.

    One command connection per client, so that 40 tasks each keep its command queue full.
    The fair lock makes about 0.5-0.7 times the unfair lock's grants here; before the fix it
    made under 0.02 times as many (a handful).
    """
    url = f"{redis_url}?max_connections=1"
    grants = {True: 0, False: 0}
    async with (
        aiodlock.connect(url, namespace="storm") as a,
        aiodlock.connect(url, namespace="storm") as b,
    ):
        # Interleaved, so that both kinds see the same machine; on until the unfair lock has
        # made enough grants for a ratio to mean something (a starved CI machine once let it
        # make 18 in the first two rounds), within ten rounds.
        for rounds in range(1, 11):
            for fair in (True, False):
                name = "fair" if fair else "unfair"
                grants[fair] += await _storm_for(0.8, (a, b), name, fair=fair)
            if rounds >= 2 and grants[False] >= 100:
                break
        await settle(a)
        await settle(b)
    # A tenth: a CI run with six workers on two cores measured 34 against 225 (0.15) once,
    # where a quiet machine gives 1.2; before the fix it was under 0.02.
    assert grants[True] * 10 >= grants[False], grants
    assert await _fair_leftovers(raw, "storm", "fair") == []


async def test_fair_queue_serves_patient_waiters_in_order_through_a_storm(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """Waiters that are not cancelled keep their arrival order while a storm of cancelled
    waiters joins and leaves the queue around them."""
    order: list[int] = []
    async with (
        aiodlock.connect(redis_url, namespace="patient") as a,
        aiodlock.connect(redis_url, namespace="patient") as b,
    ):
        holder = await a.lock("q", fair=True).acquire()
        stop = asyncio.Event()
        storm = asyncio.create_task(_storm((a, b), "q", fair=True, stop=stop, tasks=10))

        async def patient(i: int, lock: aiodlock.Lock) -> None:
            async with lock:
                order.append(i)

        waiters = []
        for i in range(6):
            lock = (a if i % 2 else b).lock("q", fair=True, timeout=10)
            waiters.append(asyncio.create_task(patient(i, lock)))
            await wait_until(partial(_queued, lock))
        await holder.release()
        await asyncio.gather(*waiters)
        stop.set()
        await storm
        await settle(a)
        await settle(b)
    assert order == list(range(6))
    assert await _fair_leftovers(raw, "patient", "q") == []


def test_password_never_shown() -> None:
    client = aiodlock.connect("redis://user:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in repr(client)
    assert "s3cret" not in repr(parse_url("redis://user:s3cret@h:1/0"))
    with pytest.raises(ValueError, match="wakeup") as info:
        aiodlock.connect("redis://user:s3cret@127.0.0.1:1/0?wakeup=carrier-pigeon")
    assert "s3cret" not in str(info.value)
    with pytest.raises(ValueError, match="unknown URL scheme") as info2:
        aiodlock.connect("bogus://user:s3cret@h")
    assert "s3cret" not in str(info2.value)


def test_several_hosts_name_nothing_that_does_not_exist() -> None:
    """The hint used to send users to a redlock:// scheme that no backend registers."""
    with pytest.raises(ValueError, match=r"takes one host, got 2.*redis\+sentinel://") as info:
        aiodlock.connect("redis://h1:6379,h2:6379/0")
    message = str(info.value)
    for scheme in re.findall(r"([\w+]+)://", message):
        assert scheme in schemes(), message


async def test_semaphore_limit_key_lives_exactly_as_long_as_the_permits(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """``T:sem:limit`` expires with ``T:sem`` (renewals move both), the last release deletes
    it, and a crashed holder's limit runs out with its permit: a new limit is accepted then."""
    sem, limit = "{semlimit:pool}:sem", "{semlimit:pool}:sem:limit"
    async with aiodlock.connect(redis_url, namespace="semlimit") as locks:
        first = await locks.semaphore("pool", limit=2, ttl=5).acquire()
        second = await locks.semaphore("pool", limit=2, ttl=60).acquire()
        assert await raw.get(limit) == b"2"
        assert await raw.pexpiretime(limit) == await raw.pexpiretime(sem)
        await second.release()  # the latest permit left: both now expire with the first
        assert await raw.pexpiretime(limit) == await raw.pexpiretime(sem)
        assert 0 < await raw.pttl(limit) <= 5000
        await first.release()
        assert await raw.exists(sem, limit) == 0
        crashed = await locks.semaphore("pool", limit=2, ttl=0.3).acquire()
        abandon(locks, crashed)  # never renewed, never released
        with pytest.raises(aiodlock.LimitMismatchError):
            await locks.semaphore("pool", limit=4).try_acquire()
        # The crashed permit's lease runs out, and its limit with it.
        await eventually(partial(_gone, raw, sem), timeout=5)
        assert await raw.exists(limit) == 0
        async with locks.semaphore("pool", limit=4, timeout=3) as lease:
            assert lease.fencing_token > crashed.fencing_token
            assert await raw.get(limit) == b"4"
    assert await raw.exists(sem, limit) == 0


# ---------------------------------------------------------------------- holder identities


@pytest.mark.parametrize(
    ("kind", "held", "ids"),
    [
        ("lock", "{named:k}", "{named:k}:ids"),
        ("write_lock", "{named:k}:writer", "{named:k}:writer:ids"),
        ("read_lock", "{named:k}:readers", "{named:k}:readers:ids"),
        ("semaphore", "{named:k}:sem", "{named:k}:sem:ids"),
    ],
)
async def test_a_holders_identity_lives_exactly_as_long_as_its_lease(
    redis_url: str, raw: aioredis.Redis, kind: str, held: str, ids: str
) -> None:
    """``KEY:ids`` names each holder's identity, expires with the key it holds (a renewal
    moves both) and goes with the release: nothing outlives the holder."""
    async with aiodlock.connect(redis_url, namespace="named", identity="web 1/é") as locks:
        extra = {"limit": 2} if kind == "semaphore" else {}
        lease = await getattr(locks, kind)("k", ttl=5, **extra).acquire()
        assert await raw.hgetall(ids) == {lease.owner.encode(): "web 1/é".encode()}
        # Set by two commands of one script: the server's clock may tick 1 ms between them.
        assert abs(await raw.pexpiretime(ids) - await raw.pexpiretime(held)) <= 1
        await lease.extend(60)
        assert abs(await raw.pexpiretime(ids) - await raw.pexpiretime(held)) <= 1
        assert 5000 < await raw.pttl(ids) <= 60_000
        await lease.release()
        assert await raw.exists(held, ids) == 0


async def test_a_fair_release_hands_the_lock_over_with_the_heads_identity(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """A fair release that hands the lock to the head of the queue (another client, which
    runs no command to take it) names the head's identity, kept while it queued."""
    async with (
        aiodlock.connect(redis_url, namespace="fairid", identity="first") as a,
        aiodlock.connect(redis_url, namespace="fairid", identity="second") as b,
    ):
        holder = await a.lock("k", fair=True, ttl=30).acquire()
        waiting = asyncio.create_task(b.lock("k", fair=True, ttl=30).acquire(timeout=20))
        await eventually(lambda: _in_queue(raw, "{fairid:k}", 1))
        await holder.release()
        lease = await waiting
        (info,) = await a.inspect("k")
        assert [(h.owner, h.identity) for h in info.holders] == [(lease.owner, "second")]
        assert await raw.exists("{fairid:k}:queue:ids") == 0  # it left the queue
        await lease.release()
    assert await raw.exists("{fairid:k}:ids") == 0


async def test_a_holder_granted_by_an_older_client_has_no_identity(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """Keys written by an aiodlock that stored no identity are still inspected, with
    ``identity=None``."""
    await raw.set("{older:m}", "old-owner", px=10_000)
    await raw.zadd("{older:r}:readers", {"old-reader": 2**50})
    await raw.pexpire("{older:r}:readers", 10_000)
    async with aiodlock.connect(redis_url, namespace="older") as locks:
        infos = await locks.inspect()
        assert [(i.name, [(h.owner, h.identity) for h in i.holders]) for i in infos] == [
            ("m", [("old-owner", None)]),
            ("r", [("old-reader", None)]),
        ]
    await raw.delete("{older:m}", "{older:r}:readers")


async def test_an_expired_members_identity_goes_when_it_is_purged(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """A crashed reader's identity is dropped with its member by the next grant's purge, so
    the hash of a read lock held without a break never grows with the dead."""
    async with aiodlock.connect(redis_url, namespace="purgeid") as locks:
        crashed = await locks.read_lock("k", ttl=0.2).acquire()
        abandon(locks, crashed)  # never renewed, never released
        live = await locks.read_lock("k", ttl=30).acquire()
        await eventually(partial(_lapsed, raw, "{purgeid:k}:readers", crashed.owner))
        async with locks.read_lock("k", ttl=30) as other:
            owners = await raw.hkeys("{purgeid:k}:readers:ids")
            assert sorted(owners) == sorted([live.owner.encode(), other.owner.encode()])
        await live.release()
    assert await raw.exists("{purgeid:k}:readers", "{purgeid:k}:readers:ids") == 0


async def _lapsed(raw: aioredis.Redis, zset: str, member: str) -> bool:
    """Whether ``member``'s lease in ``zset`` has ended by the server's clock."""
    score = await raw.zscore(zset, member)
    seconds, micros = await raw.time()
    return score is not None and score < seconds * 1000 + micros // 1000


async def test_namespaces_name_held_and_waited_ones_only(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """``namespaces()`` names a namespace with a holder or a fair waiter; a fencing counter
    left behind, or a key of another application that starts with ``{``, names none."""
    await raw.set("{fenceonly:k}:fence", "7", px=10_000)
    await raw.set("{notours}", "x", px=10_000)
    await raw.set("{bad{ns:k}", "x", px=10_000)
    async with (
        aiodlock.connect(redis_url, namespace="nsheld") as held,
        aiodlock.connect(redis_url, namespace="nswaited") as waited,
    ):
        lease = await held.lock("k", fair=True, ttl=30).acquire()
        other = await waited.lock("k", fair=True, ttl=30).acquire()
        waiting = asyncio.create_task(held.lock("k", fair=True).acquire(timeout=20))
        await eventually(lambda: _in_queue(raw, "{nsheld:k}", 1))
        await lease.release()  # handed to the waiter: nsheld is still in use
        found = await held.namespaces()
        assert {"nsheld", "nswaited"} <= set(found)
        assert not {"fenceonly", "notours", "bad{ns", "bad"} & set(found)
        assert found == sorted(found)
        await (await waiting).release()
        await other.release()
    await raw.delete("{fenceonly:k}:fence", "{notours}", "{bad{ns:k}")
