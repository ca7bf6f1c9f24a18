"""Real coordination servers, run as child processes, for the tests and the benchmarks.

The tests talk to real servers, started here, each on a free loopback port in its
own temporary directory, and torn down afterwards. Nothing here uses the machine's own
services (Redis on 6379, MariaDB on 3306), and nothing here installs anything: a missing
binary is a ``RuntimeError`` that says to run ``scripts/install-system-deps.sh``.

A server that cannot start raises ``RuntimeError`` with the tail of its log. Callers must let it
propagate (the test fails); they must never turn it into a skip.

Usage::

    with RedisServer() as redis:          # started, answers PING
        url = redis.url                   # "redis://127.0.0.1:<port>/0"
        redis.pause()                     # SIGSTOP: the server hangs, connections stay open
        redis.resume()                    # SIGCONT
        redis.kill()                      # SIGKILL, no shutdown
        redis.restart()                   # same port, same directory
    # stopped, directory removed

Extending: subclass :class:`ServerProcess`, set ``binary``, and implement :meth:`command`
(the argv, using ``self.port`` and ``self.directory``) and :meth:`probe` (one quick readiness
check). Override :meth:`prepare` for one-time set-up in the directory before the first start
(a ``zoo.cfg``, ``mariadb-install-db``) and :meth:`log_files` to name the server's own logs.

Why plain :mod:`subprocess` rather than mirakuru: what mirakuru adds over ``Popen`` is a
polling loop and a TCP-connect readiness check, and neither fits: an accepted TCP connection
is not a Redis that answers PING (or a ZooKeeper that answers ``ruok``), and fault tests need
SIGSTOP/SIGCONT, which mirakuru does not do (its ``stop()`` on a stopped process waits out
its timeout). Its leak clean-up finds children by scanning every process's environment for a
marker, matched by substring, and runs only at a clean interpreter exit. This module instead:

- starts each server in its own session (``start_new_session``), so a terminal's Ctrl-C or
  Ctrl-Z reaches pytest only, and ``kill()`` can take the server's whole process group;
- asks the kernel to SIGKILL the server if the Python thread that started it dies
  (``prctl(PR_SET_PDEATHSIG)``, Linux, only when started from the main thread: the signal
  follows the *thread*, and a worker thread such as ``asyncio.to_thread``'s may end first);
  this covers a test run that is SIGKILLed or SIGTERMed, where no ``atexit`` hook runs;
- keeps a ``weakref.finalize`` per server that kills the process and removes the directory
  when the object is collected or the interpreter exits (only in the process that started it,
  never in a forked child);
- depends on nothing outside the standard library, so it runs in any test environment.

These methods block (start-up waits for the probe, typically a few tens of milliseconds for
Redis). From an async test that must keep its event loop running meanwhile, call them as
``await asyncio.to_thread(server.restart)``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Self

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

__all__ = [
    "INSTALL_HINT",
    "RedisServer",
    "RedisTLSServer",
    "ServerProcess",
    "TLSFiles",
    "free_port",
    "redis_ping",
]

LOOPBACK = "127.0.0.1"
INSTALL_HINT = "run `bash scripts/install-system-deps.sh` (as root or with sudo) to install it"

_PR_SET_PDEATHSIG = 1
_PORT_IN_USE = "Address already in use"
_handed_out: set[int] = set()


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that nothing listens on now.

    A port is never handed out twice by one process, so servers created one after another
    before any of them starts do not collide. Under pytest-xdist each worker draws from a
    range of its own (:func:`_worker_ports`), so two workers never pick the same port; alone,
    the kernel picks it (bind to port 0). Another process can still take the port before the
    server binds it; :meth:`ServerProcess.start` notices and retries on a new port.
    """
    for port in _worker_ports():
        if port not in _handed_out and _port_is_free(host, port):
            _handed_out.add(port)
            return port
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError(f"could not find a free port on {host}")  # pragma: no cover


_WORKER_PORTS_START = 12000
_WORKER_PORTS_EACH = 2000


