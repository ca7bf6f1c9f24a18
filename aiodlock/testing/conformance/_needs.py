"""What a test of the suite needs beyond a backend: capabilities, a probe, other processes.

Declared on the test function as attributes (not markers), so the suite runs in projects that
use ``--strict-markers`` without registering anything; :func:`unmet_needs` reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import pytest

import aiodlock
from aiodlock.backends import Capability, Kind, load_backend

__all__ = [
    "KINDS",
    "AnyLock",
    "LockKind",
    "in_process",
    "needs_probe",
    "needs_processes",
    "requires",
    "unmet_needs",
    "wants_probe",
]

_Test = TypeVar("_Test", bound=Callable[..., Any])
AnyLock = aiodlock.Lock | aiodlock.ReadLock | aiodlock.WriteLock | aiodlock.Semaphore

_REQUIRES: Final = "aiodlock_requires"
_NEEDS_PROBE: Final = "aiodlock_needs_probe"
_NEEDS_PROCESSES: Final = "aiodlock_needs_processes"


def requires(*capabilities: Capability) -> Callable[[_Test], _Test]:
    """Declare the capabilities a test needs beyond those of its lock kind.

    A function attribute rather than a marker, so the suite runs in projects that use
    ``--strict-markers`` without registering anything.
    """

    def mark(test: _Test) -> _Test:
        setattr(test, _REQUIRES, frozenset(capabilities) | getattr(test, _REQUIRES, frozenset()))
        return test

    return mark


def needs_probe(test: _Test) -> _Test:
    """Declare that ``test`` breaks a lock under its holder (it needs an ``aiodlock_probe``)."""
    setattr(test, _NEEDS_PROBE, True)
    return test


def wants_probe(test: object) -> bool:
    """Whether ``test`` was declared with :func:`needs_probe`."""
    return bool(getattr(test, _NEEDS_PROBE, False))


def needs_processes(test: _Test) -> _Test:
    """Declare that ``test`` runs holders in other processes (not on an in-process backend)."""
    setattr(test, _NEEDS_PROCESSES, True)
    return test


def in_process(scheme: str) -> bool:
    """Whether a backend lives in one process (another process cannot reach its locks)."""
    return scheme == "memory"


def unmet_needs(item: pytest.Item, scheme: str) -> str | None:
    """Why ``item`` cannot run on the backend of ``scheme``, or ``None`` if it can.

    Counts the capabilities of the test's lock kind (the ``make`` parameter), those declared
    with :func:`requires` or with a ``requires(*capabilities)`` marker (for projects that
    register one), and whether it needs other processes. For a project's
    ``pytest_collection_modifyitems``, to deselect instead of skipping at run time.
    """
    function = getattr(item, "function", None)
    callspec = getattr(item, "callspec", None)
    kind = callspec.params.get("make") if callspec is not None else None
    needed = set(getattr(function, _REQUIRES, frozenset()))
    for marker in item.iter_markers("requires"):
        needed.update(marker.args)
    if isinstance(kind, str) and kind in KINDS:
        needed |= KINDS[kind].needs
    return _unmet(needed, bool(getattr(function, _NEEDS_PROCESSES, False)), scheme)


def _unmet(needed: set[Capability], processes: bool, scheme: str) -> str | None:
    missing = needed - set(load_backend(scheme).capabilities)
    if missing:
        names = ", ".join(sorted(c.name for c in missing))
        return f"the {scheme}:// backend does not declare Capability {names}"
    if processes and in_process(scheme):
        return f"the {scheme}:// backend lives in one process: no other process can reach it"
    return None


@dataclass(frozen=True, slots=True)
class LockKind:
    """One way of building an exclusive lock (the ``make`` fixture's values)."""

    id: str
    kind: Kind
    fair: bool = False
    reentrant: bool = False

    @property
    def needs(self) -> frozenset[Capability]:
        return self.kind.required | ({Capability.FAIR} if self.fair else set())

    def __call__(self, client: aiodlock.LockClient, name: str, **options: Any) -> AnyLock:
        """The lock ``name`` of this kind on ``client`` (``options``: ttl, timeout...)."""
        if self.kind is Kind.WRITE:
            return client.write_lock(name, **options)
        if self.kind is Kind.SEMAPHORE:
            return client.semaphore(name, limit=1, **options)
        return client.lock(name, fair=self.fair, reentrant=self.reentrant, **options)


KINDS: Final[Mapping[str, LockKind]] = {
    k.id: k
    for k in (
        LockKind("mutex", Kind.MUTEX),
        LockKind("reentrant", Kind.MUTEX, reentrant=True),
        LockKind("fair", Kind.MUTEX, fair=True),
        LockKind("write", Kind.WRITE),
        LockKind("semaphore1", Kind.SEMAPHORE),
    )
}
