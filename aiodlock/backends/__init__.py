"""What a backend author needs: the protocol, its values, URL parsing and the registry.

A backend is a class implementing :class:`Backend`, registered under the entry-point group
``aiodlock.backends`` by URL scheme (see :mod:`aiodlock.backends._registry`). Its tests run the
shipped conformance suite: ``from aiodlock.testing.conformance import *`` plus an
``aiodlock_url`` fixture.

Example::

    from aiodlock.backends import load_backend
    load_backend("redis").capabilities
"""

from .._url import ParsedURL as ParsedURL, parse_url as parse_url
from ._protocol import (
    Backend as Backend,
    Breaker as Breaker,
    Busy as Busy,
    Capability as Capability,
    Grant as Grant,
    HolderInfo as HolderInfo,
    Inspector as Inspector,
    Kind as Kind,
    LockInfo as LockInfo,
    LockSpec as LockSpec,
    LossSignal as LossSignal,
    Noticeboard as Noticeboard,
    Settler as Settler,
    TurnObserver as TurnObserver,
    Waiter as Waiter,
)
from ._registry import load as load_backend, schemes as schemes

__all__ = [
    "Backend",
    "Breaker",
    "Busy",
    "Capability",
    "Grant",
    "HolderInfo",
    "Inspector",
    "Kind",
    "LockInfo",
    "LockSpec",
    "LossSignal",
    "Noticeboard",
    "ParsedURL",
    "Settler",
    "TurnObserver",
    "Waiter",
    "load_backend",
    "parse_url",
    "schemes",
]