def _worker_ports() -> range:
    """The ports of this pytest-xdist worker (``gw<N>``): none outside xdist.

    Below the kernel's ephemeral range (32768 up, on Linux), which is where bind-to-0 and
    every outgoing connection take theirs: a port "that nothing listens on" stays so while
    the test that picked it runs, even with other workers starting servers meanwhile.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return range(0)
    start = _WORKER_PORTS_START + int(worker[2:]) * _WORKER_PORTS_EACH
    return range(start, min(start + _WORKER_PORTS_EACH, 32768))


def _require(binary: str) -> str:
    """The absolute path of ``binary``, or RuntimeError saying how to install it."""
    found = shutil.which(binary)
    if found is None:
        raise RuntimeError(f"{binary} is not on PATH; {INSTALL_HINT}")
    return found


def _port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (a socket in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this thread dies, or None.

    Linux only, and only from the main thread (PR_SET_PDEATHSIG fires when the *thread* that
    forked the child exits). Everything is resolved before the fork; the child only calls.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - not glibc/musl
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return die_with_parent


def _family(pid: int) -> list[tuple[int, str]]:
    """``(pid, state)`` of ``pid``, every process descended from it, and every process of the
    group it leads, from ``/proc`` (state ``"T"``: stopped)."""
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    states: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rpartition(")")[2].split()  # after the name: state, ppid, pgrp
        member = int(entry.name)
        states[member], parents[member], groups[member] = fields[0], int(fields[1]), int(fields[2])
    family = {pid} if pid in states else set()
    family |= {member for member, group in groups.items() if group == pid}
    grown = True
    while grown:
        children = {member for member, parent in parents.items() if parent in family}
        grown = not children <= family
        family |= children
    return sorted((member, states[member]) for member in family)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class _Reaper:
    """What the finalizer needs: the child and the directory, without a reference to the server.

    Called by ``weakref.finalize`` when the server is collected or at interpreter exit.
    """

    def __init__(self, directory: Path) -> None:
        self.owner = os.getpid()
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    def kill(self) -> None:
        """SIGKILL the server's process group and reap it. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # in case it left its process group
        proc.wait()
        # Grandchildren (a Redis BGSAVE fork, a wrapper's child) live on in the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def __call__(self) -> None:
        if os.getpid() != self.owner:  # a forked child exiting must not kill our servers
            return
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


