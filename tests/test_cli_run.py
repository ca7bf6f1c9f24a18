"""``python -m aiodlock run URL NAME -- CMD``, run as a user runs it, with CMD a small Python.

The command runs as a subprocess (``-W error``) while this process watches the lock through a
client of its own. CMD talks to the test through the pipes it inherits from ``aiodlock run``:
it prints ``ready PID TOKEN`` on stdout once it is running (and has set up its signal
handling), then blocks reading stdin until the test writes a line or closes it. Every wait is
bounded, and every process a test starts is gone when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

import aiodlock
from tests.helpers import eventually, reading_stdin, wait_until
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0
NOT_ACQUIRED = 75  # EX_TEMPFAIL

READY = (
    "import os, sys; print('ready', os.getpid(), os.environ['AIODLOCK_FENCING_TOKEN'], flush=True)"
)
"""CMD's line that says it runs: its pid and the token it was given."""
WAIT = "sys.stdin.readline()"
"""CMD waiting for the test (a line on stdin, or stdin closed)."""


def namespace() -> str:
    return f"run{os.urandom(4).hex()}"


def python(*lines: str) -> list[str]:
    """CMD: ``python -c`` with these statements."""
    return [sys.executable, "-c", "\n".join(lines)]


@dataclass
class Run:
    """A running ``aiodlock run``: its process, and CMD's pid once it said ``ready``."""

    process: asyncio.subprocess.Process
    child_pid: int | None = None

    async def ready(self) -> int:
        """Wait for CMD's ``ready`` line; return the fencing token it was given."""
        assert self.process.stdout is not None
        async with asyncio.timeout(TIMEOUT):
            line = (await self.process.stdout.readline()).decode()
        word, pid, token = line.split()
        assert word == "ready", line
        self.child_pid = int(pid)
        return int(token)

    def go_on(self) -> None:
        """Let CMD's ``WAIT`` return."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")

    async def finished(self) -> tuple[int, str, str]:
        """The exit status, the rest of stdout, and stderr. Stdin stays open: CMD is not told
        to go on (``communicate()`` would close it, and CMD would exit by itself)."""
        process = self.process
        assert process.stdout is not None and process.stderr is not None
        async with asyncio.timeout(TIMEOUT):
            out, err, code = await asyncio.gather(
                process.stdout.read(), process.stderr.read(), process.wait()
            )
        return code, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def aiodlock_run(*args: str) -> AsyncIterator[Run]:
    """Start ``python -W error -m aiodlock run ARGS`` with piped stdin, stdout and stderr;
    kill whatever is left of it and of CMD when the block ends."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-W", "error", "-m", "aiodlock", "run", *args,
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    run = Run(process)
    try:
        yield run
    finally:
        assert process.stdin is not None
        process.stdin.close()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            async with asyncio.timeout(TIMEOUT):
                await process.communicate()
        if run.child_pid is not None:  # CMD outlives a killed `aiodlock run`
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.child_pid, signal.SIGKILL)


async def run_to_end(*args: str) -> tuple[int, str, str]:
    async with aiodlock_run(*args) as run:
        return await run.finished()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ---------------------------------------------------------------------- exit status


@pytest.mark.memory
@pytest.mark.parametrize("status", [0, 3])
async def test_the_exit_status_of_cmd_is_passed_through(status: int) -> None:
    code, out, err = await run_to_end(
        "memory://", "job", "--", *python(f"import sys; print('ran'); sys.exit({status})")
    )
    assert (code, out, err) == (status, "ran\n", "")


@pytest.mark.memory
async def test_a_cmd_killed_by_a_signal_is_128_plus_the_signal() -> None:
    cmd = python("import os, signal; os.kill(os.getpid(), signal.SIGUSR1)")
    code, _, err = await run_to_end("memory://", "job", "--", *cmd)
    assert (code, err) == (128 + signal.SIGUSR1, "")


@pytest.mark.memory
async def test_cmd_is_given_the_fencing_token_and_its_arguments() -> None:
    cmd = python("import os, sys; print(os.environ['AIODLOCK_FENCING_TOKEN'], sys.argv[1:])")
    code, out, _ = await run_to_end("memory://", "job", "--", *cmd, "--ttl", "-x")
    assert code == 0
    token, argv = out.split(maxsplit=1)
    assert int(token) > 0
    assert argv == "['--ttl', '-x']\n"  # CMD's options are not aiodlock run's


