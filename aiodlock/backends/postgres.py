"""The PostgreSQL backend: ``postgresql://user:password@host:port/database`` on asyncpg.

Locks are the server's session-level advisory locks, each held by a dedicated connection: the
lock lives exactly as long as that session, so a crashed process, a terminated backend, a
dropped connection or a server restart frees it at once. PostgreSQL 14 or later. This module
reads the options; the lock engine is shared with MySQL (:mod:`.sql`), the PostgreSQL
statements are its dialect (:mod:`.sql._pg_dialect`). docs/postgres.md tells the design: the
connection lease, waiting on the server, keys, fencing, kinds, TLS and failures.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from . import Capability, ParsedURL
from .sql._engine import CAPABILITIES, SQLEngine
from .sql._pg_conn import Conn
from .sql._pg_dialect import MAX_SEMAPHORE_LIMIT, Held, PostgresDialect
from .sql._pg_tls import PG_TLS_OPTIONS, pg_tls
from .sql._pg_xact import lock_in_transaction, try_lock_in_transaction
from .sql._settings import OPTIONS, check_table_name, connect_settings, read_settings

__all__ = [
    "MAX_SEMAPHORE_LIMIT",
    "PostgresBackend",
    "lock_in_transaction",
    "try_lock_in_transaction",
]

_DEFAULT_PORT: Final = 5432
_logger: Final = logging.getLogger("aiodlock.postgres")
_check_table: Final = functools.partial(check_table_name, longest=63, fold=True)


class PostgresBackend(SQLEngine[Conn, Held]):
    """Locks on one PostgreSQL server (see docs/postgres.md for the design).

    URL: ``postgresql://user:password@host:port/database`` (also ``postgres://``; port 5432 by
    default; the database holds the fencing table). Options (URL query or keyword;
    docs/postgres.md has the table): ``connect_timeout``, ``request_timeout`` (alias
    ``query_timeout``), ``wait_slice``, ``max_connections``, ``max_idle``, ``fence_table``,
    ``fence_ttl``, and TLS: libpq's ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``, or
    ``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``, ``tls_verify`` as on every backend.

    Example::

        async with aiodlock.connect("postgresql://app:secret@db:5432/shop") as locks:
            async with locks.lock("order:42", ttl=10) as lease:
                print(lease.fencing_token)
    """

    capabilities: ClassVar[frozenset[Capability]] = CAPABILITIES | {Capability.SHARED}
    queues_on_busy: ClassVar[bool] = False
    """A refused ``pg_try_advisory_lock`` leaves nothing queued on the server."""
    options: ClassVar[Mapping[str, type]] = {**OPTIONS, **PG_TLS_OPTIONS}

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        settings = read_settings(url, options, check_table=_check_table)
        connect = connect_settings(url, settings, _DEFAULT_PORT, tls=pg_tls(options))
        dialect = PostgresDialect(settings, connect)
        super().__init__(dialect, settings, password=url.password, logger=_logger)
