"""The README's Development section: the newcomer's path and a third party's conformance module.

- ``pip install -e '.[dev]' && pytest -m memory`` needs no driver: collection imports none.
- ``import aiodlock.testing`` does not import pytest (only ``.conformance`` does).
- The README's five-line test module runs the shipped conformance suite from outside this
  project (no conftest, pytest-asyncio's strict mode, ``--strict-markers``).
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

import pytest

pytestmark = pytest.mark.memory

ROOT = Path(__file__).resolve().parent.parent
DRIVERS = ("redis", "hiredis", "aiozk", "aiomysql", "pymysql")
OPTIONAL = (*DRIVERS, "opentelemetry")  # never imported by `import aiodlock` (FastAPI may)


def python(code: str, *, cwd: Path = ROOT, timeout: float = 300) -> CompletedProcess[str]:
    """Run ``python -W error -c CODE`` (outside this pytest session); the finished process."""
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_importing_aiodlock_testing_does_not_import_pytest() -> None:
    result = python(
        "import sys, aiodlock, aiodlock.testing, aiodlock.backends\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in"
        f" ('pytest', '_pytest', 'pytest_asyncio', *{OPTIONAL!r}))\n"
        "assert not loaded, loaded\n"
    )
    assert result.returncode == 0, result.stderr


def test_memory_tests_are_collected_without_any_driver() -> None:
    """What a newcomer's fresh venv does, with every driver made unimportable."""
    result = python(
        "import sys\n"
        f"for name in {DRIVERS!r}:\n"
        "    sys.modules[name] = None  # import fails as if not installed\n"
        "import pytest\n"
        "sys.exit(pytest.main(['--collect-only', '-q', '-m', 'memory', '-p', 'no:cacheprovider',"
        " 'tests']))\n"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    collected = re.search(r"(\d+)/(\d+) tests collected", result.stdout)
    assert collected is not None, result.stdout
    assert int(collected[1]) > 100  # the memory backend's conformance run among them


def readme_conformance_module() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    (module,) = [b for b in blocks if "aiodlock.testing.conformance import *" in b]
    return str(module)


def test_readme_conformance_module_runs_the_suite_from_outside(tmp_path: Path) -> None:
    module = readme_conformance_module()
    assert len(module.strip().splitlines()) <= 8
    (tmp_path / "test_outside_backend.py").write_text(module, encoding="utf-8")
    args = [
        "--strict-markers",
        "-p", "no:cacheprovider",
        "-o", "asyncio_mode=strict",
        "-o", "asyncio_default_fixture_loop_scope=function",
        "-q", "-rs",
        "test_outside_backend.py",
    ]  # fmt: skip
    result = python(f"import sys, pytest; sys.exit(pytest.main({args!r}))", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed is not None and int(passed[1]) > 60, summary
    assert "failed" not in summary and "error" not in summary, summary
    # Without a probe (or other processes, on memory://), tests skip and say why.
    reasons = set(re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", result.stdout, re.MULTILINE))
    assert reasons <= {
        "needs an aiodlock_probe fixture to break a lock under its holder",
        "the memory:// backend lives in one process: no other process can reach it",
    }, reasons


def test_ci_runs_the_readme_commands_verbatim() -> None:
    """CI must run what a newcomer runs: the Quick start's two commands are ./dev's, and the
    test command is the last line of .ci/run."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.+?)\n```", quick_start)
    assert commands == ["./dev demo", "./dev test"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == "./dev test"
    assert os.access(ROOT / "dev", os.X_OK)


def test_dev_says_how_to_use_it() -> None:
    result = subprocess.run(
        [str(ROOT / "dev")], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2
    assert "./dev demo" in result.stderr and "./dev test" in result.stderr


@pytest.mark.memory
def test_the_sessions_the_readme_names_exist() -> None:
    """``./dev test`` runs the nox sessions ``lint`` and ``tests``, ``./dev test quick`` the
    session ``quick``: a noxfile that lost one would fail CI only at its very end."""
    import nox.registry

    runpy.run_path(str(ROOT / "noxfile.py"))
    assert {"lint", "tests", "quick"} <= set(nox.registry.get())
