"""Two processes increment one ZooKeeper counter node: with a lock, no update is lost.

Each worker does, ``--increments`` times: read the counter znode, think for a few
milliseconds, write the value + 1. Without a lock the workers read the same value and
overwrite each other (lost updates: the final value is lower than the number of increments).
With ``aiodlock`` around the read-sleep-write, every increment counts::

    async with locks.lock("counter") as lease:      # a ZooKeeper lock: FIFO, czxid token
        value = int(await zk.get_data(COUNTER))
        await asyncio.sleep(random.uniform(0.001, 0.005))
        await zk.set_data(COUNTER, str(value + 1), force=True)

The counter itself is read and written with aiozk's plain client: it stands for any resource
the lock protects. (A resource that can check ``lease.fencing_token`` — the lock node's
czxid, strictly increasing — can also refuse a holder that was paused past its session.)

Run it against a ZooKeeper server (the workers start together: a ZooKeeper barrier, each
waiting on a child watch until every worker has announced itself, however slow to start)::

    python examples/zk_counter.py --url zookeeper://127.0.0.1:2181/examples
    python examples/zk_counter.py --url zookeeper://127.0.0.1:2181 --no-lock   # loses updates

Exit status: 0 when the run behaved as expected (exact with the lock), 1 if the locked run
lost an update (a bug), 2 for bad usage or an unreachable server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import subprocess
import sys
import uuid
from typing import Any
from urllib.parse import urlsplit

# The resource's own client (aiodlock[zookeeper] installs it).
from aiozk import WatchEvent, ZKClient

import aiodlock

NAMESPACE = "zk-counter-example"


def zk_hosts_and_root(url: str) -> tuple[str, str]:
    """``zookeeper://h1:p1,h2:p2/chroot?...`` -> (``"h1:p1,h2:p2"``, ``"/chroot"``)."""
    parts = urlsplit(url)
    if parts.scheme != "zookeeper":
        raise SystemExit(f"--url must be a zookeeper:// URL, not {url!r}")
    return parts.netloc, parts.path.rstrip("/")


async def worker(url: str, counter: str, increments: int, use_lock: bool, processes: int) -> None:
    hosts, _ = zk_hosts_and_root(url)
    zk = ZKClient(hosts, session_timeout=10)
    await zk.start()
    try:
        async with aiodlock.connect(url, namespace=NAMESPACE) as locks:
            await start_together(zk, counter, processes)
            for _ in range(increments):
                if use_lock:
                    async with locks.lock(counter, timeout=60):
                        await increment(zk, counter)
                else:
                    await increment(zk, counter)
    finally:
        await zk.close()


async def start_together(zk: Any, counter: str, processes: int) -> None:
    """A barrier: announce this worker (an ephemeral child of the counter node), then wait on
    a child watch until every worker has. Without it a worker slow to start could run after
    the other had finished, and lose no update."""
    await zk.create(f"{counter}/ready-", ephemeral=True, sequential=True)
    while True:
        changed = zk.wait_for_events([WatchEvent.CHILDREN_CHANGED], counter)
        if len(await zk.get_children(counter, watch=True)) >= processes:
            return
        await changed


async def increment(zk: Any, counter: str) -> None:
    value = int(await zk.get_data(counter))
    await asyncio.sleep(random.uniform(0.001, 0.005))  # meanwhile, the other process runs
    await zk.set_data(counter, str(value + 1).encode(), force=True)


async def make_counter(url: str) -> str:
    async with aiodlock.connect(url, connect_timeout=5):
        pass  # a clear BackendError now if no server answers
    hosts, root = zk_hosts_and_root(url)
    zk = ZKClient(hosts, session_timeout=10)
    await zk.start()
    try:
        await zk.ensure_path(root or "/")
        path = f"{root}/aiodlock-counter-{uuid.uuid4().hex[:8]}"
        await zk.create(path, b"0")
        return path
    finally:
        await zk.close()


async def finish_counter(url: str, counter: str) -> int:
    hosts, _ = zk_hosts_and_root(url)
    zk = ZKClient(hosts, session_timeout=10)
    await zk.start()
    try:
        value = int(await zk.get_data(counter))
        await zk.delete(counter)
        return value
    finally:
        await zk.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="zookeeper://host:port[,host:port]/chroot")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--increments", type=int, default=20, help="per process")
    parser.add_argument("--no-lock", action="store_true", help="show the lost updates")
    parser.add_argument("--worker", metavar="COUNTER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    use_lock = not args.no_lock
    logging.getLogger("aiozk").setLevel(logging.CRITICAL)  # the counter client's own chatter

    if args.worker:
        asyncio.run(worker(args.url, args.worker, args.increments, use_lock, args.processes))
        return 0

    try:
        counter = asyncio.run(make_counter(args.url))
    except aiodlock.BackendError as exc:
        print(f"cannot use {args.url}: {exc}", file=sys.stderr)
        return 2
    warn_flags = [f"-W{option}" for option in sys.warnoptions]  # e.g. -W error, passed on
    command = [sys.executable, *warn_flags, __file__, "--url", args.url]
    command += ["--worker", counter, "--increments", str(args.increments)]
    command += ["--processes", str(args.processes)] + ([] if use_lock else ["--no-lock"])
    workers = [subprocess.Popen(command) for _ in range(args.processes)]
    failed = [w.args for w in workers if w.wait() != 0]
    final = asyncio.run(finish_counter(args.url, counter))
    expected = args.processes * args.increments
    mode = "with lock" if use_lock else "no lock"
    print(f"{mode}: final value {final} of {expected} increments ({expected - final} lost)")
    if failed:
        print(f"{len(failed)} worker(s) failed", file=sys.stderr)
        return 1
    return 1 if use_lock and final != expected else 0


if __name__ == "__main__":
    sys.exit(main())
