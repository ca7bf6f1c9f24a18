"""What a client's locks have done, in this process: totals and the newest names' figures.

Every lock object of a client records here — a grant with its wait, a timeout, a loss — so
``locks.statistics()`` shows the client's totals and, per lock name, the figures of every lock
object of that name (``locks.lock("a").statistics()`` only knows its own object). Nothing
grows with the number of names ever used: the per-name table keeps the :data:`NAMES_KEPT`
names used most recently and forgets the others.

Example::

    stats = locks.statistics()
    print(stats.grants, stats.wait_histogram[0.01])  # waits of 1 to 10 ms
    order = stats.by_name.get("order:42")  # None if unused (or forgotten) since
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

__all__ = ["NAMES_KEPT", "WAIT_BUCKETS", "ClientStatistics", "LockCounters", "NameStatistics"]

WAIT_BUCKETS: Final = (0.001, 0.01, 0.1, 1.0, 10.0, math.inf)
"""Upper bounds (seconds, inclusive) of the wait-time histogram's buckets: a wait of 5 ms is
counted under ``0.01``, one of 20 s under ``inf``."""

NAMES_KEPT: Final = 1000
"""How many lock names the per-name table keeps: the most recently used ones."""


@dataclass(frozen=True, slots=True)
class NameStatistics:
    """What the lock objects of one name (any kind) have done in this client.

    Attributes:
        grants: leases granted (a reentrant re-entry is not a grant).
        timeouts: acquisitions that gave up with :class:`~aiodlock.LockTimeoutError`.
        losses: leases lost while held (not released).
        wait_histogram: grants by how long they waited, ``{upper bound in seconds: count}``
            over :data:`WAIT_BUCKETS` (each wait counted once, in the first bucket it fits).
    """

    grants: int
    timeouts: int
    losses: int
    wait_histogram: Mapping[float, int]


@final
class _Tally:
    __slots__ = ("grants", "losses", "timeouts", "waits")

    def __init__(self) -> None:
        self.grants = 0
        self.timeouts = 0
        self.losses = 0
        self.waits = [0] * len(WAIT_BUCKETS)

    def snapshot(self) -> NameStatistics:
        return NameStatistics(
            grants=self.grants,
            timeouts=self.timeouts,
            losses=self.losses,
            wait_histogram=dict(zip(WAIT_BUCKETS, self.waits, strict=True)),
        )


@final
class LockCounters:
    """The client's recorder: totals, and an LRU table of the last :data:`NAMES_KEPT` names.

    Example::

        counters = LockCounters()
        counters.granted("a", waited=0.002)
        assert counters.name("a").wait_histogram[0.01] == 1
    """

    __slots__ = ("_names", "_total", "names_kept")

    def __init__(self, *, names_kept: int = NAMES_KEPT) -> None:
        self.names_kept = names_kept
        self._total = _Tally()
        self._names: OrderedDict[str, _Tally] = OrderedDict()

    def granted(self, name: str, *, waited: float) -> None:
        """A lease on ``name`` was granted after waiting ``waited`` seconds."""
        bucket = bisect.bisect_left(WAIT_BUCKETS, max(waited, 0.0))
        for tally in (self._total, self._of(name)):
            tally.grants += 1
            tally.waits[bucket] += 1

    def timed_out(self, name: str) -> None:
        """An acquisition of ``name`` gave up at its timeout."""
        self._total.timeouts += 1
        self._of(name).timeouts += 1

    def lost(self, name: str) -> None:
        """A lease on ``name`` was lost."""
        self._total.losses += 1
        self._of(name).losses += 1

    def totals(self) -> NameStatistics:
        """The client's totals (every name, including names the table forgot)."""
        return self._total.snapshot()

    def name(self, name: str) -> NameStatistics | None:
        """The figures of ``name``, or ``None`` if it was not used, or was forgotten, since."""
        tally = self._names.get(name)
        return None if tally is None else tally.snapshot()

    def by_name(self) -> dict[str, NameStatistics]:
        """The figures of every name kept, least recently used first."""
        return {name: tally.snapshot() for name, tally in self._names.items()}

    def _of(self, name: str) -> _Tally:
        names = self._names
        tally = names.get(name)
        if tally is None:
            tally = names[name] = _Tally()
            if len(names) > self.names_kept:
                names.popitem(last=False)  # the least recently used name
        else:
            names.move_to_end(name)
        return tally


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """What a client holds and runs now, and what its locks have done since it opened.

    Attributes:
        leases: leases held and kept alive now, however they were taken.
        cleanups: compensating releases still running in the background.
        backend: the backend's own counters (connections, subscriptions, ...).
        grants: leases granted, by every lock object of the client.
        timeouts: acquisitions that gave up with :class:`~aiodlock.LockTimeoutError`.
        losses: leases lost while held (not released).
        wait_histogram: grants by how long they waited: ``{upper bound in seconds: count}``,
            the bounds 0.001, 0.01, 0.1, 1, 10 and inf (a 5 ms wait counts under 0.01).
        by_name: per lock name (all kinds of it together), the same figures as a
            ``NameStatistics`` (grants, timeouts, losses, wait_histogram), for the 1000
            names used most recently (older names are forgotten; the totals still count
            them)::

                locks.statistics().by_name["order:42"].grants
    """

    leases: int
    cleanups: int
    backend: Mapping[str, Any]
    grants: int = 0
    timeouts: int = 0
    losses: int = 0
    wait_histogram: Mapping[float, int] = field(
        default_factory=lambda: dict.fromkeys(WAIT_BUCKETS, 0)
    )
    by_name: Mapping[str, NameStatistics] = field(default_factory=dict)
