"""The queue engine of the session backends (ZooKeeper, etcd): the recipe and the leases.

:mod:`._verdict` decides, with no I/O, who holds a lock family's queue and whom a waiter
watches; :mod:`._leases` ends the leases of the entries (reaper, session loss, grace
window); :mod:`._family` names the directories and the capabilities. An adapter does the
rest: create an entry in sequence, list the directory, watch a deletion, keep its session.
How a new sequential store plugs in: docs/architecture.md.

Example::

    verdict = evaluate(queue, my_key)
    if not verdict.granted:
        watch(directory if verdict.ahead else verdict.watch)
"""

from ._family import (
    FAMILY_OF_KIND as FAMILY_OF_KIND,
    KIND_OF_FAMILY as KIND_OF_FAMILY,
    QUEUE_CAPABILITIES as QUEUE_CAPABILITIES,
)
from ._leases import REAPED as REAPED, Holding as Holding, Leases as Leases
from ._verdict import (
    Contender as Contender,
    Verdict as Verdict,
    evaluate as evaluate,
    holders as holders,
)

__all__ = [
    "FAMILY_OF_KIND",
    "KIND_OF_FAMILY",
    "QUEUE_CAPABILITIES",
    "REAPED",
    "Contender",
    "Holding",
    "Leases",
    "Verdict",
    "evaluate",
    "holders",
]
