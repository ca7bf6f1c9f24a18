"""URL scheme → backend class, through the entry-point group ``aiodlock.backends``.

A backend is found by its scheme's entry point, so a separate package adds one without
touching aiodlock: in its ``pyproject.toml``::

    [project.entry-points."aiodlock.backends"]
    consul = "aiodlock_consul:ConsulBackend [consul]"

The part in brackets names the extra that installs the backend's driver; when importing the
backend fails for lack of that driver, the error says ``pip install 'PACKAGE[extra]'``. Every
scheme of aiodlock's own backends is declared the same way, in aiodlock's ``pyproject.toml``.

Example::

    cls = load("redis")
    cls.capabilities  # frozenset({Capability.EXCLUSIVE, ...})
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

__all__ = ["GROUP", "load", "schemes"]

GROUP = "aiodlock.backends"


@functools.cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    # Cached: entry points are read from the installed distributions' metadata, which does not
    # change while the process runs.
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}


def schemes() -> list[str]:
    """The URL schemes of every installed backend, sorted (drivers need not be installed)."""
    return sorted(_entry_points())


def load(scheme: str) -> type[Any]:
    """The backend class registered for ``scheme``.

    Raises:
        ValueError: no backend is registered for ``scheme`` (the message lists the known ones;
            an empty list means aiodlock itself is not installed, e.g. run from a source tree).
        ImportError: the backend's driver is missing (the message says which extra installs it).
    """
    entry = _entry_points().get(scheme)
    if entry is None:
        known = ", ".join(f"{s}://" for s in schemes()) or (
            "none (aiodlock is not installed: pip install aiodlock, or pip install -e . "
            "in a source tree)"
        )
        raise ValueError(f"unknown URL scheme {scheme!r} in url; known schemes: {known}")
    try:
        cls: type[Any] = entry.load()
    except ImportError as exc:
        missing = exc.name or ""
        if not entry.extras or missing.startswith(entry.module.partition(".")[0]):
            raise  # a bug in the backend package itself, not a missing driver
        dist = entry.dist.name if entry.dist is not None else entry.module.partition(".")[0]
        raise ImportError(
            f"the {scheme}:// backend needs its driver: "
            f"pip install '{dist}[{','.join(entry.extras)}]'",
            name=exc.name,
        ) from exc
    return cls
