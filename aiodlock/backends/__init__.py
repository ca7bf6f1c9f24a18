"""What a backend author needs, and all an in-tree backend imports from outside its family.

A backend is a class implementing :class:`Backend`, registered under the entry-point group
``aiodlock.backends`` by URL scheme. Besides the protocol and its values, this surface has the
tools every backend uses: the exceptions to raise, argument checks, URL parsing, the option
vocabulary and TLS contexts, per-request deadlines, a banked wakeup, the local-holder table,
and :class:`Tasks` (the backend's share of the client's task group). Its tests run the shipped
conformance suite: ``from aiodlock.testing.conformance import *`` plus an ``aiodlock_url``
fixture. docs/architecture.md shows how the engines of each backend family plug in.

Example::

    from aiodlock.backends import load_backend
    load_backend("redis").capabilities
"""

from .._exceptions import (
    BackendError as BackendError,
    LimitMismatchError as LimitMismatchError,
    LockError as LockError,
    LockTimeoutError as LockTimeoutError,
    UnsupportedError as UnsupportedError,
)
from .._url import ParsedURL as ParsedURL, parse_url as parse_url
from .._validate import (
    check_bool as check_bool,
    check_name as check_name,
    check_namespace as check_namespace,
    check_seconds as check_seconds,
    check_timeout as check_timeout,
)
from ._deadlines import EARLY as EARLY, Deadlines as Deadlines, Limit as Limit
from ._local_holders import LocalHolders as LocalHolders
from ._options import (
    VOCABULARY as VOCABULARY,
    Options as Options,
    canonical as canonical_options,
    with_aliases as with_aliases,
)
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
    NamespaceLister as NamespaceLister,
    Noticeboard as Noticeboard,
    Settler as Settler,
    TurnObserver as TurnObserver,
    Waiter as Waiter,
)
from ._registry import load as load_backend, schemes as schemes
from ._tasks import Tasks as Tasks, retrieve as retrieve
from ._tls import TLS_ALIASES as TLS_ALIASES, TLS_OPTIONS as TLS_OPTIONS, tls_context as tls_context
from ._wakeup import BankedWakeup as BankedWakeup

__all__ = [
    "EARLY",
    "TLS_ALIASES",
    "TLS_OPTIONS",
    "VOCABULARY",
    "Backend",
    "BackendError",
    "BankedWakeup",
    "Breaker",
    "Busy",
    "Capability",
    "Deadlines",
    "Grant",
    "HolderInfo",
    "Inspector",
    "Kind",
    "Limit",
    "LimitMismatchError",
    "LocalHolders",
    "LockError",
    "LockInfo",
    "LockSpec",
    "LockTimeoutError",
    "LossSignal",
    "NamespaceLister",
    "Noticeboard",
    "Options",
    "ParsedURL",
    "Settler",
    "Tasks",
    "TurnObserver",
    "UnsupportedError",
    "Waiter",
    "canonical_options",
    "check_bool",
    "check_name",
    "check_namespace",
    "check_seconds",
    "check_timeout",
    "load_backend",
    "parse_url",
    "retrieve",
    "schemes",
    "tls_context",
    "with_aliases",
]
