"""The mysql backend's test harness: a throw-away MariaDB server, the probe, lock names.

Imported by the MySQL test modules and, lazily, by the server fixtures of tests/conftest.py;
the aiomysql driver is imported only when a probe is opened, so importing this module needs
no driver.

:class:`MariaDBServer` runs a throw-away ``mariadbd`` (Debian's MariaDB 10.11): a data directory
made by ``mariadb-install-db`` in its temporary directory, a free loopback port, a unix socket
there too, and a database plus a user *with a password* (so password redaction is tested for
real) created by an init file on every start. It never touches the machine's own MariaDB on
3306. It loads the ``metadata_lock_info`` plugin, so a probe can list the user locks held.

:class:`MySQLProbe` looks behind the library's back with a plain aiomysql connection:
``break_lock`` ``KILL``s the sessions holding a lock (as an operator would), ``leftovers``
lists user locks still held and ``GET_LOCK`` waits still running in a namespace.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from aiodlock.backends import parse_url
from tests.servers import ServerProcess, TLSFiles

if TYPE_CHECKING:
    import aiodlock

__all__ = ["MAX_LOCK_NAME", "MariaDBServer", "MySQLProbe", "lock_name", "namespace_prefix"]

_INSTALL_DB: Final = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
_ER_NO_SUCH_THREAD: Final = 1094
SETTLE_SECONDS: Final = 3.0
"""How long :meth:`MySQLProbe.leftovers` lets the server finish tearing down closed sessions."""


class MariaDBServer(ServerProcess):
    """A throw-away ``mariadbd`` with a database and a password-protected user (see module)."""

    binary = shutil.which("mariadbd") or "/usr/sbin/mariadbd"

    user: Final = "aiodlock"
    x509_user: Final = "x509_user"
    password: Final = "pa:ss@w/rd%"  # every character the URL must percent-encode
    database: Final = "aiodlock_test"

    def __init__(
        self,
        *,
        port: int | None = None,
        args: list[str] | None = None,
        tls: TLSFiles | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 30.0,
    ) -> None:
        super().__init__(port=port, start_timeout=start_timeout, stop_timeout=stop_timeout)
        self.args = list(args or [])
        self.tls = tls
        """With TLS files: the server takes TLS connections only (``require_secure_transport``),
        and has a user ``x509_user`` (no password) that must present a client certificate."""

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def socket_path(self) -> Path:
        return self.directory / "mysqld.sock"

    @property
    def error_log(self) -> Path:
        return self.directory / "error.log"

    @property
    def url(self) -> str:
        """``mysql://aiodlock:<password, percent-encoded>@127.0.0.1:<port>/aiodlock_test``."""
        password = quote(self.password, safe="")
        return f"mysql://{self.user}:{password}@{self.host}:{self.port}/{self.database}"

    def connect_kwargs(self) -> dict[str, Any]:
        """aiomysql.connect() arguments for the test user."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "db": self.database,
            "autocommit": True,
        }

    def prepare(self) -> None:
        init = self.directory / "init.sql"
        init.write_text(
            f"CREATE DATABASE IF NOT EXISTS {self.database};\n"
            + "".join(
                f"CREATE USER IF NOT EXISTS '{self.user}'@'{host}' "
                f"IDENTIFIED BY '{self.password}';\n"
                f"GRANT ALL PRIVILEGES ON {self.database}.* TO '{self.user}'@'{host}';\n"
                for host in ("127.0.0.1", "localhost")
            )
            + (
                f"CREATE USER IF NOT EXISTS '{self.x509_user}'@'%' REQUIRE X509;\n"
                f"GRANT ALL PRIVILEGES ON {self.database}.* TO '{self.x509_user}'@'%';\n"
                if self.tls is not None
                else ""
            )
        )
        if not Path(_INSTALL_DB).exists():
            raise RuntimeError(f"{_INSTALL_DB} is missing; run scripts/install-system-deps.sh")
        result = subprocess.run(
            [
                _INSTALL_DB,
                "--no-defaults",
                f"--datadir={self.data_dir}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                "--innodb-log-file-size=8M",
                # Its own temp dir: two servers bootstrapping at once in a shared /tmp
                # collide on the temporary table names ("Unknown table mysql.tmp_user_sys").
                f"--tmpdir={self.directory}",
            ],
            cwd=self.directory,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            tail = result.stdout.decode(errors="replace")[-3000:]
            raise RuntimeError(f"mariadb-install-db failed ({result.returncode}):\n{tail}")

    def command(self) -> list[str]:
        return [
            self.executable,
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--socket={self.socket_path}",
            f"--port={self.port}",
            f"--bind-address={self.host}",
            f"--pid-file={self.directory / 'mariadbd.pid'}",
            f"--log-error={self.error_log}",
            f"--init-file={self.directory / 'init.sql'}",
            "--user=root",
            "--skip-name-resolve",
            f"--tmpdir={self.directory}",
            "--plugin-load-add=metadata_lock_info",
            "--innodb-buffer-pool-size=16M",
            "--innodb-log-file-size=8M",
            # Durable against a mariadbd crash or restart (the OS keeps the log); only an OS
            # crash could lose the last second. The fencing table relies on the former.
            "--innodb-flush-log-at-trx-commit=2",
            *self.tls_args(),
            *self.args,
        ]

    def tls_args(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            f"--ssl-ca={self.tls.ca}",
            f"--ssl-cert={self.tls.server_cert}",
            f"--ssl-key={self.tls.server_key}",
            "--require-secure-transport=ON",
        ]

    def client_context(self) -> ssl.SSLContext | None:
        """For a TLS server: a context that trusts its CA (no client certificate)."""
        if self.tls is None:
            return None
        return ssl.create_default_context(cafile=str(self.tls.ca))

    def probe(self) -> bool:
        try:
            import pymysql  # type: ignore[import-untyped]  # comes with aiomysql, untyped

            conn = pymysql.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password,
                database=self.database,
                connect_timeout=1,
                ssl=self.client_context(),
            )
        except Exception:
            return False
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")
                return bool(cursor.fetchone() == (1,))
        except Exception:
            return False
        finally:
            conn.close()

    def log_files(self) -> list[Path]:
        return [self.error_log]


# ---------------------------------------------------------------------- server-side names
# The backend's naming rule, restated here as the specification the tests hold it to (the
# backend's own helpers are private): tests compare these names with what the server shows.

MAX_LOCK_NAME: Final = 64
"""MySQL's limit on user-lock names (MariaDB has none; the backend keeps to it everywhere)."""
_HASH_CHARS: Final = 40
_PREFIX_CHARS: Final = MAX_LOCK_NAME - 1 - _HASH_CHARS
_SAFE: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.:/@+=,#")


