"""A history recorder and its checker (re-exported by :mod:`aiodlock.testing`).

Record every critical section (who held it, with which fencing token, from when to when on
the system-wide monotonic clock), from any number of tasks or processes, then check that no
two holders overlapped and that tokens only grew::

    history = History()
    async with locks.lock("stock") as lease:
        with history.hold("worker-1", lease.fencing_token):
            await do_work()
    history.check(max_holders=1)

``time.monotonic()`` is CLOCK_MONOTONIC on Linux, shared by every process of the machine, so
holds recorded in child processes (``Hold.to_json`` / ``History.from_json_lines``) compare
with the parent's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import pairwise

__all__ = ["History", "HistoryError", "Hold"]


class HistoryError(AssertionError):
    """The recorded history breaks mutual exclusion or fencing order."""


@dataclass(frozen=True, slots=True)
class Hold:
    """One critical section: ``holder`` held the lock with ``token`` from ``start`` to ``end``."""

    holder: str
    token: int
    start: float
    end: float

    def to_json(self) -> str:
        """One JSON line, for holds recorded in another process."""
        return json.dumps(asdict(self))


@dataclass
class History:
    """A list of :class:`Hold` records and the checks that matter for a lock."""

    holds: list[Hold] = field(default_factory=list)

    @contextmanager
    def hold(self, holder: str, token: int) -> Iterator[None]:
        """Record the enclosed block as one hold (recorded even if the block raises)."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.holds.append(Hold(holder, token, start, time.monotonic()))

    @classmethod
    def from_json_lines(cls, lines: Iterable[str]) -> History:
        """Rebuild a history from :meth:`Hold.to_json` lines (blank lines are ignored)."""
        return cls([Hold(**json.loads(line)) for line in lines if line.strip()])

    def extend(self, other: History) -> None:
        """Merge another history (another process's) into this one."""
        self.holds.extend(other.holds)

    def max_concurrency(self) -> int:
        """The largest number of holds that overlapped at one instant."""
        events = sorted(
            [(h.start, 1) for h in self.holds] + [(h.end, -1) for h in self.holds],
            key=lambda e: (e[0], e[1]),  # at a tie, an end comes before a start
        )
        level = peak = 0
        for _, delta in events:
            level += delta
            peak = max(peak, level)
        return peak

    def check(self, *, max_holders: int = 1) -> None:
        """Raise :class:`HistoryError` unless at most ``max_holders`` held at once and, for a
        mutex, fencing tokens strictly increase in the order the holds began."""
        peak = self.max_concurrency()
        if peak > max_holders:
            raise HistoryError(f"{peak} holders overlapped; at most {max_holders} allowed")
        if max_holders == 1:
            ordered = sorted(self.holds, key=lambda h: h.start)
            for before, after in pairwise(ordered):
                if after.token <= before.token:
                    raise HistoryError(
                        f"token {after.token} of {after.holder} followed token "
                        f"{before.token} of {before.holder}: fencing order broken"
                    )
        tokens = [h.token for h in self.holds]
        if len(set(tokens)) != len(tokens):
            raise HistoryError("a fencing token was handed out twice")