@pytest.mark.memory
async def test_a_cmd_that_cannot_be_found_is_127_in_one_line() -> None:
    code, out, err = await run_to_end("memory://", "job", "--", "/nonexistent/cmd")
    assert (code, out) == (127, "")
    (line,) = err.splitlines()
    assert line.startswith("python -m aiodlock run: error: cannot run /nonexistent/cmd:")


# ---------------------------------------------------------------------- holding the lock


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["mutex", "write", "semaphore"])
async def test_the_lock_is_held_while_cmd_runs_and_released_when_it_exits(
    redis_url: str, kind: str
) -> None:
    ns = namespace()
    limit = ["--limit", "1"] if kind == "semaphore" else []
    async with (
        aiodlock.connect(redis_url, namespace=ns) as locks,
        aiodlock_run(redis_url, "job", "-n", ns, "--kind", kind, *limit, "--",
                     *python(READY, WAIT, "sys.exit(4)")) as run,
    ):  # fmt: skip
        other = {
            "mutex": locks.lock("job"),
            "write": locks.read_lock("job"),
            "semaphore": locks.semaphore("job", limit=1),
        }[kind]
        token = await run.ready()
        assert await other.try_acquire() is None
        (info,) = await locks.inspect("job")
        assert (info.kind.value, info.fencing_token, len(info.holders)) == (kind, token, 1)
        run.go_on()
        code, _, err = await run.finished()
        assert (code, err) == (4, "")
        # Released before `aiodlock run` exited: free now, not after the 30 s ttl.
        lease = await other.try_acquire()
        assert lease is not None
        assert lease.fencing_token > token
        await lease.release()


@pytest.mark.redis
@pytest.mark.parametrize("timeout", ["0", "0.3"])
async def test_not_acquired_within_the_timeout_is_75_and_cmd_does_not_run(
    redis_url: str, tmp_path: Path, timeout: str
) -> None:
    ns = namespace()
    marker = tmp_path / "ran"
    async with aiodlock.connect(redis_url, namespace=ns) as locks, locks.lock("job"):
        loop = asyncio.get_running_loop()
        started = loop.time()
        code, out, err = await run_to_end(
            redis_url, "job", "-n", ns, "--timeout", timeout, "--",
            *python(f"open({str(marker)!r}, 'w').close()"),
        )  # fmt: skip
        took = loop.time() - started
    assert (code, out) == (NOT_ACQUIRED, "")
    (line,) = err.splitlines()
    assert f"mutex 'job' in namespace {ns!r} not acquired" in line
    assert not marker.exists()
    assert took >= float(timeout)  # it did wait that long for the lock


# ---------------------------------------------------------------------- the lock lost


@pytest.mark.redis
async def test_a_broken_lock_sends_cmd_sigterm(redis_url: str, tmp_path: Path) -> None:
    ns = namespace()
    marker = tmp_path / "terminated"
    cmd = python(
        "import signal, sys",
        f"def stop(signum, frame): open({str(marker)!r}, 'w').write(str(signum)); sys.exit(7)",
        "signal.signal(signal.SIGTERM, stop)",
        READY,
        WAIT,
    )
    async with (
        aiodlock.connect(redis_url, namespace=ns) as locks,
        aiodlock_run(redis_url, "job", "-n", ns, "--grace", "60", "--", *cmd) as run,
    ):
        await run.ready()
        assert not marker.exists()
        assert await locks.break_lock("job") == 1
        code, out, err = await run.finished()
    assert (code, out) == (7, "")
    assert marker.read_text() == str(int(signal.SIGTERM))
    (line,) = err.splitlines()
    assert line.startswith(f"python -m aiodlock run: lost mutex 'job' in namespace {ns!r}")
    assert "SIGTERM" in line


@pytest.mark.redis
async def test_a_cmd_that_ignores_sigterm_is_killed_after_the_grace(redis_url: str) -> None:
    ns = namespace()
    grace = 0.5
    cmd = python("import signal", "signal.signal(signal.SIGTERM, signal.SIG_IGN)", READY, WAIT)
    async with (
        aiodlock.connect(redis_url, namespace=ns) as locks,
        aiodlock_run(redis_url, "job", "-n", ns, "--grace", str(grace), "--", *cmd) as run,
    ):
        await run.ready()
        loop = asyncio.get_running_loop()
        broken = loop.time()
        assert await locks.break_lock("job") == 1
        code, _, err = await run.finished()
        took = loop.time() - broken
    assert code == 128 + signal.SIGKILL
    assert took >= grace  # SIGTERM first, then the grace, then SIGKILL
    assert len(err.splitlines()) == 1, err
    assert run.child_pid is not None and gone(run.child_pid)


