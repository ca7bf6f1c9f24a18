"""The SQL engine: one lock engine that MySQL/MariaDB and PostgreSQL plug their dialects into.

Both backends hold locks in database sessions: a free mutex on one of a few shared sessions
(:mod:`._shared`, :mod:`._shared_locks`), a wait and the other kinds on a session of their own.
What they share lives here, one job per module: the connection pool (:mod:`._pool`), the
acquisitions and the local holders (:mod:`._acquisitions`), the background janitor
(:mod:`._janitor`), the fencing-row sweeps (:mod:`._fencing`) and the engine that runs
acquire, wait, renew and release (:mod:`._engine`). A :class:`Dialect` says how one server
does each step (``GET_LOCK`` or advisory locks, its fencing statement, its error codes).
docs/mysql.md and docs/postgres.md tell the design.
"""

from ._acquisitions import Acquisition as Acquisition
from ._connection import Connection as Connection, ConnectSettings as ConnectSettings
from ._dialect import (
    Attempt as Attempt,
    Dialect as Dialect,
    DialectBase as DialectBase,
    Operate as Operate,
)
from ._engine import CAPABILITIES as CAPABILITIES, SQLEngine as SQLEngine
from ._settings import (
    ALIASES as ALIASES,
    OPTIONS as OPTIONS,
    Settings as Settings,
    check_table_name as check_table_name,
    connect_settings as connect_settings,
    read_settings as read_settings,
)

__all__ = [
    "ALIASES",
    "CAPABILITIES",
    "OPTIONS",
    "Acquisition",
    "Attempt",
    "ConnectSettings",
    "Connection",
    "Dialect",
    "DialectBase",
    "Operate",
    "SQLEngine",
    "Settings",
    "check_table_name",
    "connect_settings",
    "read_settings",
]
