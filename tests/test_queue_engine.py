"""The queue engine (``aiodlock.backends.queue``): the recipe's verdicts, property-tested,
and the lease bookkeeping the session backends share."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given, settings, strategies as st

from aiodlock.backends import Kind
from aiodlock.backends.queue import REAPED, Contender, Holding, Leases, evaluate, holders

pytestmark = pytest.mark.memory

Queue = list[Contender[str]]
# No example database (the run leaves nothing in the working tree), no deadline (a loaded
# machine is slow), and enough examples that a watch one wake-up short is found every run.
thorough = settings(database=None, deadline=None, max_examples=300)


def _queue(kinds: list[tuple[Kind, int]]) -> Queue:
    return [Contender(10 + 3 * i, kind, limit, f"c{i}") for i, (kind, limit) in enumerate(kinds)]


_mutexes = st.lists(st.just((Kind.MUTEX, 0)), min_size=1, max_size=10)
_read_write = st.lists(st.sampled_from([(Kind.READ, 0), (Kind.WRITE, 0)]), min_size=1, max_size=10)
_semaphores = st.integers(1, 4).flatmap(
    lambda limit: st.lists(st.just((Kind.SEMAPHORE, limit)), min_size=1, max_size=10)
)
# One family each: a directory holds one family's contenders, one limit per semaphore.
uniform = st.one_of(_mutexes, _read_write, _semaphores).map(_queue)
mixed_limits = st.lists(
    st.tuples(st.just(Kind.SEMAPHORE), st.integers(1, 4)), min_size=1, max_size=10
).map(_queue)


def _granted(queue: Queue, *, chained: bool = False) -> list[Contender[str]]:
    return [c for c in queue if evaluate(queue, c.id, chained=chained).granted]


def _without(queue: Queue, *gone: str) -> Queue:
    return [c for c in queue if c.id not in gone]


@thorough
@given(uniform, st.booleans())
def test_at_most_one_writer_and_at_most_limit_holders(queue: Queue, chained: bool) -> None:
    granted = _granted(queue, chained=chained)
    kinds = {c.kind for c in granted}
    if Kind.WRITE in kinds or Kind.MUTEX in kinds:
        assert len(granted) == 1
    if Kind.SEMAPHORE in kinds:
        assert len(granted) <= queue[0].limit


@thorough
@given(uniform, st.booleans())
def test_the_granted_set_is_a_non_empty_prefix_and_is_what_holders_lists(
    queue: Queue, chained: bool
) -> None:
    granted = _granted(queue, chained=chained)
    assert granted == queue[: len(granted)]
    assert granted, "the head of a queue is always granted"
    assert holders(queue) == granted
    for contender in granted:
        verdict = evaluate(queue, contender.id, chained=chained)
        assert verdict.successor == (contender is not queue[-1])


@thorough
@given(uniform, st.booleans())
def test_every_waiter_watches_a_contender_ahead_of_it(queue: Queue, chained: bool) -> None:
    for index, contender in enumerate(queue):
        verdict = evaluate(queue, contender.id, chained=chained)
        if verdict.granted:
            assert verdict.watch is None and not verdict.ahead
            continue
        assert verdict.conflict is None
        if verdict.ahead:
            assert contender.kind is Kind.SEMAPHORE and verdict.watch is None
        else:
            ahead = [c.id for c in queue[:index]]
            assert verdict.watch in ahead
            assert verdict.behind_head == (contender.kind is not Kind.READ and index == 1)


@thorough
@given(uniform, st.booleans(), st.data())
def test_no_wakeup_is_lost(queue: Queue, chained: bool, data: st.DataObject) -> None:
    """Whatever one deletion does to a waiter's verdict, the waiter hears of it: it watched
    that contender, or every contender ahead, or (chained) its predecessor got a permit and
    touches its entry."""
    index = data.draw(st.integers(0, len(queue) - 1))
    waiter = queue[index]
    before = evaluate(queue, waiter.id, chained=chained)
    for gone in queue:
        if gone is waiter:
            continue
        rest = _without(queue, gone.id)
        after = evaluate(rest, waiter.id, chained=chained)
        if (after.granted, after.watch, after.ahead) == (
            before.granted,
            before.watch,
            before.ahead,
        ):
            continue
        assert not before.granted, "a deletion never takes a grant away"
        assert queue.index(gone) < index, "contenders behind a waiter never change its place"
        predecessor = queue[index - 1]
        touched = (
            chained
            and predecessor is not gone
            and not evaluate(queue, predecessor.id, chained=True).granted
            and evaluate(rest, predecessor.id, chained=True).granted
        )
        assert gone.id == before.watch or before.ahead or touched


@thorough
@given(uniform, st.booleans())
def test_removing_the_holders_grants_the_next(queue: Queue, chained: bool) -> None:
    while queue:
        granted = _granted(queue, chained=chained)
        assert granted
        queue = _without(queue, *(c.id for c in granted))


@thorough
@given(uniform, st.booleans())
def test_deleting_the_watched_contender_moves_the_waiter_on(queue: Queue, chained: bool) -> None:
    for index, contender in enumerate(queue):
        verdict = evaluate(queue, contender.id, chained=chained)
        if verdict.granted:
            continue
        if verdict.ahead:
            # Enough deletions ahead (any of them) grant it.
            need = index - contender.limit + 1
            rest = _without(queue, *(c.id for c in queue[:need]))
            assert evaluate(rest, contender.id, chained=chained).granted
        else:
            assert verdict.watch is not None
            after = evaluate(_without(queue, verdict.watch), contender.id, chained=chained)
            assert after.granted or after.watch != verdict.watch


@thorough
@given(uniform, st.data())
def test_leaving_contenders_count_as_gone(queue: Queue, data: st.DataObject) -> None:
    leaving = data.draw(st.sets(st.sampled_from([c.id for c in queue])))
    for contender in queue:
        expected = evaluate(_without(queue, *(leaving - {contender.id})), contender.id)
        assert evaluate(queue, contender.id, leaving=leaving) == expected


@thorough
@given(mixed_limits, st.booleans())
def test_semaphore_holders_share_one_limit_and_respect_it(queue: Queue, chained: bool) -> None:
    granted = _granted(queue, chained=chained)
    limits = {c.limit for c in granted}
    assert len(limits) <= 1
    if limits:
        assert len(granted) <= limits.pop()
    for index, contender in enumerate(queue):
        verdict = evaluate(queue, contender.id, chained=chained)
        others = [c.limit for c in queue[:index] if c.limit != contender.limit]
        assert verdict.conflict == (others[0] if others else None)


@settings(database=None, deadline=None, max_examples=50)
@given(st.integers(1, 5), st.integers(0, 5))
def test_chained_semaphore_waiters_past_the_first_watch_their_predecessor(
    limit: int, extra: int
) -> None:
    queue = _queue([(Kind.SEMAPHORE, limit)] * (limit + 1 + extra))
    for index in range(limit, len(queue)):
        chained = evaluate(queue, f"c{index}", chained=True)
        plain = evaluate(queue, f"c{index}")
        assert plain.ahead and plain.watch is None
        if index == limit:
            assert chained.ahead
        else:
            assert chained.watch == f"c{index - 1}" and not chained.ahead


def test_examples() -> None:
    queue = _queue([(Kind.READ, 0), (Kind.WRITE, 0), (Kind.READ, 0), (Kind.WRITE, 0)])
    assert [evaluate(queue, c.id).granted for c in queue] == [True, False, False, False]
    assert evaluate(queue, "c2").watch == "c1"
    assert evaluate(queue, "c3").watch == "c2"
    assert holders([]) == []
    # A contender that records no limit (0) conflicts with none ahead of it.
    assert evaluate(_queue([(Kind.SEMAPHORE, 0), (Kind.SEMAPHORE, 2)]), "c1").granted


# ---------------------------------------------------------------------- leases


class _Entry(Holding):
    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key


def _leases(events: list[str]) -> Leases[_Entry]:
    return Leases(
        logging.getLogger("aiodlock.test"),
        name=lambda entry: f"entry {entry.key}",
        on_lost=lambda entry: events.append(f"lost {entry.key} set={entry.lost_event.is_set()}"),
        on_reaped=lambda entry: events.append(f"reaped {entry.key}"),
    )


async def test_the_reaper_ends_an_unrenewed_lease(caplog: pytest.LogCaptureFixture) -> None:
    events: list[str] = []
    leases = _leases(events)
    entry = _Entry("a")
    entry.held = True
    leases.schedule_reaper(entry, 0.01)
    first = entry.reaper
    leases.schedule_reaper(entry, 0.05)  # a renewal: the first deadline no longer counts
    assert first is not None and first.cancelled()
    await asyncio.wait_for(entry.lost_event.wait(), 5)
    assert (entry.lost, entry.reaper) == (REAPED, None)
    assert events == ["lost a set=False", "reaped a"]  # on_lost runs before the signal
    assert leases.losses == 1
    assert f"lost entry a: {REAPED}" in caplog.text


async def test_a_released_or_unscheduled_entry_is_not_reaped() -> None:
    events: list[str] = []
    leases = _leases(events)
    released, cancelled = _Entry("a"), _Entry("b")
    released.held = cancelled.held = True
    leases.schedule_reaper(released, 0.01)
    released.gone = True
    leases.schedule_reaper(cancelled, 0.01)
    leases.cancel_reaper(cancelled)
    await asyncio.sleep(0.05)
    assert (released.lost, cancelled.lost, cancelled.reaper, events) == (None, None, None, [])


async def test_a_lease_is_lost_once() -> None:
    events: list[str] = []
    leases = _leases(events)
    held, waiting, other = _Entry("a"), _Entry("b"), _Entry("c")
    held.held = other.held = True
    leases.schedule_reaper(held, 10)
    entries = [held, waiting, other]
    marked = leases.mark_all_lost(entries, "the session ended", lambda e: e is not other)
    assert marked == [held] and held.lost == "the session ended" and held.reaper is None
    assert not leases.mark_lost(held, "again") and held.lost == "the session ended"
    assert waiting.lost is None and other.lost is None and leases.losses == 1


class _Clock:
    """A grace watch's session: its deadline, and an event per lapse."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.lapses = 0
        self.lapsed = asyncio.Event()

    def lapse(self) -> None:
        self.lapses += 1
        self.lapsed.set()


