"""The inventory oversell on PostgreSQL, four ways: the seeds' patterns beside aiodlock.

One ``goods`` row holds the stock; ``--buyers`` concurrent buyers each try to buy one item:
read the stock, think for a moment, write it back decremented. The same race, four ways:

1. **no lock** — read, sleep, write: every buyer reads before anyone writes, all of them
   "sell", and the stock goes down by one. Oversold.
2. **pessimistic** — ``SELECT ... FOR UPDATE`` in a transaction: PostgreSQL row-locks the row
   until COMMIT, so buyers queue on the row (the lock lives only as long as the transaction).
3. **optimistic** — a ``version`` column: ``UPDATE ... WHERE version = <seen>``; zero rows
   changed means someone else wrote first: read again and retry. No lock, but retries.
4. **aiodlock** — ``async with locks.lock("goods:1")`` on the ``postgresql://`` backend (an
   advisory lock on a dedicated connection) around the plain read-modify-write, and a
   *fenced* write: the row keeps the newest fencing token that wrote it and refuses an older
   one, so a holder that stalled past its lease cannot overwrite a newer holder's work.

Run it (the role needs CREATE on the database: it makes ``goods`` and aiodlock's fencing
table)::

    python examples/inventory_postgres.py --url postgresql://user:password@127.0.0.1:5432/shop
    python examples/inventory_postgres.py --url ... --buyers 50 --stock 20 --think 0.005

It prints one line per strategy and exits 0 when strategies 2-4 each sold exactly the stock
(or every buyer, if there was more stock than buyers) and left the right stock behind; 1 if
one of them oversold or lost an update; 2 for bad usage or an unreachable server. Strategy 1
is *expected* to oversell; it is shown, not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg

import aiodlock

TABLE_DDL = """CREATE TABLE IF NOT EXISTS {table} (
    id integer PRIMARY KEY,
    stocks integer NOT NULL,
    version integer NOT NULL DEFAULT 0,  -- optimistic strategy: bumped by every write
    fence bigint NOT NULL DEFAULT 0      -- aiodlock strategy: newest token written
)"""

GOODS_ID = 1


@dataclass
class Outcome:
    """What one strategy did to the row."""

    strategy: str
    buyers: int
    stock: int
    sold: int
    final: int
    retries: int = 0

    @property
    def expected_sold(self) -> int:
        return min(self.buyers, self.stock)

    @property
    def exact(self) -> bool:
        return self.sold == self.expected_sold and self.final == self.stock - self.sold

    @property
    def verdict(self) -> str:
        if self.exact:
            return "exact"
        problems = []
        lost = self.sold - (self.stock - self.final)  # sales the stock never saw
        if lost:
            problems.append(f"LOST {lost} updates")
        if self.sold > self.stock:
            problems.append(f"OVERSOLD by {self.sold - self.stock}")
        return ", ".join(problems) or f"sold {self.sold}, expected {self.expected_sold}"


class Shop:
    """The ``goods`` table, reached through an asyncpg pool (for the data, not the lock)."""

    def __init__(self, pool: Any, table: str, think: float) -> None:
        self.pool = pool
        self.table = table
        self.think = think

    async def prepare(self) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(TABLE_DDL.format(table=self.table))

    async def reset(self, stock: int) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                f"INSERT INTO {self.table} (id, stocks, version, fence) VALUES ($1, $2, 0, 0) "
                "ON CONFLICT (id) DO UPDATE SET stocks = $2, version = 0, fence = 0",
                GOODS_ID,
                stock,
            )

    async def stocks(self) -> int:
        async with self.pool.acquire() as conn:
            return int(
                await conn.fetchval(f"SELECT stocks FROM {self.table} WHERE id = $1", GOODS_ID)
            )

    async def pause(self) -> None:
        """The buyer 'thinks' between reading and writing: other buyers run meanwhile."""
        await asyncio.sleep(self.think * random.uniform(0.5, 1.5))

    # -- 1. no lock ------------------------------------------------------------------------

    async def buy_unlocked(self) -> bool:
        async with self.pool.acquire() as conn:
            stocks = await conn.fetchval(f"SELECT stocks FROM {self.table} WHERE id = $1", GOODS_ID)
            if stocks <= 0:
                return False
            await self.pause()
            await conn.execute(
                f"UPDATE {self.table} SET stocks = $1 WHERE id = $2", stocks - 1, GOODS_ID
            )
            return True

    # -- 2. pessimistic: SELECT ... FOR UPDATE ---------------------------------------------

    async def buy_for_update(self) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            stocks = await conn.fetchval(
                f"SELECT stocks FROM {self.table} WHERE id = $1 FOR UPDATE", GOODS_ID
            )
            if stocks <= 0:
                return False  # leaving the block commits: nothing was written
            await self.pause()
            await conn.execute(
                f"UPDATE {self.table} SET stocks = $1 WHERE id = $2", stocks - 1, GOODS_ID
            )
            return True

    # -- 3. optimistic: version column, retry ----------------------------------------------

    async def buy_optimistic(self, retries: list[int]) -> bool:
        async with self.pool.acquire() as conn:
            while True:
                stocks, version = await conn.fetchrow(
                    f"SELECT stocks, version FROM {self.table} WHERE id = $1", GOODS_ID
                )
                if stocks <= 0:
                    return False
                await self.pause()
                status = await conn.execute(
                    f"UPDATE {self.table} SET stocks = $1, version = version + 1 "
                    "WHERE id = $2 AND version = $3",
                    stocks - 1,
                    GOODS_ID,
                    version,
                )
                if status == "UPDATE 1":
                    return True
                retries[0] += 1  # someone wrote first: read again

    # -- 4. aiodlock around the read-modify-write, with a fenced write -----------------------

    async def buy_with_lock(self, locks: aiodlock.LockClient) -> bool:
        async with (
            locks.lock(f"goods:{GOODS_ID}", ttl=10, timeout=60) as lease,
            self.pool.acquire() as conn,
        ):
            stocks = await conn.fetchval(f"SELECT stocks FROM {self.table} WHERE id = $1", GOODS_ID)
            if stocks <= 0:
                return False
            await self.pause()
            # Fenced: refused if a newer lock holder has written the row meanwhile.
            status = await conn.execute(
                f"UPDATE {self.table} SET stocks = $1, fence = $2 WHERE id = $3 AND fence < $2",
                stocks - 1,
                lease.fencing_token,
                GOODS_ID,
            )
            if status != "UPDATE 1":
                raise aiodlock.StaleTokenError(
                    f"token {lease.fencing_token} is older than the row's: write refused"
                )
            return True


async def run_strategy(
    shop: Shop, name: str, buyers: int, stock: int, buy: Callable[[], Awaitable[bool]]
) -> Outcome:
    await shop.reset(stock)
    results = await asyncio.gather(*(buy() for _ in range(buyers)))
    return Outcome(name, buyers, stock, sold=sum(results), final=await shop.stocks())


async def run(url: str, buyers: int, stock: int, think: float, table: str) -> list[Outcome]:
    # The same URL serves the data pool and the lock client (its query holds aiodlock's
    # options, so the pool gets the parts, not the URL).
    parts = urlsplit(url)
    pool = await asyncpg.create_pool(
        host=parts.hostname or "localhost",
        port=parts.port or 5432,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=unquote(parts.path.strip("/")),
        min_size=1,
        max_size=buyers + 1,
    )
    try:
        shop = Shop(pool, table, think)
        await shop.prepare()
        retries = [0]
        async with aiodlock.connect(
            url, namespace="inventory-example", max_connections=buyers + 1
        ) as locks:
            strategies: list[tuple[str, Callable[[], Awaitable[bool]]]] = [
                ("1. no lock (read, sleep, write)", shop.buy_unlocked),
                ("2. pessimistic SELECT ... FOR UPDATE", shop.buy_for_update),
                ("3. optimistic version + retry", lambda: shop.buy_optimistic(retries)),
                ("4. aiodlock postgresql:// lock", lambda: shop.buy_with_lock(locks)),
            ]
            outcomes = []
            for name, buy in strategies:
                retries[0] = 0
                outcome = await run_strategy(shop, name, buyers, stock, buy)
                outcome.retries = retries[0]
                outcomes.append(outcome)
        return outcomes
    finally:
        await pool.close()


def print_table(outcomes: list[Outcome]) -> None:
    header = (
        f"{'strategy':<40} {'buyers':>6} {'stock':>5} {'sold':>5} {'final':>5} "
        f"{'retries':>7}  result"
    )
    print(header)
    print("-" * len(header))
    for o in outcomes:
        print(
            f"{o.strategy:<40} {o.buyers:>6} {o.stock:>5} {o.sold:>5} {o.final:>5} "
            f"{o.retries:>7}  {o.verdict}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="inventory_postgres.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("AIODLOCK_URL"),
        help="postgresql://user:password@host:port/database (default: $AIODLOCK_URL)",
    )
    parser.add_argument("--buyers", type=int, default=30)
    parser.add_argument("--stock", type=int, default=20)
    parser.add_argument("--think", type=float, default=0.005, help="seconds between read/write")
    parser.add_argument("--table", default="goods")
    args = parser.parse_args(argv)
    if not args.url or not args.url.startswith(("postgresql://", "postgres://")):
        parser.error("--url postgresql://user:password@host:port/database is required")
    if args.buyers < 1 or args.stock < 0 or args.think < 0:
        parser.error("--buyers must be >= 1, --stock and --think >= 0")
    if not args.table.isidentifier():
        parser.error("--table must be a plain identifier")
    try:
        outcomes = asyncio.run(run(args.url, args.buyers, args.stock, args.think, args.table))
    except (aiodlock.BackendError, asyncpg.PostgresError, OSError, ValueError) as exc:
        print(f"inventory_postgres.py: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print_table(outcomes)
    judged = outcomes[1:]
    if all(o.exact for o in judged):
        print("strategies 2-4 sold exactly the stock; strategy 1 shows the race they prevent")
        return 0
    print("FAILED: a guarded strategy oversold or lost an update", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
