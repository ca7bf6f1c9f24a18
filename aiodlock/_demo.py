"""The oversell demo: ``python -m aiodlock demo`` and ``examples/oversell.py``.

A shop has ``--stock`` items of one product and ``--buyers`` concurrent buyers. Every buyer
reads the stock, thinks for a moment (``await asyncio.sleep``: a payment call, a slow query),
and then, if the stock it read was positive, writes ``stock - 1`` and counts a sale.

* **No lock**: every buyer reads before any buyer writes, so they all see stock left and they
  all sell. The product is oversold and the final stock is wrong (the writes overwrite each
  other: lost updates).
* **With lock**: ``async with locks.lock("stock:sku-1") as lease:`` around read-think-write.
  Exactly ``--stock`` items are sold and the final stock is 0.

The stock record also keeps the newest fencing token that wrote it, and refuses a write that
carries an older one: that check, made by the data store rather than by the lock, is what makes
a paused holder whose lease has run out harmless. With ``memory://`` the stock is a Python object
guarded by :class:`aiodlock.FencingGuard`; with ``redis://`` (also ``rediss://``, ``unix://``)
it is kept in Redis keys through redis-py — the data is the application's — and the fenced write
is the Lua compare-and-set in :data:`FENCED_WRITE`. Only a shared store lets several processes
sell from the same stock, so ``--processes N`` needs a Redis URL.

Exit status: 0 when the locked run sold exactly what was in stock, 1 when it did not (that would
be a bug in aiodlock), 2 for bad usage or when the demo could not run (service unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from typing import TYPE_CHECKING, Final, Protocol, TextIO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiodlock

from ._url import load_backend, parse_url

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

    import redis.asyncio

__all__ = ["DESCRIPTION", "add_arguments", "main", "run"]

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
DATA_CONNECTIONS: Final = 32
"""Connections per process for the stock in Redis."""
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


# ---------------------------------------------------------------------- where the stock is kept


@dataclass(frozen=True, slots=True)
class Totals:
    """The stock record after a run."""

    stock: int
    sold: int
    refused: int
    """Fenced writes refused because their token was older than the newest one written."""
    newest_token: int


class StockStore(Protocol):
    """The stock of one product, and the sales made from it."""

    async def reset(self, quantity: int) -> None:
        """Put ``quantity`` items in stock; forget sales, refusals and tokens."""
        ...

    async def read(self) -> int:
        """The stock now."""
        ...

    async def sell(self, remaining: int, *, token: int | None) -> bool:
        """Write ``remaining`` as the new stock and count one sale.

        With a fencing ``token``, only if it is not older than the newest token written so
        far; a refused write changes nothing and returns False.
        """
        ...

    async def totals(self) -> Totals:
        """Stock, sales, refused writes and the newest token, as stored."""
        ...

    async def aclose(self) -> None:
        """Drop connections (the data stays)."""
        ...


class MemoryStock:
    """The stock as a Python object, for ``memory://``: one process only."""

    def __init__(self) -> None:
        self._stock = 0
        self._sold = 0
        self._refused = 0
        self._guard = aiodlock.FencingGuard()

    async def reset(self, quantity: int) -> None:
        self._stock, self._sold, self._refused = quantity, 0, 0
        self._guard = aiodlock.FencingGuard()

    async def read(self) -> int:
        return self._stock

    async def sell(self, remaining: int, *, token: int | None) -> bool:
        if token is not None:
            try:
                self._guard.check(token)  # a newer holder has written: refuse
            except aiodlock.StaleTokenError:
                self._refused += 1
                return False
        self._stock = remaining
        self._sold += 1
        return True

    async def totals(self) -> Totals:
        return Totals(self._stock, self._sold, self._refused, self._guard.newest)

    async def aclose(self) -> None:
        pass


FENCED_WRITE: Final = """
-- The fenced write: the data store, not the lock, has the last word.
-- KEYS[1] stock, KEYS[2] newest fencing token written, KEYS[3] sales, KEYS[4] refused writes
-- ARGV[1] the new stock, ARGV[2] the writer's fencing token
-- A writer whose token is older than the newest one written here held the lock once but has
-- lost it since (it was paused while its lease ran out, and another buyer got the lock): its
-- write is refused. Otherwise the token is remembered with the data, atomically.
local newest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) < newest then
    redis.call('INCR', KEYS[4])
    return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[3])
return 1
"""


class RedisStock:
    """The stock in Redis keys, for ``redis://``: shared by every process of the demo.

    The keys share the hash tag ``{run}``, so the fenced-write script touches one slot (it would
    run on Redis Cluster too), and every run of the demo has keys of its own.
    """

    def __init__(self, url: str, run: str) -> None:
        try:
            import redis.asyncio
        except ImportError:  # pragma: no cover - the redis:// backend needs it anyway
            raise ImportError(
                "the demo keeps its stock in Redis with redis-py: pip install 'aiodlock[redis]'"
            ) from None
        # A bounded pool that makes commands wait for a free connection (redis-py's default
        # pool raises "Too many connections" instead when hundreds of buyers read at once).
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            data_url(url), max_connections=DATA_CONNECTIONS
        )
        self._redis: redis.asyncio.Redis = redis.asyncio.Redis.from_pool(pool)
        prefix = f"{NAMESPACE}:{{{run}}}"
        self._stock, self._newest, self._sold, self._refused = (
            f"{prefix}:{field}" for field in ("stock", "newest-token", "sold", "refused")
        )
        self._fenced_write = self._redis.register_script(FENCED_WRITE)

    @property
    def keys(self) -> list[str]:
        return [self._stock, self._newest, self._sold, self._refused]

    async def reset(self, quantity: int) -> None:
        await self._redis.mset(
            {self._stock: quantity, self._newest: 0, self._sold: 0, self._refused: 0}
        )

    async def read(self) -> int:
        return int(await self._redis.get(self._stock) or 0)

    async def sell(self, remaining: int, *, token: int | None) -> bool:
        if token is None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self._stock, remaining)
                pipe.incr(self._sold)
                await pipe.execute()
            return True
        written = await self._fenced_write(keys=self.keys, args=[remaining, token])
        return bool(written)

    async def totals(self) -> Totals:
        values = await self._redis.mget(self.keys)
        stock, newest, sold, refused = (int(v or 0) for v in values)
        return Totals(stock, sold, refused, newest)

    async def delete(self) -> None:
        """Remove this run's keys; best effort, so as not to hide why a run failed."""
        from redis.exceptions import RedisError

        with contextlib.suppress(RedisError, OSError):
            await self._redis.delete(*self.keys)

    async def aclose(self) -> None:
        await self._redis.aclose()


def data_url(url: str) -> str:
    """The lock URL as a redis-py URL: aiodlock's query options dropped, ``db`` kept."""
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "db"]
    return urlunsplit(parts._replace(query=urlencode(kept)))


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
            f"in {where}, locks on {parse_url(config.url).redacted()}",
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


class DemoError(Exception):
    """The demo could not run (a buyer process failed, the service is unreachable...)."""


async def run_demo(config: Config) -> Report:
    """Run the buyers without and then with the lock, on the same fresh stock."""
    run_id = uuid.uuid4().hex[:12]
    # Connecting first reports an unreachable service before anything else happens.
    async with aiodlock.connect(config.url, namespace=NAMESPACE) as locks:
        store: StockStore = RedisStock(config.url, run_id) if config.shared else MemoryStock()
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
    store = RedisStock(url, run_id)
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
        scheme = parse_url(url).scheme
        load_backend(scheme)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(f"--url: {exc}")
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
