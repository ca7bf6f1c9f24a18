"""A throw-away PgBouncer in front of the harness's PostgreSQL, in one pool mode.

:class:`PgBouncerServer` runs Debian's ``pgbouncer`` (1.18 or later) on a free loopback port
with its configuration in its temporary directory, forwarding the test database of a running
:class:`~tests.support_postgres.PostgresServer` to that server. Clients log in as the test
role with its password, by SCRAM (PgBouncer reads the password from its ``auth_file`` and
uses it to log in to PostgreSQL, which asks for SCRAM too); :attr:`PgBouncerServer.url` is the
server's URL on PgBouncer's port. No unix socket, no admin console, stock limits otherwise.

Usage::

    with PgBouncerServer(postgres, pool_mode="transaction", default_pool_size=1) as bouncer:
        url = bouncer.url  # postgresql://aiodlock:...@127.0.0.1:<bouncer port>/aiodlock_test

The pool modes, as the tests rely on them: ``session`` gives a client one server session for
its whole life (advisory locks work; ``DISCARD ALL`` frees the session's locks when the client
leaves); ``transaction`` lends a server session per transaction, so two clients may run on
one session and a session-level advisory lock belongs to no client.

PgBouncer refuses to run as root, so when the tests run as root it runs as the same
unprivileged user as the PostgreSQL cluster, through the same small program
(tests/support_postgres.py), and stays our child. It never touches the machine's own
PgBouncer service (Debian's package installs one on 6432).
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote

from tests.servers import ServerProcess

# PostgresServer's privilege drop (private there), shared: PgBouncer refuses root as well.
from tests.support_postgres import UNPRIVILEGED, as_unprivileged, pg_isready

if TYPE_CHECKING:
    from tests.support_postgres import PostgresServer

__all__ = ["PgBouncerServer", "PoolMode"]

PoolMode = Literal["session", "transaction", "statement"]


def _pgbouncer_binary() -> str:
    """``pgbouncer`` on PATH, else Debian's ``/usr/sbin/pgbouncer`` (off a user's PATH)."""
    return shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _quoted(value: str) -> str:
    """``value`` as a double-quoted ``auth_file`` field (a quote is written twice)."""
    return '"' + value.replace('"', '""') + '"'


class PgBouncerServer(ServerProcess):
    """A throw-away ``pgbouncer`` in front of ``upstream``'s test database (see module).

    ``settings`` are extra ``[pgbouncer]`` options, applied last (``{"server_round_robin":
    "1"}``).
    """

    binary = _pgbouncer_binary()

    def __init__(
        self,
        upstream: PostgresServer,
        *,
        pool_mode: PoolMode,
        default_pool_size: int = 5,
        settings: dict[str, str] | None = None,
        port: int | None = None,
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(port=port, start_timeout=start_timeout, stop_timeout=stop_timeout)
        self.upstream = upstream
        self.pool_mode = pool_mode
        self.default_pool_size = default_pool_size
        self.settings = dict(settings or {})

    @property
    def config_file(self) -> Path:
        return self.directory / "pgbouncer.ini"

    @property
    def url(self) -> str:
        """The upstream's URL on PgBouncer's port: same role, password and database."""
        up = self.upstream
        password = quote(up.password, safe="")
        return f"postgresql://{up.user}:{password}@{self.host}:{self.port}/{up.database}"

    def prepare(self) -> None:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(UNPRIVILEGED)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)

    def command(self) -> list[str]:
        # Written at each start, not once in prepare(): the first start may retry on a new port.
        self._write_config()
        return [*as_unprivileged(), self.executable, str(self.config_file)]

    def _write_config(self) -> None:
        up = self.upstream
        auth_file = self.directory / "userlist.txt"
        # A plain-text password: PgBouncer needs it (not a SCRAM secret) to log in upstream.
        auth_file.write_text(f"{_quoted(up.user)} {_quoted(up.password)}\n")
        auth_file.chmod(0o600)
        options = {
            "listen_addr": self.host,
            "listen_port": str(self.port),
            "unix_socket_dir": "",  # none: nothing of ours in /tmp
            "auth_type": "scram-sha-256",
            "auth_file": str(auth_file),
            "pool_mode": self.pool_mode,
            "default_pool_size": str(self.default_pool_size),
            # No ignore_startup_parameters: the backend sends PgBouncer nothing it refuses
            # (its session settings go in a SET once the session is known to be its own).
            **self.settings,
        }
        target = f"host={up.host} port={up.port} dbname={up.database}"
        lines = ["[databases]", f"{up.database} = {target}", "", "[pgbouncer]"]
        lines += [f"{key} = {value}" for key, value in options.items()]
        self.config_file.write_text("\n".join(lines) + "\n")
        if os.geteuid() == 0:
            entry = pwd.getpwnam(UNPRIVILEGED)
            for path in (auth_file, self.config_file):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def probe(self) -> bool:
        """PgBouncer answers a start-up packet (``pg_isready``: an authentication request or
        an error from PgBouncer itself both count; only a dead port does not)."""
        up = self.upstream
        return pg_isready(self.host, self.port, "-d", up.database, "-U", up.user)
