"""A reader/writer lock: many readers together, or one writer alone.

Six readers show the catalog while two writers update its prices, all under the lock named
"catalog": ``locks.read_lock("catalog")`` is shared with other readers, and
``locks.write_lock("catalog")`` excludes readers and writers alike. The program records who
was inside at every moment and prints the most readers seen together and whether a writer
ever overlapped anyone.

It also shows that a name holds independent lock families: ``locks.lock("catalog")`` is a
different lock from the reader/writer pair, so it can be taken while the write lock is held.

Run it::

    python examples/rwlock.py
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/rwlock.py

It exits 0 when readers shared the lock, no writer overlapped anyone and every update
landed, and 1 otherwise.
"""

from __future__ import annotations

import asyncio
import os
import sys

import aiodlock

URL = os.environ.get("AIODLOCK_URL", "memory://")
READERS = 6
WRITERS = 2


class Catalog:
    """The shared resource, instrumented to catch a reader/writer overlap."""

    def __init__(self) -> None:
        self.version = 0
        self.readers = 0
        self.writers = 0
        self.most_readers = 0
        self.overlaps = 0

    def _check(self) -> None:
        if self.writers > 1 or (self.writers and self.readers):
            self.overlaps += 1

    async def show(self) -> int:
        self.readers += 1
        self.most_readers = max(self.most_readers, self.readers)
        self._check()
        try:
            await asyncio.sleep(0.05)
            return self.version
        finally:
            self.readers -= 1

    async def update_prices(self) -> None:
        self.writers += 1
        self._check()
        try:
            seen = self.version
            await asyncio.sleep(0.02)
            self.version = seen + 1  # read-modify-write: only safe alone
        finally:
            self.writers -= 1


async def reader(locks: aiodlock.LockClient, catalog: Catalog) -> None:
    async with locks.read_lock("catalog", timeout=10):
        await catalog.show()


async def writer(locks: aiodlock.LockClient, catalog: Catalog) -> bool:
    """Update the catalog; True if the plain lock "catalog" was free meanwhile."""
    async with locks.write_lock("catalog", timeout=10):
        other_family = await locks.lock("catalog").try_acquire()
        if other_family is not None:
            await other_family.release()
        await catalog.update_prices()
    return other_family is not None


async def main() -> int:
    catalog = Catalog()
    async with (
        aiodlock.connect(URL, namespace="rwlock-example") as locks,
        asyncio.TaskGroup() as group,
    ):
        for _ in range(READERS // 2):
            group.create_task(reader(locks, catalog))
        writers = [group.create_task(writer(locks, catalog)) for _ in range(WRITERS)]
        for _ in range(READERS - READERS // 2):
            group.create_task(reader(locks, catalog))
    independent = all(task.result() for task in writers)
    print(f"{READERS} readers, {WRITERS} writers on 'catalog'")
    print(f"most readers inside at once: {catalog.most_readers}")
    print(f"writer overlapped a reader or a writer: {catalog.overlaps} times")
    print(f"catalog version after the writers: {catalog.version} (expected {WRITERS})")
    print(f"locks.lock('catalog') free while the write lock was held: {independent}")
    ok = (
        catalog.most_readers > 1
        and catalog.overlaps == 0
        and catalog.version == WRITERS
        and independent
    )
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
