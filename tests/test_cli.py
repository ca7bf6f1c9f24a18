"""The operator commands, run as a user runs them: ``python -m aiodlock inspect|break``.

Each command runs as a subprocess (``-W error``) against a real server while this process
holds locks through its own client; the subprocess is awaited with asyncio, so the holders'
watchdogs keep running meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

import aiodlock
from tests.helpers import interruptible_children, reading_stdin, wait_until
from tests.servers import free_port

if TYPE_CHECKING:
    from tests.support_zookeeper import ZooKeeperServer

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0
CLI = (sys.executable, "-W", "error", "-m", "aiodlock")
"""The command line, as a user runs it (any warning fails the test)."""


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


async def aiodlock_cli(*args: str, stdin: Any = subprocess.DEVNULL, answer: bytes = b"") -> Result:
    """``python -W error -m aiodlock ARGS``, awaited without blocking the event loop.

    With ``answer``, stdin is a pseudo-terminal on which ``answer`` is typed.
    """
    master = None
    if answer:
        master, stdin = pty.openpty()
    try:
        process = await asyncio.create_subprocess_exec(
            *CLI,
            *args,
            cwd=ROOT,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if master is not None:
            os.write(master, answer)
        async with asyncio.timeout(TIMEOUT):
            out, err = await process.communicate()
    finally:
        if master is not None:
            os.close(master)
            os.close(stdin)
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if " error: " in line]
    assert len(errors) == 1, result.stderr  # one error line (after the usage, if any)


def namespace() -> str:
    return f"cli{os.urandom(4).hex()}"


# ---------------------------------------------------------------------- inspect


async def check_inspect(url: str, *, kinds: bool) -> None:
    ns = namespace()
    async with (
        aiodlock.connect(url, namespace=ns) as locks,
        locks.lock("order:42", ttl=30) as mutex,
    ):
        held = {"order:42": mutex}
        if kinds:
            held["catalog"] = await locks.read_lock("catalog").acquire()
            held["quota"] = await locks.semaphore("quota", limit=3).acquire()
        result = await aiodlock_cli("inspect", url, "--namespace", ns)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].split() == [
            "NAME", "KIND", "TOKEN", "WAITERS", "HOLDER", "LEASE", "IDENTITY"
        ]  # fmt: skip
        rows = {line.split()[0]: line.split() for line in lines[1:]}
        assert set(rows) == set(held)
        for name, lease in held.items():
            assert rows[name][2] == str(lease.fencing_token)
            assert rows[name][4] == lease.owner
            assert rows[name][6] == locks.identity  # host:pid: no spaces
        assert rows["order:42"][1] == "mutex"

        result = await aiodlock_cli("inspect", url, "--json", "-n", ns, "order:*")
        assert result.returncode == 0, result.stderr
        (info,) = json.loads(result.stdout)
        assert info["name"] == "order:42"
        assert info["kind"] == "mutex"
        assert info["fencing_token"] == mutex.fencing_token
        assert info["namespace"] == ns
        assert [(h["owner"], h["identity"]) for h in info["holders"]] == [
            (mutex.owner, locks.identity)
        ]
        expires_in = info["holders"][0]["expires_in"]
        assert expires_in is None or 0 < expires_in <= 30
        for lease in held.values():
            if lease is not mutex:
                await lease.release()
    result = await aiodlock_cli("inspect", url, "-n", ns, "--json")
    assert (result.returncode, json.loads(result.stdout)) == (0, [])
    result = await aiodlock_cli("inspect", url, "-n", ns)
    assert result.stdout.startswith(f"no locks held in namespace {ns!r} matching '*'\n")


@pytest.mark.redis
async def test_inspect_all_namespaces_shows_each_with_its_holders_identity(
    redis_url: str,
) -> None:
    """``--all-namespaces`` finds the locks of every namespace (a NAMESPACE column, and
    ``namespace`` in JSON); an empty namespace's answer names the ones in use."""
    shop, jobs = namespace(), namespace()
    async with (
        aiodlock.connect(redis_url, namespace=shop, identity="web 1") as web,
        aiodlock.connect(redis_url, namespace=jobs, identity="cron/nightly") as cron,
        web.lock("order:42", ttl=30) as order,
        cron.semaphore("report", limit=2) as report,
    ):
        result = await aiodlock_cli("inspect", redis_url, "--all-namespaces", "--json")
        assert result.returncode == 0, result.stderr
        mine = {
            (i["namespace"], i["name"]): [(h["owner"], h["identity"]) for h in i["holders"]]
            for i in json.loads(result.stdout)
            if i["namespace"] in (shop, jobs)
        }
        assert mine == {
            (shop, "order:42"): [(order.owner, "web 1")],
            (jobs, "report"): [(report.owner, "cron/nightly")],
        }
        result = await aiodlock_cli("inspect", redis_url, "-A", "order:*")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].split()[:2] == ["NAMESPACE", "NAME"]
        assert [line.split()[:2] for line in lines[1:] if line.startswith(shop)] == [
            [shop, "order:42"]
        ]
        assert not any(line.startswith(jobs) for line in lines)  # "report" is not order:*
        result = await aiodlock_cli("inspect", redis_url, "-n", namespace())
        assert result.returncode == 0, result.stderr
        assert "\nnamespaces in use: " in result.stdout  # shop's at least, among the first 10
    result = await aiodlock_cli("inspect", redis_url, "-A", "-n", shop)
    assert result.returncode == 2
    assert "--all-namespaces and --namespace exclude each other" in result.stderr