class ServerProcess(ABC):
    """A server run as a child process in its own temporary directory on a loopback port.

    It counts as up when :meth:`probe` succeeds. Lifecycle: :meth:`start`, then any of
    :meth:`pause` / :meth:`resume`, :meth:`kill`, :meth:`stop`, :meth:`restart`, and finally
    :meth:`close` (also the context manager's exit), which stops the server and removes the
    directory. The directory survives ``stop``/``kill``/``restart``, and so does the port.
    """

    #: Executable looked up on PATH; its absence is a RuntimeError with :data:`INSTALL_HINT`.
    binary: ClassVar[str]
    #: Signal for a graceful :meth:`stop`.
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = LOOPBACK,
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self._host = host
        self._auto_port = port is None
        self._port = free_port(host) if port is None else port
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._directory = Path(tempfile.mkdtemp(prefix=f"aiodlock-{type(self).__name__}-"))
        self._reaper = _Reaper(self._directory)
        self._finalizer = weakref.finalize(self, self._reaper)
        self._prepared = False
        self._paused = False

    # -- what a subclass provides ------------------------------------------------------------

    @abstractmethod
    def command(self) -> list[str]:
        """The argv that runs the server in the foreground on ``self.port``."""

    @abstractmethod
    def probe(self) -> bool:
        """One quick readiness check (well under a second); True when the server serves."""

    def prepare(self) -> None:
        """One-time set-up in :attr:`directory`, before the first start. Default: nothing."""
        return None

    def log_files(self) -> list[Path]:
        """Logs to quote when the server fails to start (its stdout/stderr is always quoted)."""
        return []

    def environment(self) -> dict[str, str]:
        """The child's environment. Default: ours."""
        return dict(os.environ)

    # -- state ----------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def directory(self) -> Path:
        """The server's own temporary directory (data, config, logs)."""
        return self._directory

    @property
    def stdout_log(self) -> Path:
        """The child's stdout and stderr."""
        return self._directory / "stdout.log"

    @property
    def executable(self) -> str:
        """Absolute path of :attr:`binary`; RuntimeError saying how to install it if missing."""
        return _require(self.binary)

    @property
    def running(self) -> bool:
        """True while the process exists (also while paused)."""
        proc = self._reaper.proc
        return proc is not None and proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    @property
    def pid(self) -> int:
        proc = self._reaper.proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"{self!r} is not running")
        return proc.pid

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's logs, for error messages."""
        parts = []
        for path in [self.stdout_log, *self.log_files()]:
            text = _tail(path, lines)
            if text:
                parts.append(f"--- {path.name} ---\n{text}")
        return "\n".join(parts) or "(no log output)"

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and wait until :meth:`probe` succeeds.

        If the port was picked automatically and is taken by someone else by the time the
        server binds it, a new port is picked (first start only: a restart keeps its port).
        Raises RuntimeError, with the log tail, if the server exits or is not ready within
        ``start_timeout`` seconds.
        """
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        if not self._finalizer.alive:
            raise RuntimeError(f"{self!r} is closed")
        _require(self.binary)  # fail early, with the install hint
        if not self._prepared:
            self.prepare()
            self._prepared = True
        attempts = 5 if self._auto_port else 1
        for attempt in range(1, attempts + 1):
            try:
                self._spawn_and_wait()
            except _PortTakenError as exc:
                if attempt == attempts:
                    raise RuntimeError(str(exc)) from None
                self._port = free_port(self._host)
            else:
                self._auto_port = False  # from now on the port is ours: restarts keep it
                return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn_and_wait(self) -> None:
        if not _port_is_free(self._host, self._port):
            raise _PortTakenError(f"{self!r}: port {self._port} is already in use")
        with self.stdout_log.open("ab") as out:
            proc = subprocess.Popen(
                self.command(),
                cwd=self._directory,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent_hook(),  # prepared before the fork, see there
            )
        self._reaper.proc = proc
        self._paused = False
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = proc.poll()
            if code is not None:
                self._reaper.kill()
                message = f"{self!r} exited with code {code} while starting"
                if _PORT_IN_USE in self.log_tail(lines=100):
                    raise _PortTakenError(f"{message}: port {self._port} is in use")
                raise RuntimeError(f"{message}:\n{self.log_tail()}")
            if self.probe() and proc.poll() is None:
                return
            if time.monotonic() > deadline:
                self._reaper.kill()
                raise RuntimeError(
                    f"{self!r} did not become ready within {self.start_timeout:g}s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.01)

    def stop(self) -> Self:
        """Stop gracefully (``stop_signal``), SIGKILL after ``stop_timeout``. Idempotent."""
        proc = self._reaper.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self._paused:  # a stopped process cannot act on SIGTERM (nor its children)
                    self._signal_family(proc.pid, signal.SIGCONT, stopped=False)
                os.kill(proc.pid, self.stop_signal)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.stop_timeout)
        self._reaper.kill()  # reaps, and kills what is left (itself after the timeout)
        self._paused = False
        return self

    def kill(self) -> Self:
        """SIGKILL the server (and its process group) and reap it: a crash, no shutdown."""
        self._reaper.kill()
        self._paused = False
        return self

    def restart(self) -> Self:
        """:meth:`stop` (if running) then :meth:`start`, on the same port and directory."""
        self.stop()
        return self.start()

    def pause(self) -> Self:
        """SIGSTOP the server and every process it forked; returns once the kernel reports
        each of them stopped.

        Every process, not the one: PostgreSQL forks a backend per connection, and a stopped
        postmaster alone leaves every connected session answering. Its backends leave the
        server's process group (each calls ``setsid``), so they are found as descendants in
        ``/proc``; the group is taken too, for children that were orphaned. The server is
        stopped first, so it forks nothing new while the rest are found.
        """
        pid = self.pid
        os.kill(pid, signal.SIGSTOP)
        self._paused = True
        self._signal_family(pid, signal.SIGSTOP, stopped=True)
        return self

    def resume(self) -> Self:
        """SIGCONT the server and every process it forked; returns once each of them runs."""
        pid = self.pid
        self._paused = False
        self._signal_family(pid, signal.SIGCONT, stopped=False)
        return self

    @staticmethod
    def _signal_family(pid: int, sig: signal.Signals, *, stopped: bool) -> None:
        """Send ``sig`` to ``pid`` and its family (:func:`_family`) until every member is
        stopped (or running): the kernel delivers it to each process on its own schedule."""
        deadline = time.monotonic() + 5.0
        signalled: set[int] = set()
        while True:
            late = [p for p, state in _family(pid) if (state in ("T", "t")) != stopped]
            if not late:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"server {pid}: {late} did not {'stop' if stopped else 'continue'} in 5s"
                )
            for member in late:
                if member not in signalled:
                    signalled.add(member)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(member, sig)
            time.sleep(0.001)

    def close(self) -> None:
        """Stop the server and remove its directory. The object cannot be started again."""
        self.stop()
        self._finalizer()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        proc = self._reaper.proc
        if not self._finalizer.alive:
            state = "closed"
        elif proc is None or proc.poll() is not None:
            state = "stopped"
        else:
            state = f"{'paused' if self._paused else 'running'} pid={proc.pid}"
        return f"<{type(self).__name__} {self._host}:{self._port} {state} dir={self._directory}>"


class _PortTakenError(Exception):
    """Someone else listens on the port; :meth:`ServerProcess.start` may retry elsewhere."""


def redis_ping(
    host: str, port: int, *, timeout: float = 0.5, tls: ssl.SSLContext | None = None
) -> bool:
    """True if a Redis server at ``host:port`` answers PING with PONG within ``timeout``.

    Raw RESP over a socket (wrapped in ``tls`` if given), so it needs no client library. A
    paused server accepts the connection (the kernel does) but does not answer: that is False
    after ``timeout``.
    """
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
            if tls is not None:
                sock = stack.enter_context(tls.wrap_socket(sock, server_hostname=host))
            sock.sendall(b"PING\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
    except OSError:  # refused, reset, timed out, or a failed TLS handshake (ssl.SSLError)
        return False
    return reply.startswith(b"+PONG")


class RedisServer(ServerProcess):
    """A throw-away ``redis-server``: no persistence, loopback only, logs in its directory.

    ``args`` are extra ``redis-server`` options appended to the defaults, e.g.
    ``["--enable-debug-command", "local"]`` (Redis 7 disables DEBUG by default) or the
    ``--cluster-enabled yes`` family for a cluster node.
    """

    binary = "redis-server"

    def __init__(
        self,
        *,
        port: int | None = None,
        args: Sequence[str] = (),
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(port=port, start_timeout=start_timeout, stop_timeout=stop_timeout)
        self.args = list(args)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_file(self) -> Path:
        return self.directory / "redis.log"

    def listen_args(self) -> list[str]:
        """Where it listens: plain TCP on :attr:`port`."""
        return ["--port", str(self.port)]

    def command(self) -> list[str]:
        return [
            self.executable,
            *self.listen_args(),
            "--bind", self.host,
            "--dir", str(self.directory),
            "--logfile", str(self.log_file),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            *self.args,
        ]  # fmt: skip

    def probe(self) -> bool:
        return redis_ping(self.host, self.port)

    def ping(self, *, timeout: float = 0.5) -> bool:
        """True if the server answers PING within ``timeout`` (False while paused or down)."""
        return redis_ping(self.host, self.port, timeout=timeout)

    def log_files(self) -> list[Path]:
        return [self.log_file]


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS server and its clients (made by the caller, e.g. with trustme)."""

    ca: Path  # the CA certificate that signed both certificates below
    server_cert: Path
    server_key: Path
    client: Path  # the client's certificate chain and private key, in one file


