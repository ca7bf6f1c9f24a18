"""Re-checks of the Redis backend's pub/sub waiters that need no round trip: :class:`Rechecks`.

Example::

    rechecks.sent(owner, hub.subscription(channel))  # as its attempt is sent
    rechecks.refused(owner, busy)
    rechecks.joined(owner, hub.subscription(channel))  # once its waiter is armed
    rechecks.answer(owner)  # the refusal again: nothing can have been missed
"""

from __future__ import annotations

from .. import Busy

__all__ = ["Rechecks"]


class Rechecks:
    """Waiters (pub/sub mode: fair ones, and mutex waiters whose client registers) whose
    re-check may be answered without a round trip.

    The core re-checks right after arming a wakeup, because a release between the refused
    attempt and the arming would otherwise be missed. A fair waiter's wakeup is addressed to
    it by owner id, a mutex waiter's to its client (which its refusal registered, on the
    client's own channel); when that channel was live before the attempt was sent, and is
    still the same subscription once the waiter is armed, every such wakeup published after
    the attempt has reached the hub, which keeps it for the waiter (``PubSubHub.expect``).
    Then nothing can have been missed, and the re-check is the attempt's own refusal again
    -- one round trip fewer for every waiter, which a storm of short-lived waiters feels.
    The refusal's ``retry_after`` still bounds the wait (a holder that crashed publishes
    nothing).
    """

    __slots__ = ("_by_owner",)

    def __init__(self) -> None:
        # owner -> (the live subscription when its attempt was sent, the refusal or None,
        # whether its waiter joined while that subscription was still live)
        self._by_owner: dict[str, tuple[int, Busy | None, bool]] = {}

    def sent(self, owner: str, subscription: int) -> None:
        self._by_owner[owner] = (subscription, None, False)

    def refused(self, owner: str, busy: Busy) -> bool:
        """Note ``owner``'s refusal; False if its attempt was not sent on a live channel."""
        entry = self._by_owner.get(owner)
        if entry is None:
            return False
        self._by_owner[owner] = (entry[0], busy, False)
        return True

    def joined(self, owner: str, subscription: int) -> None:
        entry = self._by_owner.get(owner)
        if entry is None:
            return
        if entry[1] is None or entry[0] != subscription:
            del self._by_owner[owner]
        else:
            self._by_owner[owner] = (entry[0], entry[1], True)

    def answer(self, owner: str) -> Busy | None:
        """The refusal that answers ``owner``'s re-check, once; None: ask the server."""
        entry = self._by_owner.pop(owner, None)
        if entry is None or not entry[2]:
            return None
        return entry[1]

    def drop(self, owner: str) -> None:
        self._by_owner.pop(owner, None)
