"""The mysql backend in the test matrix: its server fixture, probe and target factory.

TARGETS maps backend names to target factories and SCHEMES backend names to URL schemes;
tests/conftest.py merges both into the matrix.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import Target

TARGETS: dict[str, Callable[[pytest.FixtureRequest, str], Awaitable[Target]]] = {}
SCHEMES: dict[str, str] = {}