class RedisTLSServer(RedisServer):
    """A :class:`RedisServer` that speaks TLS only (``--port 0``): ``rediss://`` URLs.

    ``auth_clients`` is ``--tls-auth-clients``: ``"optional"`` (a client certificate is checked
    if presented) or ``"yes"`` (required). Fails to start, loudly, if this redis-server was
    built without TLS.

    Usage::

        with RedisTLSServer(files, auth_clients="yes") as redis:
            url = redis.url  # "rediss://127.0.0.1:<port>/0"
    """

    def __init__(
        self,
        files: TLSFiles,
        *,
        auth_clients: str = "optional",
        port: int | None = None,
        args: Sequence[str] = (),
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            port=port, args=args, start_timeout=start_timeout, stop_timeout=stop_timeout
        )
        self.files = files
        self.auth_clients = auth_clients

    @property
    def url(self) -> str:
        """``rediss://127.0.0.1:<port>/0``."""
        return f"rediss://{self.host}:{self.port}/0"

    def listen_args(self) -> list[str]:
        files = self.files
        return [
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(files.server_cert),
            "--tls-key-file", str(files.server_key),
            "--tls-ca-cert-file", str(files.ca),
            "--tls-auth-clients", self.auth_clients,
        ]  # fmt: skip

    def client_context(self) -> ssl.SSLContext:
        """A context that trusts the CA and presents the client certificate."""
        context = ssl.create_default_context(cafile=str(self.files.ca))
        context.load_cert_chain(str(self.files.client))
        return context

    def probe(self) -> bool:
        return redis_ping(self.host, self.port, tls=self.client_context())

    def ping(self, *, timeout: float = 0.5) -> bool:
        return redis_ping(self.host, self.port, timeout=timeout, tls=self.client_context())
