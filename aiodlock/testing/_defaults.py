"""The conformance suite's optional fixtures, with their defaults: a pytest plugin.

``from aiodlock.testing.conformance import *`` brings in ``pytest_plugins`` naming this
module, so these are plugin fixtures, the lowest in pytest's order: a fixture of the same name
in the test module or in any ``conftest.py`` overrides them (and may be parametrized), and
overriding one redefines no imported name (which a type checker would flag).
"""

from __future__ import annotations

from typing import Any

import pytest

from ._probe import Probe

__all__ = ["aiodlock_options", "aiodlock_probe"]


@pytest.fixture
def aiodlock_options() -> dict[str, Any]:
    """Extra ``aiodlock.connect()`` options (JSON-serialisable: the process tests pass them
    to child processes). Default: none."""
    return {}


@pytest.fixture
def aiodlock_probe() -> Probe | None:
    """The backend's :class:`~aiodlock.testing.Probe`, made afresh for each test (the suite
    closes it). Default: no probe (tests that break a lock skip; leftovers go unchecked)."""
    return None
