"""The postgres backend's test harness: a throw-away PostgreSQL server, the probe, lock keys.

Imported by the PostgreSQL test modules and, lazily, by the server fixtures of
tests/conftest.py; asyncpg is imported only when a probe is opened, so importing this module
needs no driver.

:class:`PostgresServer` runs a throw-away ``postgres`` (Debian's PostgreSQL 15 or later): a
cluster made by ``initdb`` in its temporary directory, a free loopback port, its unix socket
in that directory too, and a database plus a login role *with a password* (so password
redaction is tested for real), made in single-user mode before the first start. It never
touches the machine's own PostgreSQL on 5432. PostgreSQL refuses to run as root, so when the
tests run as root the cluster belongs to ``nobody`` and every server command runs as that user
(through a small program that ``exec``\\s it: the server stays our child, so SIGSTOP and SIGKILL
reach it).

:class:`PostgresProbe` looks behind the library's back with a plain asyncpg connection:
``break_lock`` terminates the backends holding a lock (``pg_terminate_backend``, as an operator
would), ``leftovers`` lists advisory locks held or awaited in the test database.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import quote

from aiodlock.backends import parse_url
from tests.servers import INSTALL_HINT, ServerProcess, TLSFiles

if TYPE_CHECKING:
    import aiodlock

__all__ = [
    "UNPRIVILEGED",
    "PostgresProbe",
    "PostgresServer",
    "advisory_key",
    "as_unprivileged",
    "fence_key",
    "pg_isready",
    "postgres_bin_dir",
]

SETTLE_SECONDS: Final = 3.0
"""How long :meth:`PostgresProbe.leftovers` lets the server finish tearing down sessions."""
UNPRIVILEGED: Final = "nobody"
_DROP_PRIVILEGES: Final = """
import ctypes, os, sys
uid, gid, parent, die_with_parent = map(int, sys.argv[1:5])
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
if die_with_parent:
    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != parent:
        os._exit(1)
