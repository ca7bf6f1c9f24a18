"""Benchmarks of aiodlock side by side with the incumbent lock libraries (``nox -s bench``).

Not part of the test suite. ``python benchmarks/run.py --help`` from the repository root.

Layout, one job per module:

- ``run.py``: the command line; starts the servers and runs every cell in a child process.
- ``config.py``: the knobs (cycles, durations, repeats) of a full and a ``--quick`` run.
- ``servers.py``: the servers, started with the test harness's classes (tests/servers.py...).
- ``adapters/``: one module per library, all behind the same small interface (``base.py``);
  ``adapters/__init__.py`` is the catalogue.
- ``scenarios/``: one module per measurement; ``probes.py`` looks at the servers.
- ``worker.py``: the child-process entry point that runs one cell and prints its result.
- ``machine.py``, ``stats.py``, ``targets.py``, ``report.py``, ``chart.py``: the machine, the
  numbers, the issue's targets checked against them, the outputs.
"""