def lock_name(namespace: str, family: str, name: str, slot: int | None = None) -> str:
    """The user-lock name of one lock (``family`` ``m``: mutex, ``s``: a semaphore slot).

    Verbatim when ``namespace:family:name[#slot]`` is at most 64 characters of a small
    lowercase alphabet; otherwise a sanitised 23-character prefix, ``~`` and 40 base32
    characters of SHA-256 over the NUL-separated parts.
    """
    plain = f"{namespace}:{family}:{name}"
    if slot is not None:
        plain = f"{plain}#{slot}"
    if len(plain) <= MAX_LOCK_NAME and _SAFE.issuperset(plain):
        return plain
    parts = [p.encode("utf-8", "surrogatepass") for p in (namespace, family, name)]
    if slot is not None:
        parts.append(str(slot).encode())
    digest = hashlib.sha256(b"\x00".join(parts)).digest()
    tail = base64.b32encode(digest).decode("ascii").lower()[:_HASH_CHARS]
    prefix = "".join(c if c in _SAFE else "_" for c in plain[: _PREFIX_CHARS * 2].lower())
    return f"{prefix[:_PREFIX_CHARS]}~{tail}"


def namespace_prefix(namespace: str) -> str:
    """What every lock name of ``namespace`` starts with (exact for short, plain namespaces)."""
    prefix = "".join(c if c in _SAFE else "_" for c in f"{namespace}:".lower())
    return prefix[:_PREFIX_CHARS]


# ---------------------------------------------------------------------- the probe


