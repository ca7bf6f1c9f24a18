"""The ``demo`` command: the oversell demo (``python -m aiodlock demo``, ``examples/oversell.py``).

This module owns the buyers, the runs without and with the lock, the report and the demo's
options; where the stock is kept (and the fenced write) is :mod:`aiodlock.cli._stock`. Like
any application, it uses aiodlock's public API only.

``--buyers`` concurrent buyers read the stock, think, and write ``stock - 1``: without a lock
they oversell (lost updates); with ``async with locks.lock("stock:sku-1")`` around
read-think-write they sell exactly ``--stock``. The stock also refuses writes with an older
fencing token. ``--processes N`` needs a Redis URL (a shared store). Exit status 0 when the
locked run was exact, 1 when not (a bug in aiodlock), 2 for bad usage or an unreachable
service. The whole story: docs/operations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import queue
import random
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TextIO

import aiodlock
from aiodlock.backends import parse_url

from ._stock import MemoryStock, RedisStock, StockStore, Totals

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

__all__ = [
    "DESCRIPTION",
    "HELP",
    "NAME",
    "Config",
    "Report",
    "Run",
    "Totals",
    "add_arguments",
    "main",
    "run",
]

NAME: Final = "demo"
HELP: Final = "the oversell demo: concurrent buyers without and with a lock"
DESCRIPTION: Final = (
    "The oversell demo: concurrent buyers read the stock, wait a moment, and write stock - 1. "
    "Without a lock the stock is oversold; with aiodlock's lock exactly the stock is sold."
)
NAMESPACE: Final = "aiodlock-demo"
LOCK_NAME: Final = "stock:sku-1"
THINK_SECONDS: Final = (0.001, 0.003)
"""How long a buyer thinks between reading and writing: long enough for every other buyer to
read first when there is no lock, short enough for the locked run to take a moment."""
SHARED_SCHEMES: Final = frozenset({"redis", "rediss", "unix"})
"""URL schemes whose service also keeps the stock, so that several processes can share it."""
START_TIMEOUT: Final = 60.0
RUN_TIMEOUT: Final = 300.0


# ---------------------------------------------------------------------- the buyers


async def buy(store: StockStore, token: int | None) -> None:
    """One buyer: read the stock, think, and sell one item if the stock read was positive."""
    stock = await store.read()
    await asyncio.sleep(random.uniform(*THINK_SECONDS))  # meanwhile, other buyers run
    if stock > 0:
        await store.sell(stock - 1, token=token)


async def buyer(locks: aiodlock.LockClient, store: StockStore, *, locked: bool) -> None:
    """A buyer with or without the lock; with it, the write carries the lease's fencing token."""
    if not locked:
        await buy(store, token=None)
        return
    async with locks.lock(LOCK_NAME) as lease:
        await buy(store, token=lease.fencing_token)


async def run_buyers(
    locks: aiodlock.LockClient, store: StockStore, buyers: int, *, locked: bool
) -> None:
    """Let ``buyers`` buyers loose at once, and wait until they are all done."""
    async with asyncio.TaskGroup() as group:
        for _ in range(buyers):
            group.create_task(buyer(locks, store, locked=locked))


# ---------------------------------------------------------------------- one run of each mode


@dataclass(frozen=True, slots=True)
class Config:
    url: str
    buyers: int
    stock: int
    processes: int
    shared: bool  # the stock lives in the lock service (Redis), not in this process


@dataclass(frozen=True, slots=True)
class Run:
    mode: str
    buyers: int
    totals: Totals
    elapsed: float


