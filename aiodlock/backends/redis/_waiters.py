"""Which wakeup a waiting acquisition arms: a pub/sub waiter on the lock's channel, or a BLPOP
waiter on its signal list (:mod:`._pubsub`, :mod:`._sharded`, :mod:`._blpop`).

A mutex waiter (fair ones too) listens on its own client's channel of the lock, where a
release hands the lock on; semaphore and reader/writer waiters share the lock's channel.

Example::

    waiter = plain_waiter(hub, None, b"client-id", spec, owner)
"""

from __future__ import annotations

from .. import Kind, LockSpec
from ._blpop import BlockingSignals, BlpopWaiter
from ._keys import keys_for
from ._pubsub import PubSubHub, PubSubWaiter
from ._sharded import ShardedHub, ShardedWaiter

__all__ = ["plain_waiter"]


def plain_waiter(
    hub: PubSubHub | ShardedHub | None,
    signals: BlockingSignals | None,
    client: bytes,
    spec: LockSpec,
    owner: str,
) -> PubSubWaiter | ShardedWaiter | BlpopWaiter:
    """The wakeup of ``owner``'s wait for ``spec``: on ``hub`` (pub/sub) when there is one,
    else on ``signals`` (BLPOP)."""
    keys = keys_for(spec.namespace, spec.name)
    kind = spec.kind
    if hub is not None:
        if kind is Kind.MUTEX:
            # Fair waiters too: a release wakes the head on its client's channel.
            return hub.waiter(keys.client_signal(client), owner)
        if kind is Kind.SEMAPHORE:
            return hub.waiter(keys.sem_signal, owner)
        return hub.waiter(keys.rw_signal, owner)
    assert signals is not None
    if kind is Kind.MUTEX:
        if spec.fair:
            return signals.waiter(keys.owner_signal(owner), owner, registry=None)
        return signals.waiter(keys.signal, owner, registry=keys.mutex_waiters, lists=(keys.signal,))
    if kind is Kind.SEMAPHORE:
        return signals.waiter(
            keys.sem_signal,
            owner,
            registry=keys.sem_waiters,
            lists=(keys.sem_signal,),
            cap=spec.limit,
        )
    rw_lists = (keys.rw_signal, keys.rsignal)
    if kind is Kind.READ:
        return signals.waiter(
            keys.rsignal, owner, registry=keys.rw_waiters, lists=rw_lists, reader=True
        )
    return signals.waiter(keys.rw_signal, owner, registry=keys.rw_waiters, lists=rw_lists)
