"""The oversell problem, and how a distributed lock fixes it.

100 items, 300 buyers. Every buyer reads the stock, thinks for a moment, then writes
``stock - 1`` if there was stock. Without a lock they all read before anyone writes, so all
300 sell: oversold by 200, and the final stock is wrong. With aiodlock, each buyer does::

    async with locks.lock("stock:sku-1") as lease:
        stock = await store.read()
        await asyncio.sleep(random.uniform(0.001, 0.003))  # meanwhile, other buyers run
        if stock > 0:
            await store.sell(stock - 1, token=lease.fencing_token)

and exactly 100 are sold. The store also keeps the newest fencing token that wrote it and
refuses older ones (:class:`aiodlock.FencingGuard` in memory, a Lua compare-and-set in Redis),
so a holder that was paused past its lease cannot overwrite a newer holder's work.

Run it::

    python examples/oversell.py                              # memory://, one process
    python examples/oversell.py --buyers 1000 --stock 10
    python examples/oversell.py --url redis://127.0.0.1:6379/0 --processes 4

``python -m aiodlock demo`` runs the same program: it lives in ``aiodlock/cli/demo.py`` so that
it ships with the package (read it for the whole story: the buyers and the report there, the
stock stores and the Lua script in ``aiodlock/cli/_stock.py``).

Exit status: 0 when the locked run sold exactly the stock, 1 if it oversold (a bug), 2 for bad
usage or an unreachable service.
"""

import sys

from aiodlock.cli.demo import main

if __name__ == "__main__":
    sys.exit(main(prog="oversell.py"))