@dataclass(frozen=True, slots=True)
class Report:
    config: Config
    unlocked: Run
    locked: Run
    stale_token: int | None  # the token of the late write tried after the locked run
    stale_refused: bool

    @property
    def expected_sold(self) -> int:
        return min(self.config.buyers, self.config.stock)

    def oversold(self, run: Run) -> int:
        return max(0, run.totals.sold - self.config.stock)

    @property
    def ok(self) -> bool:
        """The locked run was exact, and fencing refused exactly the stale write."""
        totals = self.locked.totals
        return (
            totals.sold == self.expected_sold
            and totals.stock == self.config.stock - self.expected_sold
            and totals.refused == 0
            and (self.stale_token is None or self.stale_refused)
        )

    def render(self) -> str:
        config = self.config
        where = "1 process" if config.processes == 1 else f"{config.processes} processes"
        lines = [
            f"aiodlock oversell demo: {config.stock} items in stock, {config.buyers} buyers "
            f"in {where}, locks on {shown_url(config.url)}",
            "",
            f"{'mode':<10} {'buyers':>7} {'sold':>6} {'final stock':>12} "
            f"{'oversold by':>12} {'elapsed':>9}",
        ]
        for run in (self.unlocked, self.locked):
            lines.append(
                f"{run.mode:<10} {run.buyers:>7} {run.totals.sold:>6} {run.totals.stock:>12} "
                f"{self.oversold(run):>12} {run.elapsed:>7.2f} s"
            )
        lines.append("")
        expected_final = config.stock - self.expected_sold
        for run in (self.unlocked, self.locked):
            lines.append(
                f"{run.mode + ':':<10} {run.totals.sold} sold from a stock of {config.stock}, "
                f"oversold by {self.oversold(run)}, final stock {run.totals.stock} "
                f"(should be {expected_final})"
            )
        locked = self.locked.totals
        if self.stale_token is None:
            lines.append("fencing:   too few grants to try a stale write")
        else:
            verdict = "refused" if self.stale_refused else "ACCEPTED"
            lines.append(
                f"fencing:   the stock was last written with token {locked.newest_token}; "
                f"a late write with token {self.stale_token} was {verdict}"
            )
        if locked.refused:
            lines.append(f"fencing:   {locked.refused} writes refused during the locked run")
        lines.append("")
        if self.ok:
            lines.append(
                f"OK: with the lock, exactly {self.expected_sold} sold and the final stock "
                f"is {expected_final}."
            )
        else:
            lines.append("FAILED: the locked run was not exact. This is a bug in aiodlock.")
        return "\n".join(lines)


def shown_url(url: str) -> str:
    """``url`` as the report shows it: any password as ``***``, no query options."""
    return parse_url(url).redacted()


class DemoError(Exception):
    """The demo could not run (a buyer process failed, the service is unreachable...)."""


async def run_demo(config: Config) -> Report:
    """Run the buyers without and then with the lock, on the same fresh stock."""
    run_id = uuid.uuid4().hex[:12]
    # Connecting first reports an unreachable service before anything else happens.
    async with aiodlock.connect(config.url, namespace=NAMESPACE) as locks:
        store: StockStore = (
            RedisStock(config.url, run_id, namespace=NAMESPACE) if config.shared else MemoryStock()
        )
        try:
            runs = []
            for mode, locked in (("no lock", False), ("with lock", True)):
                await store.reset(config.stock)
                started = time.perf_counter()
                if config.processes == 1:
                    await run_buyers(locks, store, config.buyers, locked=locked)
                    elapsed = time.perf_counter() - started
                else:
                    elapsed = await asyncio.to_thread(run_in_processes, config, run_id, locked)
                runs.append(Run(mode, config.buyers, await store.totals(), elapsed))
            unlocked, locked_run = runs
            # A buyer that was paused while holding the lock wakes up and writes with its
            # old token, long after newer holders wrote: the store must refuse it.
            newest = locked_run.totals.newest_token
            stale_token = newest - 1 if newest >= 2 else None
            stale_refused = stale_token is not None and not await store.sell(
                config.stock - 1, token=stale_token
            )
            return Report(config, unlocked, locked_run, stale_token, stale_refused)
        finally:
            if isinstance(store, RedisStock):
                await store.delete()
            await store.aclose()


# ---------------------------------------------------------------------- several processes


def shares(buyers: int, processes: int) -> list[int]:
    """Split ``buyers`` over ``processes`` as evenly as possible."""
    base, extra = divmod(buyers, processes)
    return [base + (1 if i < extra else 0) for i in range(processes)]


Outcome = tuple[str, str] | None
"""What a buyer process reports: None when it finished, else ``("service", message)`` when
the service failed or ``("crash", traceback)`` for anything else (a bug)."""