async def test_the_grace_watch_lapses_once_per_silence() -> None:
    loop = asyncio.get_running_loop()
    leases: Leases[_Entry] = Leases(logging.getLogger("aiodlock.test"), name=str)
    clock = _Clock(loop.time() + 0.02)
    resume = asyncio.Event()
    task = loop.create_task(leases.watch_grace(lambda: clock.deadline, clock.lapse, resume=resume))
    try:
        await asyncio.wait_for(clock.lapsed.wait(), 5)
        clock.lapsed.clear()
        await asyncio.sleep(0.05)
        assert clock.lapses == 1  # silent since: it waits for the service to answer again
        clock.deadline = loop.time() + 0.02
        resume.set()
        await asyncio.wait_for(clock.lapsed.wait(), 5)
        assert clock.lapses == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_grace_watch_without_a_session_or_a_resume_event_polls() -> None:
    loop = asyncio.get_running_loop()
    leases: Leases[_Entry] = Leases(logging.getLogger("aiodlock.test"), name=str)
    clock = _Clock(None)

    def lapse() -> None:
        clock.lapse()
        clock.deadline = None  # the session ended: nothing to watch until the next

    task = loop.create_task(leases.watch_grace(lambda: clock.deadline, lapse, poll=lambda: 0.01))
    try:
        await asyncio.sleep(0.05)
        assert clock.lapses == 0
        clock.deadline = loop.time() + 0.02
        await asyncio.wait_for(clock.lapsed.wait(), 5)
        await asyncio.sleep(0.05)
        assert clock.lapses == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
