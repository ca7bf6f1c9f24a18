"""Leader election, ``@locks.exclusive`` and ``locks.periodic``: on ``memory://`` for the
logic, on a real Redis with independent clients, and with three candidate processes."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

import aiodlock
from aiodlock.backends import Breaker, Kind, LockSpec, Noticeboard
from aiodlock.testing import History, Hold
from aiodlock.testing.conformance import SLACK_TTL
from tests.test_examples import ROOT, run, succeeded


def store() -> str:
    return f"memory://leader-{os.urandom(4).hex()}"


async def break_lock(locks: aiodlock.LockClient, name: str) -> None:
    """What an operator's force-release does (the memory backend's BREAK capability)."""
    backend = locks.backend
    assert isinstance(backend, Breaker)
    assert await backend.break_lock(LockSpec(locks.namespace, name, Kind.MUTEX)) == 1


@dataclass
class Candidates:
    """Candidates of one election, each on its own client; ``leads`` reports each new term."""

    url: str
    name: str
    ttl: float = 0.6
    history: History = field(default_factory=History)
    leads: asyncio.Queue[tuple[str, int]] = field(default_factory=asyncio.Queue)
    losses: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    clients: dict[str, aiodlock.LockClient] = field(default_factory=dict)

    async def campaign(self, identity: str, namespace: str) -> None:
        async with aiodlock.connect(self.url, namespace=namespace, ttl=self.ttl) as locks:
            self.clients[identity] = locks
            async for term in locks.election(self.name, identity=identity):
                async with term:
                    with self.history.hold(identity, term.fencing_token):
                        self.leads.put_nowait((identity, term.fencing_token))
                        try:
                            await asyncio.Event().wait()
                        except asyncio.CancelledError:
                            if not term.lease.held:
                                self.losses.put_nowait(identity)
                            raise


@asynccontextmanager
async def candidates(url: str, count: int) -> AsyncIterator[Candidates]:
    namespace = f"el{os.urandom(4).hex()}"
    group = Candidates(url, "scheduler")
    tasks = [asyncio.create_task(group.campaign(f"node-{i}", namespace)) for i in range(count)]
    async with aiodlock.connect(url, namespace=namespace) as observer:
        group.clients["observer"] = observer
        try:
            yield group
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------------- memory: the logic


@pytest.mark.memory
async def test_one_term_with_async_with_and_who_leads() -> None:
    async with aiodlock.connect(store()) as locks:
        election = locks.election("scheduler", identity="web-1")
        assert await election.who_leads() is None
        async with election as term:
            assert term.identity == "web-1"
            assert term.lease.held
            assert await locks.election("scheduler").who_leads() == "web-1"
            first = term.fencing_token
        assert await election.who_leads() is None
        async with election as term:
            assert term.fencing_token > first


@pytest.mark.memory
async def test_the_leaders_note_is_refreshed_by_a_task_of_the_clients_group() -> None:
    # Not a bare task of the caller's: the client's group owns it, and the term ends it.
    def publishers() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if t.get_name() == "aiodlock-leader-scheduler"]

    async with aiodlock.connect(store()) as locks:
        async with locks.election("scheduler", identity="web-1"):
            assert len(publishers()) == 1
        assert publishers() == []  # cancelled and awaited by the term's end


@pytest.mark.memory
async def test_the_default_identity_is_host_and_pid() -> None:
    async with aiodlock.connect(store()) as locks:
        election = locks.election("scheduler")
        assert election.identity.endswith(f":{os.getpid()}")
        async with election:
            assert await election.who_leads() == election.identity


@pytest.mark.memory
async def test_a_lost_term_raises_lock_lost_error_from_async_with() -> None:
    # A term that outlives a late renewal: lost to the break, not to the machine's load.
    async with aiodlock.connect(store(), ttl=SLACK_TTL) as locks:
        election = locks.election("scheduler")
        finished = False
        with pytest.raises(aiodlock.LockLostError):
            async with election:
                await break_lock(locks, "scheduler")
                await asyncio.Event().wait()
                finished = True
        assert not finished
        assert await election.who_leads() is None


@pytest.mark.memory
async def test_async_for_campaigns_again_after_a_loss() -> None:
    # Terms that outlive a late renewal: lost to the break, not to the machine's load.
    async with aiodlock.connect(store(), ttl=SLACK_TTL) as locks:
        tokens: list[int] = []
        async for term in locks.election("scheduler"):
            async with term:
                tokens.append(term.fencing_token)
                if len(tokens) == 3:
                    break  # a clean end resigns
                await break_lock(locks, "scheduler")
                await asyncio.Event().wait()  # cancelled by the loss; the loop goes on
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        assert locks.statistics().leases == 0


@pytest.mark.memory
async def test_only_one_of_three_candidates_leads_and_failover_on_close() -> None:
    async with candidates(store(), 3) as group:
        observer = group.clients["observer"].election("scheduler")
        seen = []
        for _ in range(3):
            leader, _ = await group.leads.get()
            assert await observer.who_leads() == leader
            seen.append(leader)
            await group.clients[leader].aclose()  # the leader goes away: the next one leads
        assert sorted(seen) == ["node-0", "node-1", "node-2"]
        assert await observer.who_leads() is None
    group.history.check(max_holders=1)
    assert len(group.history.holds) >= 3


@pytest.mark.memory
async def test_run_returns_the_result_and_resigns() -> None:
    async with aiodlock.connect(store()) as locks:
        election = locks.election("once", identity="me")

        async def job(x: int) -> int:
            assert await election.who_leads() == "me"
            return x * 2

        assert await election.run(job, 21) == 42
        assert await election.who_leads() is None


@pytest.mark.memory
async def test_election_arguments_are_checked() -> None:
    async with aiodlock.connect(store()) as locks:
        with pytest.raises(ValueError, match="name must not be empty"):
            locks.election("")
        with pytest.raises(ValueError, match="identity must not be empty"):
            locks.election("x", identity="")
        with pytest.raises(ValueError, match="ttl must be"):
            locks.election("x", ttl=-1)
        election = locks.election("x")
        with pytest.raises(TypeError, match="async function"):
            await election.run(print)  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="not leading"):
            election.term().lease  # noqa: B018


# ---------------------------------------------------------------------- exclusive


@pytest.mark.memory
async def test_exclusive_names_the_lock_from_the_arguments() -> None:
    async with aiodlock.connect(store()) as locks:
        history = History()
        seen: list[str] = []

        @locks.exclusive("report:{day}:{kind}", timeout=5)
        async def build(day: str, *, kind: str = "daily") -> str:
            with history.hold(f"{day}:{kind}", len(history.holds)):
                seen.append(day)
                await asyncio.sleep(0.01)
            return day

        assert build.__name__ == "build"
        results = await asyncio.gather(*(build("mon") for _ in range(5)), build("tue"))
        assert results == ["mon"] * 5 + ["tue"]
        mondays = History([h for h in history.holds if h.holder == "mon:daily"])
        mondays.check(max_holders=1)
        # "tue" is another lock: it ran alongside the Mondays.
        assert history.max_concurrency() == 2


@pytest.mark.memory
async def test_exclusive_holds_the_lock_and_times_out() -> None:
    async with aiodlock.connect(store()) as locks:

        @locks.exclusive("job:{n}", timeout=0.05)
        async def job(n: int) -> int:
            return n

        async with locks.lock("job:7"):
            with pytest.raises(aiodlock.LockTimeoutError):
                await asyncio.create_task(job(7))
        assert await job(7) == 7


@pytest.mark.memory
async def test_exclusive_refuses_a_bad_template_when_decorating() -> None:
    async with aiodlock.connect(store()) as locks:

        async def build(day: str) -> None: ...

        with pytest.raises(ValueError, match=r"\{date\} is not a parameter of .*build"):
            locks.exclusive("report:{date}")(build)
        with pytest.raises(ValueError, match="not a plain name"):
            locks.exclusive("report:{0}")
        with pytest.raises(TypeError, match="async function"):
            locks.exclusive("x")(print)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout must be"):
            locks.exclusive("x", timeout=-1)

        @locks.exclusive("report:{day}")
        async def loose(**kwargs: Any) -> None: ...

        await loose(day="mon")
        with pytest.raises(KeyError, match=r"have no value for \{day\}"):
            await loose(date="mon")


# ---------------------------------------------------------------------- periodic


@pytest.mark.memory
async def test_periodic_runs_on_exactly_one_instance_and_fails_over() -> None:
    url = store()
    runs: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    clients: dict[str, aiodlock.LockClient] = {}
    failed = False

    async def job(who: str) -> None:
        nonlocal failed
        runs.put_nowait((who, asyncio.get_running_loop().time()))
        if not failed:
            failed = True
            raise RuntimeError("a failing run is logged; the schedule goes on")

    async def instance(who: str) -> None:
        # a's term outlives a late renewal: b takes over when a leaves, not before.
        async with aiodlock.connect(url, ttl=SLACK_TTL) as locks:
            clients[who] = locks
            await locks.periodic("cleanup", job, who, every=0.05, identity=who)

    a = asyncio.create_task(instance("a"))
    assert (await runs.get())[0] == "a"
    b = asyncio.create_task(instance("b"))
    first = [await runs.get() for _ in range(4)]
    assert {who for who, _ in first} == {"a"}  # b waits its turn
    await clients["a"].aclose()  # a leaves: b takes over
    later = [await runs.get() for _ in range(6)]
    taken_over = [t for who, t in later if who == "b"]
    assert len(taken_over) >= 4
    assert all(after - before >= 0.045 for before, after in itertools.pairwise(taken_over))
    for task in (a, b):
        task.cancel()
    await asyncio.gather(a, b, return_exceptions=True)


@pytest.mark.memory
async def test_periodic_checks_its_arguments() -> None:
    async with aiodlock.connect(store()) as locks:

        async def job() -> None: ...

        with pytest.raises(ValueError, match="every must be > 0"):
            await locks.periodic("x", job, every=0)
        with pytest.raises(TypeError, match="async function"):
            await locks.periodic("x", print, every=1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- Redis


@pytest.mark.redis
async def test_redis_one_leader_at_a_time_across_three_clients(redis_url: str) -> None:
    async with candidates(redis_url, 3) as group:
        observer = group.clients["observer"].election("scheduler")
        seen = []
        for _ in range(3):
            leader, _ = await group.leads.get()
            assert await observer.who_leads() == leader
            seen.append(leader)
            await group.clients[leader].aclose()
        assert sorted(seen) == ["node-0", "node-1", "node-2"]
    group.history.check(max_holders=1)


@pytest.mark.redis
async def test_redis_a_broken_lease_cancels_the_leader_and_another_term_begins(
    redis_url: str,
) -> None:
    import redis.asyncio as redis

    async with candidates(redis_url, 2) as group, redis.Redis.from_url(redis_url) as plain:
        observer = group.clients["observer"]
        leader, token = await group.leads.get()
        key = f"{{{observer.namespace}:scheduler}}"
        assert await plain.delete(key) == 1  # an operator breaks the leader's lock
        successor, newer = await group.leads.get()
        assert newer > token
        assert await group.losses.get() == leader  # told at its next renewal
        assert await observer.election("scheduler").who_leads() in {successor, None}
    # The broken leader learned of it at its next renewal: tokens still order the terms.
    ordered = sorted(group.history.holds, key=lambda h: h.start)
    assert [h.token for h in ordered] == sorted(h.token for h in ordered)


@pytest.mark.redis
async def test_redis_three_candidate_processes_fail_over(redis_url: str) -> None:
    """Three processes campaign; the leader is SIGKILLed (its lease expires), then the next
    one's lock is deleted under it (it is told, and campaigns again). One leader at a time."""
    namespace = f"elp{os.urandom(4).hex()}"
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    processes = {}
    for i in range(3):
        identity = f"proc-{i}"
        processes[identity] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.leader_candidate",
            redis_url,
            namespace,
            "scheduler",
            identity,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )

    async def read(process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for line in process.stdout:
            events.put_nowait(json.loads(line))

    readers = [asyncio.create_task(read(p)) for p in processes.values()]
    holds: list[Hold] = []
    try:
        async with (
            asyncio.timeout(60),
            aiodlock.connect(redis_url, namespace=namespace) as observer,
        ):
            election = observer.election("scheduler")
            first = await events.get()
            assert first["event"] == "lead"
            assert await election.who_leads() == first["identity"]
            killed_at = asyncio.get_running_loop().time()
            processes[first["identity"]].send_signal(signal.SIGKILL)
            second = await events.get()
            assert second["event"] == "lead" and second["identity"] != first["identity"]
            assert second["token"] > first["token"]
            assert second["at"] >= killed_at
            holds.append(Hold(first["identity"], first["token"], first["at"], killed_at))
            assert await election.who_leads() == second["identity"]

            import redis.asyncio as redis

            async with redis.Redis.from_url(redis_url) as plain:
                assert await plain.delete(f"{{{namespace}:scheduler}}") == 1
            later = [await events.get(), await events.get()]  # the loss and the next term
            lost = next(e for e in later if e["event"] == "lost")
            third = next(e for e in later if e["event"] == "lead")
            assert lost["identity"] == second["identity"]
            assert third["token"] > second["token"]
    finally:
        for process in processes.values():
            if process.returncode is None:
                process.terminate()
        for process in processes.values():
            await process.wait()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    History(holds).check(max_holders=1)
    assert [p.returncode for p in processes.values()].count(-signal.SIGKILL) == 1


# ---------------------------------------------------------------------- examples


@pytest.mark.memory
@pytest.mark.parametrize("example", ["leader.py", "exclusive.py", "periodic.py"])
def test_worker_examples_run(example: str) -> None:
    assert "OK" in succeeded(run(f"examples/{example}"))


@pytest.mark.redis
@pytest.mark.parametrize("example", ["leader.py", "exclusive.py", "periodic.py"])
def test_worker_examples_run_on_redis(example: str, redis_url: str) -> None:
    assert "OK" in succeeded(run(f"examples/{example}", url=redis_url))


# ---------------------------------------------------------------------- the noticeboard


async def check_noticeboard(url: str) -> None:
    """A note is shown only while its poster holds the mutex; a stranger cannot post."""
    namespace = f"nb{os.urandom(4).hex()}"
    async with (
        aiodlock.connect(url, namespace=namespace) as first,
        aiodlock.connect(url, namespace=namespace) as second,
    ):
        board = first.backend
        assert isinstance(board, Noticeboard)
        spec = LockSpec(namespace, "n", Kind.MUTEX)
        assert await board.read_note(spec) is None
        lease = await first.lock("n").acquire()
        assert await board.post_note(spec, "0123abcd", "stranger", 5) is False
        assert await board.read_note(spec) is None
        assert await board.post_note(spec, lease.owner, "first:1 ünïcode\nline", 5) is True
        assert await board.read_note(spec) == "first:1 ünïcode\nline"
        await lease.release()
        assert await board.read_note(spec) is None  # released: the note is not shown
        newer = await second.lock("n").acquire()
        assert await board.read_note(spec) is None  # the new holder posted nothing yet
        assert await board.post_note(spec, lease.owner, "stale", 5) is False
        await newer.release()


@pytest.mark.memory
async def test_noticeboard_on_memory() -> None:
    await check_noticeboard(store())


@pytest.mark.redis
async def test_noticeboard_on_redis(redis_url: str) -> None:
    await check_noticeboard(redis_url)


@pytest.mark.redis
async def test_who_leads_with_an_apps_client_that_decodes_responses(redis_url: str) -> None:
    import redis.asyncio as redis

    async with (
        redis.Redis.from_url(redis_url, decode_responses=True) as app_client,
        aiodlock.connect("redis://", redis_client=app_client, namespace="nbdec") as locks,
    ):
        election = locks.election("scheduler", identity="décodé")
        async with election:
            assert await election.who_leads() == "décodé"
