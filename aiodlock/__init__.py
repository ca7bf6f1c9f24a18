"""aiodlock: asyncio-native distributed locks.

One API over Redis, ZooKeeper, etcd, MySQL, PostgreSQL and an in-process backend, with fencing
tokens on every grant, a watchdog that cancels the guarded code when the lease is lost, and
waiters woken by the service instead of sleep-polling::

    import aiodlock

    async with aiodlock.connect("redis://127.0.0.1:6379/0", namespace="shop") as locks:
        async with locks.lock("order:42", timeout=5) as lease:
            await ship(42, fencing_token=lease.fencing_token)
"""

import logging as _logging

from ._client import ClientStatistics as ClientStatistics, LockClient as LockClient
from ._connect import connect
from ._exceptions import (
    BackendError as BackendError,
    LimitMismatchError as LimitMismatchError,
    LockError as LockError,
    LockLostError as LockLostError,
    LockNotOwnedError as LockNotOwnedError,
    LockTimeoutError as LockTimeoutError,
    StaleTokenError as StaleTokenError,
    UnsupportedError as UnsupportedError,
)
from ._fencing import FencingGuard as FencingGuard
from ._leader import Election as Election, Term as Term
from ._lease import Lease as Lease
from ._locks import (
    BaseLock as BaseLock,
    Lock as Lock,
    LockStatistics as LockStatistics,
    ReadLock as ReadLock,
    Semaphore as Semaphore,
    WriteLock as WriteLock,
)
from ._stats import NameStatistics as NameStatistics
from ._template import NameTemplate as NameTemplate
from ._validate import MIN_TTL, USE_CLIENT_DEFAULT, UseClientDefault as UseClientDefault
from .backends._protocol import (
    Capability as Capability,
    HolderInfo as HolderInfo,
    Kind as Kind,
    LockInfo as LockInfo,
)

__version__ = "0.1.0"

__all__ = [  # noqa: RUF022 - plain sorted(), as tests/test_api.py checks
    "BackendError",
    "BaseLock",
    "Capability",
    "ClientStatistics",
    "Election",
    "FencingGuard",
    "HolderInfo",
    "Kind",
    "Lease",
    "LimitMismatchError",
    "Lock",
    "LockClient",
    "LockError",
    "LockInfo",
    "LockLostError",
    "LockNotOwnedError",
    "LockStatistics",
    "LockTimeoutError",
    "MIN_TTL",
    "NameStatistics",
    "NameTemplate",
    "ReadLock",
    "Semaphore",
    "StaleTokenError",
    "Term",
    "USE_CLIENT_DEFAULT",
    "UnsupportedError",
    "UseClientDefault",
    "WriteLock",
    "connect",
]

for _name in __all__:
    _obj = globals()[_name]
    if callable(_obj) and _obj.__module__.startswith("aiodlock."):
        _obj.__module__ = "aiodlock"
del _name, _obj

# A library leaves its records to the application's logging setup: without one, Python's
# last-resort handler would print our warnings on stderr (a lost lease is raised as
# LockLostError anyway). docs/operations.md shows how to see them.
_logging.getLogger("aiodlock").addHandler(_logging.NullHandler())
