"""The :class:`Probe` protocol: a backend's test code looking behind the library's back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from aiodlock import LockClient

__all__ = ["Probe"]


class Probe(Protocol):
    """Reaches the coordination service with its own plain client, never through aiodlock.

    The conformance suite uses it to destroy a lock under its holder, as an operator, an
    expiry or a failover would, and to check that nothing (key, channel, node, connection,
    queue entry) was left behind. A test module provides one through its ``aiodlock_probe``
    fixture; the suite calls :meth:`aclose` when the test ends.

    Example (an in-process service)::

        class MyProbe:
            async def break_lock(self, client, namespace, name):
                assert await client.backend.break_lock(...) > 0, "nothing to break"
            async def leftovers(self, namespace):
                return [key for key in my_service.keys() if key.startswith(namespace + ":")]
            async def aclose(self):
                pass
    """

    async def break_lock(self, client: LockClient, namespace: str, name: str) -> None:
        """Destroy every holder's state of ``name`` (every lock kind); fail (``assert``) if
        there was nothing to destroy. ``client`` is the holder's client."""
        ...

    async def leftovers(self, namespace: str) -> list[str]:
        """A readable line per thing ``namespace`` still has on the service, fencing counters
        excepted (they outlive the locks by design); ``[]`` when it is clean."""
        ...

    async def aclose(self) -> None:
        """Close the probe's own connections."""
        ...
