"""Our own holder of a turn-taking mutex, and the local waiters it refused without a node.

While a task of ours holds a mutex, the task whose turn it is waits without a node: the
server would queue it behind our holder and answer its create, listing and watch during
the critical section (docs/zookeeper.md, "Queueing: local turns and fair"). The holder's
release or loss wakes the waiters it refused.

Example::

    if local.held(entry.directory):
        local.refuse(entry.key)
"""

from __future__ import annotations

from .. import LocalHolders
from ._context import ZKContext
from ._state import Entry, turn_taking_mutex

__all__ = ["LocalMutex"]


class LocalMutex:
    """Per directory: the mutex holder of ours, and the waiters it refused (see above)."""

    __slots__ = ("_ctx", "_holders", "_refused")

    def __init__(self, ctx: ZKContext) -> None:
        self._ctx = ctx
        self._holders: LocalHolders[str, Entry] = LocalHolders()
        self._refused: dict[str, set[tuple[str, str]]] = {}

    def hold(self, entry: Entry) -> None:
        """``entry`` was granted: if it is a turn-taking mutex, it holds here."""
        if turn_taking_mutex(entry):
            self._holders.hold(entry.directory, entry)

    def held(self, directory: str) -> bool:
        """Whether an acquisition of ours holds the mutex of ``directory`` now."""
        return self._holders.held(directory, alive=_holding)

    def refuse(self, key: tuple[str, str]) -> None:
        """The waiter of ``key`` was refused while our holder holds: wake it when it stops."""
        self._refused.setdefault(key[0], set()).add(key)

    def forget(self, key: tuple[str, str]) -> None:
        """The waiter of ``key`` left."""
        refused = self._refused.get(key[0])
        if refused is not None:
            refused.discard(key)
            if not refused:
                del self._refused[key[0]]

    def unhold(self, entry: Entry) -> None:
        """``entry`` no longer holds its mutex: wake the waiters it refused."""
        if not turn_taking_mutex(entry):
            return
        self._holders.unhold(entry.directory, entry)
        for key in self._refused.pop(entry.directory, ()):
            waiter = self._ctx.waiters.get(key)
            if waiter is not None:
                waiter.wake()

    def clear(self) -> None:
        self._holders.clear()
        self._refused.clear()


def _holding(entry: Entry) -> bool:
    return entry.holding