# ---------------------------------------------------------------------- signals


@pytest.mark.redis
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
async def test_sigint_and_sigterm_are_forwarded_and_the_lock_released(
    redis_url: str, signum: signal.Signals
) -> None:
    ns = namespace()
    cmd = python(
        "import signal, sys",
        "def stop(signum, frame): print('got', signum, flush=True); sys.exit(5)",
        "signal.signal(signal.SIGINT, stop)",
        "signal.signal(signal.SIGTERM, stop)",
        READY,
        WAIT,
    )
    async with (
        aiodlock.connect(redis_url, namespace=ns) as locks,
        aiodlock_run(redis_url, "job", "-n", ns, "--", *cmd) as run,
    ):
        await run.ready()
        # Once CMD waits in its read: a signal that comes before the read starts is held
        # until the read returns (Python runs its handler between bytecodes), i.e. never.
        assert run.child_pid is not None
        await wait_until(partial(reading_stdin, run.child_pid), timeout=TIMEOUT)
        run.process.send_signal(signum)
        code, out, err = await run.finished()
        assert (code, out, err) == (5, f"got {int(signum)}\n", "")  # no traceback either
        lease = await locks.lock("job").try_acquire()
        assert lease is not None  # released, not left to expire
        await lease.release()


# ---------------------------------------------------------------------- usage and failures


@pytest.mark.memory
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["memory://", "job"], "the command to run is missing"),
        (["memory://", "job", "--"], "the command to run is missing"),
        (["memory://", "job", "--limit", "2", "--", "true"], "--limit is for --kind semaphore"),
        (["memory://", "job", "--kind", "semaphore", "--", "true"], "needs --limit N"),
        (["memory://", "job", "--timeout", "-1", "--", "true"], "invalid non-negative seconds"),
        (["memory://", "job", "--ttl", "0", "--", "true"], "invalid positive seconds"),
        (["nosuch://x", "job", "--", "true"], "URL: unknown URL scheme 'nosuch'"),
    ],
)
async def test_bad_arguments_are_exit_status_2_with_the_usage(
    args: list[str], message: str
) -> None:
    code, out, err = await run_to_end(*args)
    assert (code, out) == (2, "")
    usage, line = err.splitlines()[0], err.splitlines()[-1]
    assert usage.startswith("usage: python -m aiodlock run URL NAME")
    assert line.startswith("python -m aiodlock run: error: ")
    assert message in line
    assert "Traceback" not in err


@pytest.mark.redis
async def test_an_unreachable_server_is_one_line_and_cmd_does_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0?connect_timeout=2"
    code, out, err = await run_to_end(
        url, "job", "--", *python(f"open({str(marker)!r}, 'w').close()")
    )
    assert (code, out) == (1, "")
    (line,) = err.splitlines()
    assert line.startswith("python -m aiodlock run: error: ")
    assert "hunter2" not in line
    assert not marker.exists()


@pytest.mark.redis
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
async def test_a_signal_while_waiting_for_the_lock_ends_the_wait_and_cmd_does_not_run(
    redis_url: str, tmp_path: Path, signum: signal.Signals
) -> None:
    ns = namespace()
    marker = tmp_path / "ran"
    # BLPOP waiters are registered on the server, so inspect sees when the wait has begun.
    url = f"{redis_url}?wakeup=blpop"
    cmd = python(f"open({str(marker)!r}, 'w').close()")

    async with aiodlock.connect(url, namespace=ns) as locks, locks.lock("job") as held:

        async def waiting() -> bool:
            (info,) = await locks.inspect("job")
            return info.waiters == 1

        async with aiodlock_run(url, "job", "-n", ns, "--", *cmd) as run:
            await eventually(waiting, TIMEOUT)
            run.process.send_signal(signum)
            code, out, err = await run.finished()
        assert (code, out, err) == (128 + signum, "", "")
        assert not marker.exists()
        (info,) = await locks.inspect("job")
        assert not info.waiters  # it gave up its place in the queue
        assert info.fencing_token == held.fencing_token  # and was never granted