os.execv(sys.argv[5], sys.argv[5:])
"""


def as_unprivileged() -> list[str]:
    """The argv prefix that runs a command as the unprivileged user when we are root (the
    servers refuse root; see :meth:`PostgresServer._as_owner`), else nothing."""
    if os.geteuid() != 0:
        return []
    entry = pwd.getpwnam(UNPRIVILEGED)
    main = threading.current_thread() is threading.main_thread()
    return [
        sys.executable,
        "-c",
        _DROP_PRIVILEGES,
        str(entry.pw_uid),
        str(entry.pw_gid),
        str(os.getpid()),
        "1" if main else "0",
    ]


def pg_isready(host: str, port: int, *extra: str) -> bool:
    """Whether a server (or PgBouncer) on ``host:port`` answers a start-up packet."""
    command = [str(postgres_bin_dir() / "pg_isready"), "-q", "-h", host, "-p", str(port), *extra]
    try:
        result = subprocess.run(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def postgres_bin_dir() -> Path:
    """Where ``initdb``, ``postgres`` and ``pg_isready`` live.

    ``postgres`` on PATH (resolved through symlinks: Debian installs the tools under
    ``/usr/lib/postgresql/<version>/bin`` and puts only a few wrappers on PATH), else the
    newest ``/usr/lib/postgresql/*/bin``.
    """
    found = shutil.which("postgres")
    if found is not None:
        directory = Path(os.path.realpath(found)).parent
        if (directory / "initdb").exists():
            return directory
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parent.parent.name.split(".")[0] or 0),
    )
    if not candidates:
        raise RuntimeError(f"PostgreSQL's initdb/postgres are missing; {INSTALL_HINT}")
    return Path(candidates[-1]).parent


def _postgres_binary() -> str:
    """The ``postgres`` executable, or the bare name (then starting says how to install it)."""
    try:
        return str(postgres_bin_dir() / "postgres")
    except RuntimeError:
        return "postgres"


class PostgresServer(ServerProcess):
    """A throw-away ``postgres`` with a database and a password-protected role (see module)."""

    binary = _postgres_binary()
    # SIGINT is PostgreSQL's "fast" shutdown (SIGTERM waits for every client to leave).
    stop_signal: ClassVar[signal.Signals] = signal.SIGINT

    user: Final = "aiodlock"
    password: Final = "pa:ss@w/rd%"  # every character the URL must percent-encode
    database: Final = "aiodlock_test"

    def __init__(
        self,
        *,
        port: int | None = None,
        settings: dict[str, str] | None = None,
        tls: TLSFiles | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 30.0,
    ) -> None:
        self._bin = postgres_bin_dir()
        super().__init__(port=port, start_timeout=start_timeout, stop_timeout=stop_timeout)
        self.settings = dict(settings or {})
        self.tls = tls

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def url(self) -> str:
        """``postgresql://aiodlock:<password, percent-encoded>@127.0.0.1:<port>/aiodlock_test``."""
        password = quote(self.password, safe="")
        return f"postgresql://{self.user}:{password}@{self.host}:{self.port}/{self.database}"

    def _as_owner(self) -> list[str]:
        """The argv prefix that runs a command as the cluster's owner (root cannot).

        A small Python program drops to that user and ``exec``\\s the command, so the server
        stays our child. It also sets the parent-death signal *after* changing user (the
        kernel clears the one tests/servers.py sets when the user changes; ``setpriv
        --pdeathsig`` sets it too early) — from the main thread only, as that hook does: the
        signal follows the forking *thread*, and a worker thread may end first.
        """
        return as_unprivileged()

    def prepare(self) -> None:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(UNPRIVILEGED)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        password_file = self.directory / "superuser.pw"
        password_file.write_text("unused-superuser-password\n")
        if os.geteuid() == 0:
            os.chown(password_file, pwd.getpwnam(UNPRIVILEGED).pw_uid, -1)
        env = {**os.environ, "LC_ALL": "C"}
        result = subprocess.run(
            [
                *self._as_owner(),
                str(self._bin / "initdb"),
                f"--pgdata={self.data_dir}",
                "--username=postgres",
                f"--pwfile={password_file}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-sync",
            ],
            cwd=self.directory,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            tail = result.stdout.decode(errors="replace")[-3000:]
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{tail}")
        # The role and the database, in single-user mode (one statement per line).
        script = (
            f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}';\n"
            f"CREATE DATABASE {self.database} OWNER {self.user};\n"
        )
        result = subprocess.run(
            [*self._as_owner(), self.binary, "--single", "-D", str(self.data_dir), "postgres"],
            cwd=self.directory,
            env=env,
            input=script.encode(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=120,
        )
        output = result.stdout.decode(errors="replace")
        if result.returncode != 0 or "ERROR" in output:
            raise RuntimeError(f"creating the test role failed ({result.returncode}):\n{output}")
        if self.tls is not None:
            self._install_tls(self.tls)

    def _install_tls(self, files: TLSFiles) -> None:
        """Copy the server's certificate, key and CA where the server user can read them (the
        key must be private to it). Plain and TLS connections are both accepted; a client
        certificate is checked when one is presented."""
        for source, name in (
            (files.server_cert, "server.crt"),
            (files.server_key, "server.key"),
            (files.ca, "ca.crt"),
        ):
            target = self.data_dir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            if os.geteuid() == 0:
                entry = pwd.getpwnam(UNPRIVILEGED)
                os.chown(target, entry.pw_uid, entry.pw_gid)
        self.settings = {
            "ssl": "on",
            "ssl_cert_file": "server.crt",
            "ssl_key_file": "server.key",
            "ssl_ca_file": "ca.crt",
            **self.settings,
        }

    def command(self) -> list[str]:
        settings = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": str(self.directory),
            "shared_buffers": "16MB",
            "fsync": "off",  # a throw-away cluster: a server crash keeps the OS cache anyway
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "log_min_messages": "warning",
            **self.settings,
        }
        return [
            *self._as_owner(),
            self.executable,
            "-D",
            str(self.data_dir),
            *(arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")),
        ]

    def probe(self) -> bool:
        return pg_isready(self.host, self.port)


# ---------------------------------------------------------------------- advisory keys
# The backend's key rule, restated here as the specification the tests hold it to (the
# backend's own helpers are private): tests compare these keys with what pg_locks shows.


def _key(*parts: str) -> int:
    data = b"\x00".join(p.encode("utf-8", "surrogatepass") for p in parts)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big", signed=True)


def advisory_key(namespace: str, family: str, name: str, slot: int | None = None) -> int:
    """The advisory lock key of one lock: the first 64 bits of SHA-256 over the NUL-separated
    ``namespace``, ``family`` (``m`` mutex, ``rw`` read/write, ``s`` semaphore slot), ``name``
    and, for a semaphore, the slot number."""
    if slot is None:
        return _key(namespace, family, name)
    return _key(namespace, family, name, str(slot))


def fence_key(namespace: str, name: str) -> int:
    """The fencing row's key: the first 64 bits of SHA-256 over ``namespace NUL name``."""
    return _key(namespace, name)


# ---------------------------------------------------------------------- the probe

_ADVISORY: Final = """
SELECT l.pid, ((l.classid::bigint << 32) | l.objid::bigint) AS key, l.mode, l.granted
FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


class PostgresProbe:
    """A plain asyncpg session beside the library, as the same role (so it may terminate)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._kills: list[asyncio.Task[None]] = []

    @classmethod
    async def open(cls, url: str) -> PostgresProbe:
        import asyncpg

        parsed = parse_url(url)
        host, port = parsed.hosts[0]
        conn = await asyncpg.connect(
            host=host,
            port=port or 5432,
            user=parsed.username,
            password=parsed.password,
            database=parsed.path.strip("/"),
        )
        return cls(conn)

    async def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        await self._settle()
        return [tuple(r) for r in await self._conn.fetch(sql, *args)]

    async def _settle(self) -> None:
        """Wait for the terminations :meth:`break_lock` sent in the background."""
        kills, self._kills = self._kills, []
        for task in kills:
            await task

    async def advisory_locks(self) -> list[tuple[int, int, str, bool]]:
        """Every advisory lock held or awaited in the database: (pid, key, mode, granted)."""
        return [
            (int(pid), int(key), str(mode), bool(granted))
            for pid, key, mode, granted in await self.rows(_ADVISORY)
        ]

    async def tls_sessions(self) -> list[tuple[bool, str | None]]:
        """``(ssl, client_dn)`` of every aiodlock session (``application_name`` ``aiodlock``,
        or ``aiodlock:OWNER`` while it holds a lock)."""
        rows = await self.rows(
            "SELECT s.ssl, s.client_dn FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
            "WHERE a.application_name LIKE 'aiodlock%'"
        )
        return [(bool(ssl), None if dn is None else str(dn)) for ssl, dn in rows]

    async def sessions(self) -> int:
        """Client sessions of the test role, the probe's own excepted."""
        rows = await self.rows(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = current_user "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return int(rows[0][0])

    async def waits(self) -> int:
        """Sessions of the test role waiting for an advisory lock."""
        rows = await self.rows(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = current_user "
            "AND pid <> pg_backend_pid() AND wait_event = 'advisory'"
        )
        return int(rows[0][0])

    def keys_of(self, namespace: str, name: str, max_slots: int = 256) -> set[int]:
        """Every advisory key the lock ``name`` may use (each family, every semaphore slot)."""
        return {
            advisory_key(namespace, "m", name),
            advisory_key(namespace, "rw", name),
        } | {advisory_key(namespace, "s", name, slot) for slot in range(max_slots)}

    async def holders(self, namespace: str, name: str) -> list[int]:
        """Backend pids holding any key of ``name``."""
        keys = self.keys_of(namespace, name)
        return sorted(
            {pid for pid, key, _, granted in await self.advisory_locks() if granted and key in keys}
        )

    async def terminate(self, pid: int) -> None:
        await self._settle()
        await self._conn.fetchval("SELECT pg_terminate_backend($1)", pid)

    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        """Terminate every backend holding ``name`` (any family, any semaphore slot).

        The holders are found before this returns; the terminations are sent from a task of
        their own: the backend notices its connection closing at once, so a caller inside the
        lock's ``async with`` may be cancelled before the probe's reply comes back, and must
        not be cancelled in the middle of the probe's query.
        """
        holders = await self.holders(namespace, name)
        assert holders, "nothing to break"

        async def kill_all() -> None:
            for pid in holders:
                await self._conn.fetchval("SELECT pg_terminate_backend($1)", pid)

        self._kills.append(asyncio.create_task(kill_all()))

    async def leftovers(self, namespace: str) -> list[str]:
        """Advisory locks held or awaited in the test database (by anyone but the probe).

        Keys are hashes, so they cannot be told apart by namespace: every test of the server
        must end with none at all. The server ends a closed session asynchronously: give it up
        to :data:`SETTLE_SECONDS` before reporting.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_SECONDS
        while True:
            found = [
                f"advisory key {key} {mode} {'held' if granted else 'awaited'} by pid {pid}"
                for pid, key, mode, granted in await self.advisory_locks()
            ]
            if not found or loop.time() > deadline:
                return found
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        try:
            await self._settle()
        finally:
            await self._conn.close()
