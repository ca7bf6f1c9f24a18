"""Development sessions: ``python3 -m nox -s lint tests`` is what CI and the README run.

- ``tests``: installs the server binaries (``scripts/install-system-deps.sh``) and the project
  with every extra, then runs pytest once, every async test under the default asyncio loop
  and under uvloop, spread over parallel workers with servers of their own (pytest-xdist),
  with ``--require-all-backends`` (a backend server that cannot start, or a skipped test, is
  a failure). Extra arguments go to pytest: ``nox -s tests -- -k redis -x``.
- ``quick``: the inner loop while developing: lint, then memory and single-node Redis tests.
- ``lint``: ``ruff check`` and ``mypy`` (strict; configured in pyproject.toml).
- ``demo``: ``python -m aiodlock demo``.
- ``bench``: ``benchmarks/run.py``, once it exists.

Virtualenvs use the stdlib ``venv`` (uv may be absent) and are reused between runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import nox
import nox.command

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"  # the current spelling of reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).parent
INSTALL_SYSTEM_DEPS = ("bash", str(ROOT / "scripts" / "install-system-deps.sh"))
# Most tests wait on servers and timers rather than compute, so three workers per core pay
# (2 cores: 9 min for both loops, against 40 for the two loops one after the other). Each
# worker is a pytest session with servers of its own (tests/conftest.py), ~1 GB with its
# ZooKeeper JVMs, hence the cap. Each async test runs once per loop, in any worker.
_DEFAULT_WORKERS = min(8, 3 * (os.cpu_count() or 1))
WORKERS = (
    "--numprocesses", os.environ.get("AIODLOCK_TEST_WORKERS", str(_DEFAULT_WORKERS)),
    "--dist", "worksteal",
)  # fmt: skip
# `quick`: the memory backend, and Redis on one node (no Sentinel, Cluster or Redlock).
QUICK_TESTS = ("-m", "memory or redis", "-k", "not sentinel and not cluster and not redlock")


Step = tuple[Sequence[str], Mapping[str, str]]  # (argv, extra environment)


def run_all(session: nox.Session, steps: Sequence[Step]) -> None:
    """Run every step even when one fails, then fail the session naming the failed steps.

    Only exit code 0 passes a step.
    """
    failed = []
    for argv, env in steps:
        try:
            session.run(*argv, env=dict(env))
        except nox.command.CommandFailed:
            failed.append(" ".join([*(f"{k}={v}" for k, v in env.items()), argv[0]]))
    if failed:
        message = f"failed: {'; '.join(failed)}"
        session.warn(message)
        raise nox.command.CommandFailed(message)  # reported as "failed", not "aborted"


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite against real servers, under both event loops, in parallel workers."""
    session.run(*INSTALL_SYSTEM_DEPS, external=True)
    session.install("-e", ".[all,dev]")
    # Only exit code 0 passes: pytest's 5 ("no tests collected") fails the session. The 20
    # slowest tests are listed at the end: what to make faster when the run grows.
    session.run("pytest", "--require-all-backends", "--durations=20", *WORKERS, *session.posargs)


@nox.session
def quick(session: nox.Session) -> None:
    """The inner loop while developing: lint, then the memory and single-node Redis tests on
    the default loop. Not a substitute for ``tests`` before a push."""
    session.run(*INSTALL_SYSTEM_DEPS, external=True)
    session.install("-e", ".[all,dev]")
    steps: list[Step] = [
        (["ruff", "check", "."], {}),
        (["mypy"], {}),
        (["pytest", *WORKERS, *QUICK_TESTS, *session.posargs], {"AIODLOCK_TEST_LOOP": "asyncio"}),
    ]
    run_all(session, steps)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, then mypy --strict (files and options from pyproject.toml)."""
    session.install("-e", ".[all,dev]")
    run_all(session, [(["ruff", "check", "."], {}), (["mypy"], {})])  # mypy runs even if ruff fails


@nox.session
def demo(session: nox.Session) -> None:
    """Run the CLI demo."""
    session.install("-e", ".[all]")
    session.run("python", "-m", "aiodlock", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks (benchmarks/run.py) against real servers."""
    script = ROOT / "benchmarks" / "run.py"
    if not script.exists():
        session.skip(f"{script.relative_to(ROOT)} does not exist yet")
    session.run(*INSTALL_SYSTEM_DEPS, external=True)
    session.install("-e", ".[all,dev]")
    requirements = ROOT / "benchmarks" / "requirements.txt"
    if requirements.exists():  # the incumbents the benchmark compares against
        session.install("-r", str(requirements))
    session.run("python", str(script), *session.posargs)