class MySQLProbe:
    """A plain aiomysql session beside the library, as the same user (so it may KILL)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._kills: list[asyncio.Task[None]] = []

    @classmethod
    async def open(cls, url: str) -> MySQLProbe:
        import aiomysql

        parsed = parse_url(url)
        host, port = parsed.hosts[0]
        conn = await aiomysql.connect(
            host=host,
            port=port or 3306,
            user=parsed.username,
            password=parsed.password or "",
            db=parsed.path.strip("/"),
            autocommit=True,
        )
        return cls(conn)

    @property
    def thread_id(self) -> int:
        return int(self._conn.server_thread_id[0])

    async def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Run one statement on the probe's session (not through a cursor: no warnings)."""
        await self._settle()
        return await self._query(sql)

    async def _query(self, sql: str) -> list[tuple[Any, ...]]:
        await self._conn.query(sql)
        return list(self._conn._result.rows or ())

    async def _settle(self) -> None:
        """Wait for the KILLs :meth:`break_lock` sent in the background."""
        kills, self._kills = self._kills, []
        for task in kills:
            await task

    async def user_locks(self, namespace: str) -> dict[str, int]:
        """User locks held in ``namespace``: server-side lock name -> holder's CONNECTION_ID."""
        prefix = namespace_prefix(namespace)
        rows = await self.rows(
            "SELECT TABLE_SCHEMA, THREAD_ID FROM information_schema.METADATA_LOCK_INFO "
            f"WHERE LOCK_TYPE = 'User lock' AND LEFT(TABLE_SCHEMA, {len(prefix)}) = '{prefix}'"
        )
        return {str(name): int(thread) for name, thread in rows}

    async def waits(self, namespace: str) -> list[tuple[int, str]]:
        """``GET_LOCK`` statements of ``namespace`` still running: (CONNECTION_ID, query)."""
        prefix = namespace_prefix(namespace)
        rows = await self.rows(
            "SELECT ID, INFO FROM information_schema.PROCESSLIST "
            f"WHERE ID <> CONNECTION_ID() AND LOCATE('GET_LOCK(''{prefix}', INFO) > 0"
        )
        return [(int(i), str(info)) for i, info in rows]

    async def sessions(self) -> int:
        """Sessions of the test user on the server, the probe's own excepted."""
        rows = await self.rows(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
            "WHERE USER = SUBSTRING_INDEX(USER(), '@', 1) AND ID <> CONNECTION_ID()"
        )
        return int(rows[0][0])

    async def kill(self, thread_id: int) -> None:
        """``KILL CONNECTION``; waits for the server's reply."""
        await self._settle()
        await self._kill(thread_id)

    async def _kill(self, thread_id: int) -> None:
        import aiomysql

        with contextlib.suppress(aiomysql.OperationalError, aiomysql.InternalError):
            await self._query(f"KILL CONNECTION {int(thread_id)}")

    async def break_lock(self, client: aiodlock.LockClient, namespace: str, name: str) -> None:
        """KILL every session holding ``name`` (mutex or any semaphore slot).

        The holders are found before this returns; the KILLs are sent from a task of their
        own. The backend notices a killed session at once (the socket closes), so a caller
        inside the lock's ``async with`` may be cancelled before KILL's own reply comes back:
        it must not be cancelled *here*, in the middle of the probe's query.
        """
        from aiodlock.backends.mysql import MAX_SEMAPHORE_LIMIT

        candidates = {lock_name(namespace, "m", name)} | {
            lock_name(namespace, "s", name, slot) for slot in range(MAX_SEMAPHORE_LIMIT)
        }
        held = await self.user_locks(namespace)
        holders = sorted({thread for lock, thread in held.items() if lock in candidates})
        assert holders, "nothing to break"

        async def kill_all() -> None:
            for thread in holders:
                await self._kill(thread)

        self._kills.append(asyncio.create_task(kill_all()))

    async def leftovers(self, namespace: str) -> list[str]:
        """User locks held and GET_LOCK waits running in ``namespace``.

        The server tears a closed session down asynchronously (a ms or so; a session killed
        while waiting, at once): give it up to :data:`SETTLE_SECONDS` before reporting.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_SECONDS
        while True:
            held = await self.user_locks(namespace)
            waiting = await self.waits(namespace)
            found = [f"lock {lock!r} held by session {thread}" for lock, thread in held.items()]
            found += [f"session {thread} waiting: {info}" for thread, info in waiting]
            if not found or loop.time() > deadline:
                return found
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        try:
            await self._settle()
        finally:
            self._conn.close()
