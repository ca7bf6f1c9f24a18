"""The ``run`` command: run a program while holding a lock, like flock(1) or ``consul lock``.

``python -m aiodlock run URL NAME [--kind KIND] [--limit N] [--ttl S] [--timeout S] [--grace S]
-- CMD [ARGS...]`` takes the lock, runs ``CMD`` (no shell; stdin, stdout and stderr inherited;
``AIODLOCK_FENCING_TOKEN`` in its environment), releases the lock when it exits and exits with
its status (128+N for a child killed by signal N, as shells do). Not acquired within
``--timeout``: exit status 75 (EX_TEMPFAIL) and CMD is not run. The lock lost while CMD runs:
CMD gets SIGTERM, then SIGKILL after ``--grace`` seconds. SIGINT and SIGTERM are forwarded to
CMD. The statuses and messages: docs/operations.md.

Example (a cron job that must not overlap itself, on any number of machines)::

    $ python -m aiodlock run redis://127.0.0.1:6379/0 nightly-report --timeout 0 -- ./report.sh
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Final

import aiodlock
from aiodlock import Kind

from ._operator import EXIT_FAILED, add_target, open_client, run_reporting

__all__ = [
    "DESCRIPTION",
    "EXIT_NOT_ACQUIRED",
    "FENCING_TOKEN_VARIABLE",
    "HELP",
    "NAME",
    "add_arguments",
    "run",
]

NAME: Final = "run"
HELP: Final = "run a program while holding a lock (stopped if the lock is lost)"
DESCRIPTION: Final = (
    "Take the lock, run CMD (no shell) with AIODLOCK_FENCING_TOKEN in its environment, release "
    "the lock when it exits and exit with its status (128+N if killed by signal N). Not "
    "acquired within --timeout: exit status 75, CMD not run. If the lock is lost while CMD "
    "runs, CMD gets SIGTERM, then SIGKILL after --grace seconds. SIGINT and SIGTERM are "
    "forwarded to CMD."
)

EXIT_NOT_ACQUIRED: Final = 75
"""EX_TEMPFAIL (sysexits.h): the lock was busy; try again later."""
FENCING_TOKEN_VARIABLE: Final = "AIODLOCK_FENCING_TOKEN"
"""The environment variable that gives CMD its lease's fencing token."""
DEFAULT_GRACE: Final = 10.0
_FORWARDED: Final = (signal.SIGINT, signal.SIGTERM)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``URL NAME [--namespace NS] [--kind KIND] [--limit N] [--ttl S] [--timeout S]
    [--grace S] -- CMD [ARGS...]``."""
    parser.usage = "%(prog)s URL NAME [options] -- CMD [ARGS...]"
    add_target(parser)
    parser.add_argument("name", metavar="NAME", help="the lock's name")
    parser.add_argument(
        "command",
        nargs="*",
        metavar="CMD",
        help="after '--': the program to run and its arguments (no shell)",
    )
    parser.add_argument(
        "--kind",
        choices=[kind.value for kind in Kind],
        default=Kind.MUTEX.value,
        help="mutex (the default), read, write (the two sides of a reader/writer lock), "
        "semaphore (needs --limit)",
    )
    parser.add_argument("--limit", type=int, metavar="N", help="the semaphore's number of permits")
    parser.add_argument(
        "--ttl",
        type=_seconds(zero=False),
        metavar="S",
        help="lease seconds, renewed every ttl/3 while CMD runs (default: the client's, 30)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds(zero=True),
        metavar="S",
        help="seconds to wait for the lock (0: one try; default: wait forever)",
    )
    parser.add_argument(
        "--grace",
        type=_seconds(zero=True),
        default=DEFAULT_GRACE,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL to CMD when the lock is lost "
        f"(default {DEFAULT_GRACE:g})",
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Check the arguments, take the lock, run CMD under it; return the exit status."""
    command: list[str] = args.command
    if not command:
        parser.error("the command to run is missing: ... NAME -- CMD [ARGS...]")
    if args.kind == Kind.SEMAPHORE.value and args.limit is None:
        parser.error("--kind semaphore needs --limit N")
    if args.kind != Kind.SEMAPHORE.value and args.limit is not None:
        parser.error("--limit is for --kind semaphore only")
    locks = open_client(args, parser)
    try:
        lock = _make_lock(locks, args)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    except aiodlock.UnsupportedError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    what = f"{args.kind} {args.name!r} in namespace {locks.namespace!r}"
    runner = _Runner(parser.prog, what, command, args.timeout, args.grace)
    return run_reporting(parser, locks, lambda _: runner.run(lock))


def _make_lock(locks: aiodlock.LockClient, args: argparse.Namespace) -> aiodlock.BaseLock:
    ttl = aiodlock.USE_CLIENT_DEFAULT if args.ttl is None else args.ttl
    if args.kind == Kind.SEMAPHORE.value:
        return locks.semaphore(args.name, limit=args.limit, ttl=ttl)
    if args.kind == Kind.READ.value:
        return locks.read_lock(args.name, ttl=ttl)
    if args.kind == Kind.WRITE.value:
        return locks.write_lock(args.name, ttl=ttl)
    return locks.lock(args.name, ttl=ttl)


