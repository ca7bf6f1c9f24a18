"""Development sessions: ``python3 -m nox -s lint tests docs`` is what CI and the README run.

- ``tests``: installs the server binaries (``scripts/install-system-deps.sh``) and the project
  with every extra, then runs pytest once, every async test under the default asyncio loop
  and under uvloop, spread over parallel workers with servers of their own (pytest-xdist),
  with ``--require-all-backends`` (a backend server that cannot start, or a skipped test, is
  a failure). Extra arguments go to pytest: ``nox -s tests -- -k redis -x``.
- ``quick``: the inner loop while developing: lint, then memory and single-node Redis tests.
- ``lint``: ``ruff check`` and ``mypy`` (strict; configured in pyproject.toml).
- ``docs``: the documentation site (MkDocs, mkdocs.yml) built into ``site/`` in strict mode.
- ``demo``: ``python -m aiodlock demo``.
- ``bench``: ``benchmarks/run.py``, once it exists.

Virtualenvs use the stdlib ``venv`` (uv may be absent) and are reused between runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import nox
import nox.command

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"  # the current spelling of reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests", "docs"]

ROOT = Path(__file__).parent
INSTALL_SYSTEM_DEPS = ("bash", str(ROOT / "scripts" / "install-system-deps.sh"))
# One worker per core. Most tests wait on servers and timers rather than compute, so more
# workers were faster (2 cores: 12 min with six, 20 with four, 33 with two), but every worker
# runs servers of its own (tests/conftest.py: Redis, a Cluster, Sentinels, MariaDB,
# PostgreSQL, etcd, and four ZooKeeper JVMs), and on a slow host more than one per core
# starved them and the event loops for seconds: 1 to 10 timing failures per run with four
# or six (storms whose 5 s leases ran out, a 1 s stall read as a late renewal); with two,
# none of that kind. Each async test runs once per loop, in any worker; the cap bounds the memory.
_DEFAULT_WORKERS = min(8, os.cpu_count() or 1)
WORKERS = (
    "--numprocesses", os.environ.get("AIODLOCK_TEST_WORKERS", str(_DEFAULT_WORKERS)),
    "--dist", "worksteal",
)  # fmt: skip
# The site's tools, pinned: a new release cannot break `mkdocs build --strict` unannounced.
DOCS_REQUIREMENTS = (
    "mkdocs==1.6.1",
    "mkdocs-material==9.8.2",
    "mkdocstrings[python]==1.0.8",
    "mkdocstrings-python==2.0.11",
)
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
def docs(session: nox.Session) -> None:
    """Build the documentation site into ``site/`` with ``mkdocs build --strict``: a broken link,
    anchor or API reference fails the session. The API reference is read from the source
    (mkdocstrings' static analysis), so the project is not installed. Extra arguments go to
    ``mkdocs build``."""
    session.install(*DOCS_REQUIREMENTS)
    # NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2 is not about this build.
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})
    # mkdocs cannot tell a Sphinx role left as text from prose: look for one ourselves.
    api = Path("site/api/index.html").read_text(encoding="utf-8")
    if left := re.findall(r":(?:class|meth|func|attr|data|exc):(?:<code>|`)[^<`]*", api):
        session.error(f"Sphinx roles rendered as text on the API page: {sorted(set(left))[:5]}")


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
