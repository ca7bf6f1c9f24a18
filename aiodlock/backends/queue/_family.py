"""What every queue backend shares besides the recipe: its capabilities and its directories.

A queue backend keeps one directory per lock family of a name (``mutex``, ``rw`` for read
and write locks, ``semaphore``) and declares the same capabilities: FIFO queues (FAIR), a
session that ends every lease of a dead client (SESSION_LEASE), the service's deletion
events as wakeups (SERVER_WAKEUP), and the sequence as fencing token.

Example::

    f"{root}/{namespace}/{name}/{FAMILY_OF_KIND[spec.kind]}"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .. import Capability, Kind

__all__ = ["FAMILY_OF_KIND", "KIND_OF_FAMILY", "QUEUE_CAPABILITIES"]

QUEUE_CAPABILITIES: Final[frozenset[Capability]] = frozenset(
    {
        Capability.EXCLUSIVE,
        Capability.SHARED,
        Capability.COUNTING,
        Capability.FAIR,
        Capability.FENCING,
        Capability.SESSION_LEASE,
        Capability.SERVER_WAKEUP,
        Capability.INSPECT,
        Capability.BREAK,
    }
)
"""The capabilities of a queue backend with inspect and break."""

FAMILY_OF_KIND: Final[Mapping[Kind, str]] = {
    Kind.MUTEX: "mutex",
    Kind.READ: "rw",
    Kind.WRITE: "rw",
    Kind.SEMAPHORE: "semaphore",
}
"""The directory of each kind's family (read and write locks queue together)."""

KIND_OF_FAMILY: Final[Mapping[str, Kind]] = {
    "mutex": Kind.MUTEX,
    "rw": Kind.READ,
    "semaphore": Kind.SEMAPHORE,
}
"""A family's kind as inspect reports it (``rw`` is WRITE while a writer holds)."""