@pytest.mark.redis
async def test_inspect_on_redis(redis_url: str) -> None:
    await check_inspect(redis_url, kinds=True)


@pytest.mark.postgres
async def test_inspect_on_postgres(postgres_url: str) -> None:
    await check_inspect(postgres_url, kinds=True)


@pytest.mark.zookeeper
async def test_inspect_on_zookeeper(zookeeper_server: ZooKeeperServer) -> None:
    await check_inspect(f"{zookeeper_server.url}/cli", kinds=True)


@pytest.mark.mysql
async def test_inspect_on_mysql(mysql_url: str) -> None:
    await check_inspect(mysql_url, kinds=False)  # no reader/writer lock on MySQL


# ---------------------------------------------------------------------- break


async def check_break(url: str, *confirm: str, answer: bytes = b"") -> None:
    ns = namespace()
    entered = asyncio.Event()
    cancelled = asyncio.Event()
    tokens: list[int] = []

    async def holder(locks: aiodlock.LockClient) -> None:
        async with locks.lock("stuck", ttl=1.5) as lease:
            tokens.append(lease.fencing_token)
            entered.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    async with (
        aiodlock.connect(url, namespace=ns) as locks,
        aiodlock.connect(url, namespace=ns) as other,
    ):
        holding = asyncio.create_task(holder(locks))
        await entered.wait()
        waiting = asyncio.create_task(other.lock("stuck").acquire(timeout=30))
        result = await aiodlock_cli(
            "break", url, "stuck", "--namespace", ns, *confirm, answer=answer
        )
        assert result.returncode == 0, result.stderr
        assert f"broke mutex 'stuck' in namespace {ns!r}: 1 holder dropped" in result.stdout
        with pytest.raises(aiodlock.LockLostError):
            await holding
        assert cancelled.is_set()
        successor = await waiting
        assert successor.fencing_token > tokens[0]
        await successor.release()
        result = await aiodlock_cli("break", url, "stuck", "-n", ns, "--yes")
        assert result.returncode == 1
        assert result.stderr.endswith("was not held: nothing to break\n")


@pytest.mark.redis
async def test_break_on_redis(redis_url: str) -> None:
    await check_break(redis_url, "--yes")


@pytest.mark.postgres
async def test_break_on_postgres(postgres_url: str) -> None:
    await check_break(postgres_url, "--yes")


@pytest.mark.zookeeper
async def test_break_on_zookeeper(zookeeper_server: ZooKeeperServer) -> None:
    await check_break(f"{zookeeper_server.url}/cli", "--yes")


@pytest.mark.mysql
async def test_break_on_mysql(mysql_url: str) -> None:
    await check_break(mysql_url, "--yes")


@pytest.mark.mysql
async def test_break_of_a_kind_the_backend_lacks_is_one_error_line(mysql_url: str) -> None:
    result = await aiodlock_cli("break", mysql_url, "x", "--kind", "write", "--yes")
    assert result.returncode == 1
    assert "cannot provide a write lock" in result.stderr
    no_traceback(result)


@pytest.mark.redis
async def test_break_asks_on_a_terminal(redis_url: str) -> None:
    await check_break(redis_url, answer=b"y\n")


@pytest.mark.redis
async def test_break_refuses_without_yes_off_a_terminal_or_when_told_no(redis_url: str) -> None:
    ns = namespace()
    async with (
        aiodlock.connect(redis_url, namespace=ns) as locks,
        locks.lock("kept", ttl=30) as lease,
    ):
        result = await aiodlock_cli("break", redis_url, "kept", "-n", ns)
        assert result.returncode == 2
        assert "refusing to break mutex 'kept'" in result.stderr
        assert "without --yes" in result.stderr
        no_traceback(result)
        result = await aiodlock_cli("break", redis_url, "kept", "-n", ns, answer=b"n\n")
        assert result.returncode == 1
        assert "Break mutex 'kept'" in result.stderr  # the question, on the terminal
        assert "not broken" in result.stderr
        lease.assert_held()
        (info,) = await locks.inspect("kept")
        assert [h.owner for h in info.holders] == [lease.owner]


# ---------------------------------------------------------------------- failures


@pytest.mark.memory
@pytest.mark.parametrize("command", ["inspect", "break"])
async def test_a_bad_url_is_a_usage_error(command: str) -> None:
    args = [command, "nosuch://host/x"] + (["name", "--yes"] if command == "break" else [])
    result = await aiodlock_cli(*args)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(f"python -m aiodlock {command}: error: URL:")
    assert "unknown URL scheme 'nosuch'" in result.stderr
    no_traceback(result)


