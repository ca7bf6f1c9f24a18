"""The SQL text of the MySQL/MariaDB dialect: the fencing table, its statements, the names.

Statements are built from constants, never from user text: names and owners go in as hex
literals (``X'...'``) or as the checked, escape-free names of :mod:`.._mysql_names`. Why each
statement has its shape is told in docs/mysql.md.
"""

from __future__ import annotations

import functools
import re
from typing import Final

from ._fencing import SWEEP_BATCH
from ._mysql_names import fence_key, lock_name

__all__ = [
    "ER_BAD_FIELD",
    "ER_DUP_FIELDNAME",
    "ER_NO_SUCH_TABLE",
    "ER_NO_SUCH_THREAD",
    "FENCE_BUMP",
    "FENCE_DDL",
    "FENCE_MOVE",
    "LIMIT_COLUMN",
    "MAX_WAIT_TIMEOUT",
    "NAMESPACES",
    "OWNER",
    "SEM_FENCE_BUMP",
    "SESSIONS_DDL",
    "SESSIONS_SWEEP",
    "SESSION_IDENTITIES",
    "SESSION_ROW",
    "SWEEP",
    "TAKE_AND_BUMP",
    "TOUCHED_COLUMN",
    "WAITS",
    "WAIT_CALL",
    "WHO_COLUMNS",
    "fence_statement",
    "hex_digits",
    "holder_name",
]

MAX_WAIT_TIMEOUT: Final = 31_536_000  # the server's upper bound for wait_timeout
ER_NO_SUCH_TABLE: Final = 1146
ER_BAD_FIELD: Final = 1054  # a fence table made before sem_limit existed
ER_DUP_FIELDNAME: Final = 1060  # another client added the column first
ER_NO_SUCH_THREAD: Final = 1094

