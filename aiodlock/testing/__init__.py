"""Helpers for testing code that uses aiodlock, and for testing a backend.

- :class:`History` (with :class:`Hold`, :class:`HistoryError`): record every critical section
  (who held, which fencing token, from when to when) from any number of tasks or processes,
  then ``history.check(max_holders=1)``: no two holders overlapped, tokens only grew.
- :func:`abandon` (a holder crashes: no renewal, no release) and :func:`settle` (wait for the
  client's background clean-ups): fault injection and quiescence for tests.
- :class:`Probe`: what a backend's tests provide so the conformance suite can look behind the
  library's back (break a lock under its holder, list what a namespace left on the service).
- :mod:`aiodlock.testing.conformance`: the backend conformance suite, a pytest module run with
  ``from aiodlock.testing.conformance import *`` and an ``aiodlock_url`` fixture. It is the
  only part of aiodlock that imports pytest; importing :mod:`aiodlock.testing` does not.
"""

from ._faults import abandon, settle
from ._history import History, HistoryError, Hold
from ._probe import Probe

__all__ = ["History", "HistoryError", "Hold", "Probe", "abandon", "settle"]