def run_in_processes(config: Config, run_id: str, locked: bool) -> float:
    """Run the buyers in ``config.processes`` processes that start together; return the time
    from the common start until the last one finished."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(config.processes + 1)
    results: Queue[Outcome] = context.Queue()
    workers = [
        context.Process(
            target=buyer_process,
            args=(config.url, run_id, count, locked, barrier, results),
            name=f"aiodlock-demo-buyers-{i}",
            daemon=True,
        )
        for i, count in enumerate(shares(config.buyers, config.processes))
    ]
    for worker in workers:
        worker.start()
    outcomes: list[Outcome] = []
    try:
        try:
            barrier.wait(START_TIMEOUT)
        except threading.BrokenBarrierError:
            outcomes.append(_next_outcome(results, 10.0))
            _raise_failures(outcomes, "failed to start")
            raise DemoError("a buyer process failed to start") from None
        started = time.perf_counter()
        for _ in workers:
            outcomes.append(_next_outcome(results, RUN_TIMEOUT))
        elapsed = time.perf_counter() - started
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()
    _raise_failures(outcomes, "failed")
    return elapsed


def _next_outcome(results: Queue[Outcome], timeout: float) -> Outcome:
    try:
        return results.get(timeout=timeout)
    except queue.Empty:
        raise DemoError(f"a buyer process did not report within {timeout:.0f} s") from None


def _raise_failures(outcomes: list[Outcome], what: str) -> None:
    for outcome in outcomes:
        if outcome is None:
            continue
        kind, text = outcome
        if kind == "service":
            raise DemoError(f"a buyer process {what}: {text}")
        raise RuntimeError(f"a buyer process crashed:\n{text}")


def buyer_process(
    url: str,
    run_id: str,
    buyers: int,
    locked: bool,
    barrier: Barrier,
    results: Queue[Outcome],
) -> None:
    """The body of one buyer process: connect, wait for the common start, buy, report."""
    try:
        asyncio.run(_buyer_process(url, run_id, buyers, locked, barrier))
    except BaseException as exc:
        barrier.abort()  # the others must not wait for us
        problem = _service_problem(exc)
        if problem is not None:
            results.put(("service", problem))
        else:
            results.put(("crash", "".join(traceback.format_exception(exc)).rstrip()))
    else:
        results.put(None)


async def _buyer_process(
    url: str, run_id: str, buyers: int, locked: bool, barrier: Barrier
) -> None:
    store = RedisStock(url, run_id, namespace=NAMESPACE)
    try:
        async with aiodlock.connect(url, namespace=NAMESPACE) as locks:
            await asyncio.to_thread(barrier.wait, START_TIMEOUT)
            await run_buyers(locks, store, buyers, locked=locked)
    finally:
        await store.aclose()


# ---------------------------------------------------------------------- command line


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, shared by ``python -m aiodlock demo`` and ``examples/oversell.py``."""
    parser.add_argument(
        "--url",
        default="memory://",
        help="where the locks live (default: memory://, in this process); with redis://, "
        "rediss:// or unix:// the stock is kept in Redis too",
    )
    parser.add_argument(
        "--buyers", type=_positive_int, default=300, metavar="N", help="buyers (default: 300)"
    )
    parser.add_argument(
        "--stock", type=_positive_int, default=100, metavar="N", help="items (default: 100)"
    )
    parser.add_argument(
        "--processes",
        type=_positive_int,
        default=1,
        metavar="N",
        help="spread the buyers over N processes (needs a redis:// URL; default: 1)",
    )


def _config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    url: str = args.url
    try:
        # connect() checks the URL and its options and connects nothing (entering the client
        # does): a bad --url is a usage error, in connect()'s own words.
        aiodlock.connect(url, namespace=NAMESPACE)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(f"--url: {exc}")
    scheme = url.partition("://")[0].lower()
    processes: int = args.processes
    shared = scheme in SHARED_SCHEMES
    if processes > 1 and not shared:
        parser.error(
            f"--processes {processes} needs a stock that several processes share, but "
            f"{scheme}:// locks live inside one process: use --url redis://HOST:PORT/DB "
            "(or --processes 1)"
        )
    return Config(url, args.buyers, args.stock, processes, shared)


def run(
    args: argparse.Namespace, parser: argparse.ArgumentParser, out: TextIO | None = None
) -> int:
    """Run the demo for parsed ``args``; print the report; return the exit status."""
    config = _config(args, parser)
    try:
        report = asyncio.run(run_demo(config))
    except Exception as exc:
        problem = _service_problem(exc)
        if problem is None:
            raise
        print(f"{parser.prog}: error: the demo could not run: {problem}", file=sys.stderr)
        return 2
    print(report.render(), file=out or sys.stdout)
    return 0 if report.ok else 1


def _service_problem(exc: BaseException) -> str | None:
    """A one-line message if ``exc`` says the service failed (not a bug), else None."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            problem = _service_problem(inner)
            if problem is not None:
                return problem
        return None
    driver_error = type(exc).__module__.partition(".")[0] == "redis"
    if isinstance(exc, aiodlock.BackendError | DemoError | OSError) or driver_error:
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """``examples/oversell.py``: parse ``argv``, run, return the exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)
