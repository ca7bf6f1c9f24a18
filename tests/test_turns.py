"""The local turn of one lock among the tasks of one client.

Tasks of one client contend at the service one at a time, in arrival order: the turn passes
straight from the task that is done with it to the first task still waiting, and a task
cancelled before or after the turn reaches it never keeps it from the tasks behind. On the
memory backend (a product backend, with the same core as every other).
"""

from __future__ import annotations

import asyncio

import pytest

import aiodlock

pytestmark = pytest.mark.memory


async def _queue_up(
    lock: aiodlock.Lock, count: int, body: object = None
) -> tuple[list[int], list[asyncio.Task[None]]]:
    """``count`` tasks entering ``lock`` one after the other (arrival order = index)."""
    order: list[int] = []

    async def worker(i: int) -> None:
        async with lock:
            order.append(i)
            if callable(body):
                body(i)
            await asyncio.sleep(0)

    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(worker(i)))
        await asyncio.sleep(0)  # let it queue: arrival order is creation order
    return order, tasks


@pytest.mark.asyncio
async def test_tasks_of_one_client_are_granted_in_the_order_they_asked() -> None:
    async with aiodlock.connect("memory://") as locks:
        lock = locks.lock("fifo")
        holder = await lock.acquire()
        order, tasks = await _queue_up(lock, 10)
        await holder.release()
        await asyncio.gather(*tasks)
        assert order == list(range(10))


@pytest.mark.asyncio
async def test_a_task_cancelled_while_waiting_for_its_turn_leaves_the_queue() -> None:
    async with aiodlock.connect("memory://") as locks:
        lock = locks.lock("cancel-waiting")
        holder = await lock.acquire()
        order, tasks = await _queue_up(lock, 4)
        tasks[2].cancel()  # waiting for its turn behind 0 and 1
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 2)
        assert order == [0, 1, 3]
        assert tasks[2].cancelled()
        assert lock.statistics().waiting == 0


@pytest.mark.asyncio
async def test_a_task_cancelled_after_its_turn_came_passes_it_on() -> None:
    async with aiodlock.connect("memory://") as locks:
        lock = locks.lock("cancel-handed")
        holder = await lock.acquire()
        tasks: list[asyncio.Task[None]] = []

        def cancel_the_next(i: int) -> None:
            # Task 0 was granted: the turn went to task 1 as task 0 stopped contending, and
            # task 1 has not run since. Cancelled now, it must hand the turn to task 2.
            if i == 0:
                tasks[1].cancel()

        order, queued = await _queue_up(lock, 3, cancel_the_next)
        tasks.extend(queued)
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 2)
        assert order == [0, 2]
        assert tasks[1].cancelled()
        # Nothing is left behind: the lock is free for anyone.
        lease = await lock.acquire(timeout=1)
        await lease.release()
