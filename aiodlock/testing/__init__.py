"""Helpers for testing code that uses aiodlock, and for testing a backend.

- :class:`History`, :class:`Hold`, :class:`HistoryError`: record every critical section (who
  held the lock, with which fencing token, from when to when) from any number of tasks or
  processes, then check that no two holders overlapped and that tokens only grew::

      history = History()
      async with locks.lock("stock") as lease:
          with history.hold("worker-1", lease.fencing_token):
              await do_work()
      history.check(max_holders=1)

- :class:`Probe`: what a backend's test code provides so the conformance suite can look
  behind the library's back (break a lock under its holder, list what a namespace left on
  the service).
- :mod:`aiodlock.testing.conformance`: the backend conformance suite, a pytest module. A test
  module containing ``from aiodlock.testing.conformance import *`` and an ``aiodlock_url``
  fixture runs every test of it against that backend (see that module). It is the only part
  of aiodlock that imports pytest; importing :mod:`aiodlock.testing` does not.
"""

from ._history import History, HistoryError, Hold
from ._probe import Probe

__all__ = ["History", "HistoryError", "Hold", "Probe"]
