"""Development sessions: ``python3 -m nox -s lint tests`` is what CI and the README run.

- ``tests``: installs the server binaries (``scripts/install-system-deps.sh``) and the project
  with every extra, then runs pytest twice, under the default asyncio loop and under uvloop,
  with ``--require-all-backends`` (a backend server that cannot start, or a skipped test, is a
  failure). Extra arguments go to pytest: ``nox -s tests -- -k redis -x``.
- ``lint``: ``ruff check`` and ``mypy`` (strict; configured in pyproject.toml).
- ``demo``: ``python -m aiodlock demo``.
- ``bench``: ``benchmarks/run.py``, once it exists.

Virtualenvs use the stdlib ``venv`` (uv may be absent) and are reused between runs.
"""

from __future__ import annotations

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
EVENT_LOOPS = ("asyncio", "uvloop")  # read by tests/conftest.py from AIODLOCK_TEST_LOOP


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
    """Run the whole suite against real servers, once per event loop."""
    session.run(*INSTALL_SYSTEM_DEPS, external=True)
    session.install("-e", ".[all,dev]")
    # Both loops run even if the first fails. Only exit code 0 passes: pytest's 5
    # ("no tests collected") fails the session.
    pytest = ["pytest", "--require-all-backends", *session.posargs]
    run_all(session, [(pytest, {"AIODLOCK_TEST_LOOP": loop}) for loop in EVENT_LOOPS])


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
