"""Backends: one module per coordination service, all implementing :class:`Backend`."""

from ._protocol import (
    Backend as Backend,
    Busy as Busy,
    Capability as Capability,
    Grant as Grant,
    Kind as Kind,
    LockSpec as LockSpec,
    Waiter as Waiter,
)

__all__ = ["Backend", "Busy", "Capability", "Grant", "Kind", "LockSpec", "Waiter"]
