"""Who holds a queue lock, and whom a waiter watches: the Curator recipe, with no I/O.

A queue backend (ZooKeeper, etcd) keeps one directory of contenders per lock family, in the
order the service assigned them (a sequence number, a create revision). :func:`evaluate`
decides one contender's verdict from that order alone; :func:`holders` lists the contenders
granted now. The rules, and why each waiter watches what it watches: docs/architecture.md.

Example::

    queue = [Contender(7, Kind.MUTEX, 0, "a"), Contender(9, Kind.MUTEX, 0, "b")]
    evaluate(queue, "b")   # Verdict(granted=False, watch="a", behind_head=True)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence, Set
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from .. import Kind

__all__ = ["Contender", "Verdict", "evaluate", "holders"]

K = TypeVar("K", bound=Hashable)


class Contender(NamedTuple, Generic[K]):
    """One entry of a queue directory."""

    seq: int  # its place in the queue (a sequence number, a create revision)
    kind: Kind  # MUTEX, READ, WRITE or SEMAPHORE
    limit: int  # a semaphore's limit; 0 for other kinds, or a node that records none
    id: K  # its name in the directory (a node name, a key)


@dataclass(frozen=True, slots=True)
class Verdict(Generic[K]):
    """One contender's place: granted, or what to watch until its place may have changed."""

    granted: bool
    watch: K | None = None  # the contender whose deletion can change our verdict
    ahead: bool = False  # watch every contender ahead of ours (any deletion there counts)
    successor: bool = False  # a contender queues right behind ours
    behind_head: bool = False  # exclusive: only ``watch`` is ahead of us
    conflict: int | None = None  # semaphore: another limit, on a contender ahead of ours


def evaluate(
    queue: Sequence[Contender[K]],
    mine: K,
    *,
    leaving: Set[K] = frozenset(),
    chained: bool = False,
) -> Verdict[K]:
    """The verdict of the contender ``mine`` in ``queue`` (in queue order; it must be there).

    * MUTEX, WRITE: granted at the head; else watch the contender just ahead.
    * READ: granted with no WRITE ahead (later writers do not count); else watch the closest
      writer ahead.
    * SEMAPHORE of N: a contender ahead with another limit is a ``conflict``; granted among
      the first N; else watch every contender ahead (``ahead``), except that with
      ``chained`` (the adapter makes each permit granted with a successor *touch* its entry,
      which wakes that successor as a deletion would) a waiter past the first watches only
      the contender just ahead: no herd.

    ``leaving``: contenders of ours being deleted, which will never hold: they count as gone.
    """
    if leaving:
        queue = [c for c in queue if c.id == mine or c.id not in leaving]
    index = next(i for i, c in enumerate(queue) if c.id == mine)
    me = queue[index]
    successor = index + 1 < len(queue)
    if me.kind is Kind.READ:
        for i in range(index - 1, -1, -1):
            if queue[i].kind is Kind.WRITE:
                return Verdict(False, queue[i].id)
        return Verdict(True, successor=successor)
    if me.kind is Kind.SEMAPHORE:
        for i in range(index):
            theirs = queue[i].limit
            if theirs and theirs != me.limit:  # 0: a contender that records no limit
                return Verdict(False, conflict=theirs)
        if index < me.limit:
            return Verdict(True, successor=successor)
        if chained and index > me.limit:
            return Verdict(False, queue[index - 1].id)
        return Verdict(False, ahead=True)
    if index == 0:
        return Verdict(True, successor=successor)
    return Verdict(False, queue[index - 1].id, behind_head=index == 1)


def holders(queue: Sequence[Contender[K]]) -> list[Contender[K]]:
    """The contenders of ``queue`` granted now: the head of a mutex or a writer, the readers
    before the first writer, the first N of a semaphore whose head has a limit of N."""
    if not queue:
        return []
    head = queue[0]
    if head.kind is Kind.READ:
        readers = []
        for contender in queue:
            if contender.kind is not Kind.READ:
                break
            readers.append(contender)
        return readers
    if head.kind is Kind.SEMAPHORE:
        return list(queue[: max(head.limit, 1)])
    return [head]