FENCE_DDL: Final = """CREATE TABLE IF NOT EXISTS {table} (
    lock_key BINARY(32) NOT NULL PRIMARY KEY COMMENT 'sha256(namespace NUL name)',
    lock_name VARCHAR(64) CHARACTER SET ascii NOT NULL COMMENT 'readable, for operators',
    token BIGINT UNSIGNED NOT NULL COMMENT 'last fencing token handed out',
    {limit_column},
    {touched_column},
    {who_columns}
) ENGINE=InnoDB COMMENT='aiodlock fencing tokens: one row per lock name used lately'"""
LIMIT_COLUMN: Final = (
    "sem_limit SMALLINT UNSIGNED NULL COMMENT 'the limit of the semaphore holders, if any'"
)
TOUCHED_COLUMN: Final = (
    "touched DATETIME(6) NOT NULL DEFAULT '1970-01-01' COMMENT 'last grant (UTC)', "
    "ADD INDEX idle (touched)"
)
# For operators (inspect names the locks of a namespace, and the owner of the newest grant).
WHO_COLUMNS: Final = (
    "namespace VARBINARY(1024) NULL COMMENT 'the namespace (UTF-8), for operators', "
    "ADD COLUMN name VARBINARY(1024) NULL COMMENT 'the lock name (UTF-8), for operators', "
    "ADD COLUMN holder VARBINARY(64) NULL COMMENT 'owner id of the newest grant', "
    "ADD COLUMN holder_connection BIGINT UNSIGNED NULL COMMENT 'CONNECTION_ID() of it', "
    "ADD INDEX by_namespace (namespace(64))"
)
WHO_INSERT: Final = "X'{ns}', X'{name}', X'{owner}', CONNECTION_ID()"
WHO_UPDATE: Final = (
    "namespace = X'{ns}', name = X'{name}', holder = X'{owner}', "
    "holder_connection = CONNECTION_ID()"
)
# A new row starts from the server's clock in microseconds, not 1: then a name whose row was
# swept (or lost) still gets tokens above every earlier one. UNIX_TIMESTAMP() reads the epoch
# itself (UNIX_TIMESTAMP(NOW(6)) goes through the session's time zone and can step back an
# hour when daylight saving time ends); the microseconds of NOW(6), the same instant (the
# statement's start), do not depend on the time zone.
SEED: Final = "UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))"
# A grant refreshes ``touched`` only once it is older than the client's refresh interval
# (a fraction of fence_ttl, at most an hour): moving the row in the ``idle`` index on every grant
# would cost more than the rest of the statement.
RETOUCH: Final = (
    "touched = IF(touched < UTC_TIMESTAMP(6) - INTERVAL {refresh} SECOND, "
    "UTC_TIMESTAMP(6), touched)"
)
FENCE_BUMP: Final = (
    "INSERT INTO {table} (lock_key, lock_name, token, touched, namespace, name, holder, "
    "holder_connection) VALUES (X'{key}', '{label}', "
    f"LAST_INSERT_ID({SEED}), UTC_TIMESTAMP(6), {WHO_INSERT}) ON DUPLICATE KEY UPDATE "
    f"token = LAST_INSERT_ID(token + 1), {RETOUCH}, {WHO_UPDATE}"
)
# A mutex is taken and fenced in one round trip: the row is written only if GET_LOCK says 1
# (one row FROM DUAL: the condition runs once), so no row changed means busy (or, for a wait,
# not granted within the slice).
TAKE_AND_BUMP: Final = (
    "INSERT INTO {table} (lock_key, lock_name, token, touched, namespace, name, holder, "
    "holder_connection) SELECT X'{key}', '{label}', "
    f"LAST_INSERT_ID({SEED}), UTC_TIMESTAMP(6), {WHO_INSERT} FROM DUAL "
    "WHERE GET_LOCK('{target}', {wait}) = 1 ON DUPLICATE KEY UPDATE "
    f"token = LAST_INSERT_ID(token + 1), {RETOUCH}, {WHO_UPDATE}"
)
# A semaphore's bump also records its limit on first use (a row without one).
SEM_FENCE_BUMP: Final = (
    "INSERT INTO {table} (lock_key, lock_name, token, touched, sem_limit, namespace, name, "
    "holder, holder_connection) VALUES (X'{key}', "
    f"'{{label}}', LAST_INSERT_ID({SEED}), UTC_TIMESTAMP(6), {{limit}}, {WHO_INSERT}) "
    f"ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), {RETOUCH}, "
    f"sem_limit = IFNULL(sem_limit, {{limit}}), {WHO_UPDATE}"
)
# Each aiodlock session's client identity, for inspect: one row per session, written once
# when the backend opens it (SESSION_ROW, created like the fencing table on first use) and
# overwritten by a later session of the same id. Rows of sessions gone from PROCESSLIST go at
# the fencing sweep (SESSIONS_SWEEP): those of the sweeper's own user name at once (PROCESSLIST
# shows a user's own sessions without the PROCESS privilege), others once older than fence_ttl.
SESSIONS_DDL: Final = """CREATE TABLE IF NOT EXISTS {sessions} (
    connection BIGINT UNSIGNED NOT NULL PRIMARY KEY COMMENT 'CONNECTION_ID()',
    account VARBINARY(512) NOT NULL COMMENT 'its user name (USER())',
    started DATETIME(6) NOT NULL COMMENT 'when the row was written (UTC)',
    identity VARBINARY(512) NOT NULL COMMENT 'the client identity (UTF-8)'
) ENGINE=InnoDB COMMENT='aiodlock: the client identity of each session'"""
_ACCOUNT: Final = "SUBSTRING_INDEX(USER(), '@', 1)"
# REPLACE: a row of an earlier session with this id (before a restart) is overwritten whole.
SESSION_ROW: Final = (
    "REPLACE INTO {sessions} (connection, account, started, identity) VALUES "
    f"(CONNECTION_ID(), {_ACCOUNT}, UTC_TIMESTAMP(6), X'{{identity}}')"
)
SESSIONS_SWEEP: Final = (
    "DELETE FROM {sessions} WHERE connection NOT IN "
    "(SELECT ID FROM information_schema.PROCESSLIST) "
    f"AND (account = {_ACCOUNT} OR started < UTC_TIMESTAMP(6) - INTERVAL {{seconds}} SECOND)"
)
SESSION_IDENTITIES: Final = (
    "SELECT connection, identity FROM {sessions} WHERE connection IN ({ids})"
)
NAMESPACES: Final = "SELECT DISTINCT namespace FROM {table} WHERE namespace IS NOT NULL"
# inspect: the statements of the sessions waiting in GET_LOCK (a wait has a timeout > 0).
WAITS: Final = (
    "SELECT INFO FROM information_schema.PROCESSLIST "
    "WHERE ID <> CONNECTION_ID() AND INFO LIKE '%GET\\_LOCK(%'"
)
WAIT_CALL: Final = re.compile(r"GET_LOCK\('([^']*)', ([0-9.]+)\)")
# break: the fencing row moves on, as a grant would.
FENCE_MOVE: Final = "UPDATE {table} SET token = token + 1 WHERE lock_key = X'{key}'"
SWEEP: Final = (
    "DELETE FROM {table} WHERE touched < UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND "
    f"LIMIT {SWEEP_BATCH}"
)


def holder_name(conn: int, holder: bytes | None, holder_conn: int | None) -> str:
    """The owner id recorded by the newest grant if session ``conn`` made it, else the
    session's id."""
    if holder is not None and holder_conn is not None and int(holder_conn) == conn:
        return bytes(holder).decode("ascii", "replace")
    return f"connection {conn}"


OWNER: Final = "{owner}"  # left in a statement made for a lock, filled in per grant


# Cached: the same few names are locked again and again, and the hashes, hex and formatting
# of a statement cost more than the rest of the client's work on an uncontended grant.
@functools.lru_cache(maxsize=1024)
def fence_statement(
    template: str,
    table: str,
    namespace: str,
    name: str,
    limit: int,
    refresh: int,
    target: str,
    wait: str,
) -> str:
    """A fencing statement for one lock, with ``{owner}`` still to fill in."""
    return template.format(
        table=table,
        key=fence_key(namespace, name).hex(),
        label=lock_name(namespace, "f", name),
        limit=limit,
        ns=hex_digits(namespace),
        name=hex_digits(name),
        owner=OWNER,
        refresh=refresh,
        target=target,
        wait=wait,
    )


def hex_digits(text: str) -> str:
    """``text`` as the digits of an SQL hex literal (``X'...'``): no quoting to get wrong."""
    return text.encode("utf-8", "surrogatepass").hex()
