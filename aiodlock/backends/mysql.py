"""The MySQL/MariaDB backend: ``mysql://user:password@host:port/database`` on aiomysql.

Locks are the server's user-level locks (``GET_LOCK``), each held by a dedicated connection:
the lock lives exactly as long as that session, so a crashed process, a killed session or a
dropped connection frees it at once. This module reads the options; the lock engine is shared
with PostgreSQL (:mod:`.sql`), the MySQL statements are its dialect
(:mod:`.sql._mysql_dialect`). docs/mysql.md tells the design: the connection lease, waiting
on the server, names, fencing, semaphores and failures.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from . import TLS_OPTIONS, Capability, ParsedURL, tls_context
from .sql._engine import CAPABILITIES, SQLEngine
from .sql._mysql_conn import Conn
from .sql._mysql_dialect import MAX_SEMAPHORE_LIMIT, MySQLDialect
from .sql._settings import OPTIONS, check_table_name, connect_settings, read_settings

__all__ = ["MAX_SEMAPHORE_LIMIT", "MySQLBackend"]

_DEFAULT_PORT: Final = 3306
_logger: Final = logging.getLogger("aiodlock.mysql")
_check_table: Final = functools.partial(check_table_name, longest=64, fold=False)


class MySQLBackend(SQLEngine[Conn, str]):
    """Locks on one MySQL or MariaDB server (see docs/mysql.md for the design).

    URL: ``mysql://user:password@host:port/database`` (port 3306 by default; the database
    holds the fencing table). Options (URL query or keyword; docs/mysql.md has the table):
    ``connect_timeout``, ``request_timeout`` (alias ``query_timeout``), ``wait_slice``,
    ``max_connections``, ``max_idle``, ``fence_table``, ``fence_ttl``, ``unix_socket``, and
    TLS: ``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``, ``tls_verify`` (aliases ``ssl``,
    ``ssl_ca``, ``ssl_cert``, ``ssl_key``) and ``ssl_check_hostname``.

    Example::

        async with aiodlock.connect("mysql://app:secret@db:3306/shop") as locks:
            async with locks.lock("order:42", ttl=10) as lease:
                print(lease.fencing_token)
    """

    capabilities: ClassVar[frozenset[Capability]] = CAPABILITIES
    queues_on_busy: ClassVar[bool] = False
    """A refused ``GET_LOCK(name, 0)`` leaves nothing queued on the server."""
    options: ClassVar[Mapping[str, type]] = {**OPTIONS, "unix_socket": str, **TLS_OPTIONS}

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        unix_socket = options.get("unix_socket")
        if unix_socket is not None and (not isinstance(unix_socket, str) or not unix_socket):
            raise TypeError("unix_socket must be a non-empty str (a socket path)")
        settings = read_settings(url, options, check_table=_check_table)
        connect = connect_settings(
            url,
            settings,
            _DEFAULT_PORT,
            unix_socket=unix_socket,
            tls=tls_context(options, scheme=url.scheme),
        )
        self._mysql = MySQLDialect(settings, connect)
        super().__init__(self._mysql, settings, password=url.password, logger=_logger)

    @property
    def fractional_timeouts(self) -> bool:
        """MariaDB takes ``GET_LOCK(name, 0.25)``; MySQL rounds the timeout to whole seconds.
        Read from the server version at ``open()``; a test may set it to emulate the other."""
        return self._mysql.fractional_timeouts

    @fractional_timeouts.setter
    def fractional_timeouts(self, value: bool) -> None:
        self._mysql.fractional_timeouts = value
