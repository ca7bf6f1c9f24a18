"""Fault injection and quiescence for tests: crash a holder, wait for background clean-ups."""

from __future__ import annotations

from .. import Lease, LockClient
from .._client import abandon_lease, settle_client

__all__ = ["abandon", "settle"]


def abandon(locks: LockClient, lease: Lease) -> None:
    """Stop keeping ``lease`` (taken from ``locks``) alive, without releasing it: a crash.

    The service ends the lease by expiry (TTL backends) or by ending its session. For
    fault-injection tests of code that must survive a crashed holder; a running program
    releases its leases instead::

        lease = await locks.lock("job", ttl=1).acquire()
        aiodlock.testing.abandon(locks, lease)  # the "process" dies: no renewal, no release
    """
    abandon_lease(locks, lease)


async def settle(locks: LockClient) -> None:
    """Wait until the compensating releases ``locks`` runs in the background are done.

    They run after a cancelled acquire or release, and in backends that clean up in the
    background (giving back a wakeup, leaving a wait queue); a test (or a shutdown hook) that
    wants to see the service in its final state awaits this first::

        await aiodlock.testing.settle(locks)
    """
    await settle_client(locks)