@pytest.mark.redis
@pytest.mark.parametrize("command", ["inspect", "break"])
async def test_an_unreachable_server_is_one_line_without_the_password(command: str) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0?connect_timeout=2"
    args = [command, url] + (["name", "--yes"] if command == "break" else [])
    result = await aiodlock_cli(*args)
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"python -m aiodlock {command}: error: ")
    assert "connect failed" in line
    assert "hunter2" not in line
    no_traceback(result)


@pytest.mark.memory
async def test_inspect_of_an_empty_memory_store_is_exit_status_0() -> None:
    result = await aiodlock_cli("inspect", "memory://", "--json")
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "[]", "")


# ---------------------------------------------------------------------- the client API they use


class _NoOperators:
    """A backend without the optional operations (neither Inspector nor Breaker)."""

    capabilities = frozenset({aiodlock.Capability.EXCLUSIVE})
    options: ClassVar[dict[str, type]] = {}
    queues_on_busy = False

    async def open(self, tasks: object) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def describe(self) -> str:
        return "noops://"

    def check(self, spec: object) -> None:
        pass


@pytest.mark.memory
async def test_inspect_and_break_lock_check_their_arguments_and_the_backend() -> None:
    locks = aiodlock.connect("memory://")
    with pytest.raises(RuntimeError, match="not open"):
        await locks.inspect()
    async with locks:
        with pytest.raises(ValueError, match="kind must be one of 'mutex', 'read'"):
            await locks.break_lock("x", kind="lock")
        with pytest.raises(TypeError, match="pattern must be a str"):
            await locks.inspect(b"*")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="name must not be empty"):
            await locks.break_lock("")
        with pytest.raises(TypeError, match=r"kind must be an aiodlock\.Kind or a str, not int"):
            await locks.break_lock("x", kind=1)  # type: ignore[arg-type]
        assert await locks.break_lock("nobody-holds-this") == 0
        # The enum or its value: the kind an inspect() reports is taken as it is.
        builders: dict[aiodlock.Kind, Callable[[], aiodlock.BaseLock]] = {
            aiodlock.Kind.MUTEX: lambda: locks.lock("held", ttl=1),
            aiodlock.Kind.READ: lambda: locks.read_lock("held", ttl=1),
            aiodlock.Kind.WRITE: lambda: locks.write_lock("held", ttl=1),
            aiodlock.Kind.SEMAPHORE: lambda: locks.semaphore("held", limit=1, ttl=1),
        }
        for kind, build in builders.items():
            lease = await build().acquire()
            (info,) = await locks.inspect("held")
            assert info.kind is kind
            assert await locks.break_lock("held", kind=info.kind) == 1
            await asyncio.wait_for(lease.lost.wait(), 5)  # at its next renewal (ttl/3)
            assert await locks.break_lock("held", kind=kind.value) == 0
    bare = aiodlock.LockClient(
        _NoOperators(),  # type: ignore[arg-type]
        namespace="ns",
        ttl=30.0,
        timeout=None,
        max_hold=None,
    )
    async with bare:
        with pytest.raises(aiodlock.UnsupportedError, match="noops:// cannot list its locks"):
            await bare.inspect()
        with pytest.raises(aiodlock.UnsupportedError, match="noops:// cannot break locks"):
            await bare.break_lock("x")
        with pytest.raises(aiodlock.UnsupportedError, match="cannot list its namespaces"):
            await bare.namespaces()
        with pytest.raises(ValueError, match="namespace"):
            await bare.inspect(namespace="a:b")


@pytest.mark.redis
async def test_ctrl_c_at_the_question_is_a_no_without_a_traceback(redis_url: str) -> None:
    ns = namespace()
    master, terminal = pty.openpty()
    try:
        async with (
            aiodlock.connect(redis_url, namespace=ns) as locks,
            locks.lock("kept", ttl=30) as lease,
        ):
            with interruptible_children():
                process = await asyncio.create_subprocess_exec(
                    *CLI,
                    "break",
                    redis_url,
                    "kept",
                    "-n",
                    ns,
                    cwd=ROOT,
                    stdin=terminal,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            assert process.stderr is not None
            async with asyncio.timeout(TIMEOUT):
                asked = await process.stderr.readuntil(b"[y/N] ")
                assert b"Break mutex 'kept'" in asked
                # As a person would: once it waits for the answer (a signal that comes
                # before the read starts is held until the read returns, i.e. never).
                await wait_until(partial(reading_stdin, process.pid), timeout=TIMEOUT)
                process.send_signal(signal.SIGINT)
                out, err = await process.communicate()
            assert process.returncode == 1
            assert "not broken" in err.decode()
            assert "Traceback" not in err.decode()
            assert out == b""
            lease.assert_held()
    finally:
        os.close(master)
        os.close(terminal)