class _Runner:
    """One run: acquire, start CMD, watch the lease and the signals, release.

    The signals are the loop's (``add_signal_handler``): while the lock is awaited, SIGINT or
    SIGTERM cancels the wait (exit 128+N, CMD not run); once CMD has started, they go to CMD,
    and what CMD does with them decides the exit status.
    """

    def __init__(
        self, prog: str, what: str, command: Sequence[str], timeout: float | None, grace: float
    ) -> None:
        self.prog = prog
        self.what = what
        self.command = list(command)
        self.timeout = timeout
        self.grace = grace
        self.child: asyncio.subprocess.Process | None = None
        self.signalled: int | None = None  # the first SIGINT/SIGTERM before CMD started
        self.acquiring: asyncio.Task[object] | None = None

    async def run(self, lock: aiodlock.BaseLock) -> int:
        loop = asyncio.get_running_loop()
        for signum in _FORWARDED:
            loop.add_signal_handler(signum, self._on_signal, signum)
        try:
            lease = await self._acquire(lock)
            if lease is None:
                return self._not_run()
            try:
                status = await self._run_child(lease)
            finally:
                await self._release(lease)
            return status
        finally:
            for signum in _FORWARDED:
                loop.remove_signal_handler(signum)

    async def _release(self, lease: aiodlock.Lease) -> None:
        try:
            await lease.release()
        except aiodlock.LockNotOwnedError:
            pass  # lost already (broken, expired), and said so: nothing to release
        except aiodlock.BackendError as exc:
            # CMD ran: its status is the result; the lease ends by expiry instead.
            print(
                f"{self.prog}: error: release of {self.what} not confirmed "
                f"(it expires after its ttl): {exc}",
                file=sys.stderr,
            )

    def _on_signal(self, signum: int) -> None:
        if self.child is not None:
            if self.child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self.child.send_signal(signum)
            return
        if self.signalled is None:
            self.signalled = signum
        if self.acquiring is not None:
            self.acquiring.cancel()

    async def _acquire(self, lock: aiodlock.BaseLock) -> aiodlock.Lease | None:
        """The lease, or ``None`` if not acquired in time or a signal came first."""
        task = asyncio.current_task()
        assert task is not None
        self.acquiring = task
        try:
            if self._interrupted():
                return None
            if self.timeout == 0:
                return await lock.try_acquire()
            return await lock.acquire(timeout=self.timeout)
        except aiodlock.LockTimeoutError:
            return None
        except asyncio.CancelledError:
            if not self._interrupted():
                raise  # not ours: asyncio.run's own Ctrl-C handling, say
            task.uncancel()
            return None
        finally:
            self.acquiring = None

    def _interrupted(self) -> bool:
        # A method, not the attribute: the signal handler sets it during an await.
        return self.signalled is not None

    def _not_run(self) -> int:
        if self.signalled is not None:
            return 128 + self.signalled
        waited = "at once" if self.timeout == 0 else f"within {self.timeout:g}s"
        print(
            f"{self.prog}: {self.what} not acquired {waited}: {self.command[0]} not run",
            file=sys.stderr,
        )
        return EXIT_NOT_ACQUIRED

    async def _run_child(self, lease: aiodlock.Lease) -> int:
        if self.signalled is not None:  # came between the grant and now
            return 128 + self.signalled
        env = dict(os.environ, **{FENCING_TOKEN_VARIABLE: str(lease.fencing_token)})
        try:
            self.child = await asyncio.create_subprocess_exec(*self.command, env=env)
        except OSError as exc:
            print(f"{self.prog}: error: cannot run {self.command[0]}: {exc}", file=sys.stderr)
            # As shells do: 127 not found, 126 found but not runnable.
            return 127 if isinstance(exc, FileNotFoundError) else 126
        async with asyncio.TaskGroup() as tasks:
            watch = tasks.create_task(self._stop_when_lost(lease, self.child))
            returncode = await self.child.wait()
            watch.cancel()
        return 128 - returncode if returncode < 0 else returncode

    async def _stop_when_lost(
        self, lease: aiodlock.Lease, child: asyncio.subprocess.Process
    ) -> None:
        await lease.lost.wait()
        if child.returncode is not None:
            return
        print(
            f"{self.prog}: lost {self.what} while {self.command[0]} (pid {child.pid}) ran: "
            f"sending it SIGTERM, SIGKILL after {self.grace:g}s",
            file=sys.stderr,
            flush=True,
        )
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        try:
            async with asyncio.timeout(self.grace):
                await child.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()


def _seconds(*, zero: bool) -> Callable[[str], float]:
    """An argparse ``type=`` for seconds: finite, positive (or zero if ``zero``)."""

    def parse(text: str) -> float:
        value = float(text)  # ValueError: argparse says "invalid ... value"
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise ValueError(text)
        return value

    parse.__name__ = "non-negative seconds" if zero else "positive seconds"
    return parse
