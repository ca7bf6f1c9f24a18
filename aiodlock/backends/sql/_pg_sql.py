"""The SQL text of the PostgreSQL dialect: the fencing table, the grant, wait, keep-alive and
release statements, and the operators' queries.

Values go in as parameters (``$1``...); only the checked table name and constant fragments are
formatted in. Why each statement has its shape is told in docs/postgres.md.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ADVISORY_KEY",
    "APPLICATION",
    "BUMP",
    "CLAIM",
    "CLEAN",
    "CLOCK_US",
    "DATABASE",
    "DUPLICATE",
    "FENCED_WAIT",
    "FENCE_COMMENT",
    "FENCE_DDL",
    "FENCE_INDEX",
    "FENCE_MOVE",
    "GRANT",
    "HELD_BY_OTHERS",
    "HOLDER_COLUMN",
    "INSPECT",
    "KEEP_ALIVE",
    "MAX_TIMEOUT_MS",
    "NAMESPACES",
    "RELEASE",
    "RELEASE_EXCLUSIVE",
    "RELEASE_ONE_EXCLUSIVE",
    "RELEASE_SHARED",
    "SESSIONS_COMMENT",
    "SESSIONS_DDL",
    "SESSIONS_SWEEP",
    "SESSION_ROW",
    "SWEEP",
    "TERMINATE",
    "TERMINATE_WAIT_MS",
    "UNDEFINED_TABLE",
    "owner_of",
]

MAX_TIMEOUT_MS: Final = 2_147_483_647  # the largest value of an integer GUC
UNDEFINED_TABLE: Final = "42P01"
DUPLICATE: Final = ("42P07", "23505")  # a concurrent CREATE of the same table or index

CLOCK_US: Final = "(extract(epoch from clock_timestamp()) * 1000000)::bigint"

FENCE_DDL: Final = """CREATE TABLE IF NOT EXISTS {table} (
    lock_key bigint PRIMARY KEY,
    namespace text NOT NULL,
    name text NOT NULL,
    token bigint NOT NULL,
    sem_limit integer,
    touched timestamptz NOT NULL DEFAULT clock_timestamp(),
    holder text
)"""
# A table made before locks shared sessions has no holder column: added at start.
HOLDER_COLUMN: Final = "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS holder text"
FENCE_INDEX: Final = "CREATE INDEX IF NOT EXISTS {table}_touched ON {table} (touched)"
FENCE_COMMENT: Final = (
    "COMMENT ON TABLE {table} IS 'aiodlock fencing tokens: one row per lock name "
    "(lock_key = 64 bits of sha256(namespace NUL name))'"
)

# Each aiodlock session's client identity, for inspect: one row per server session, written
# once when the backend opens the session (SESSION_ROW, in the round trip of its settings) and
# overwritten by the next session of the same pid. A row counts only while its session lives
# (same pid and, where the reader may see it, same backend_start); rows of ended sessions go at
# the fencing sweep (SESSIONS_SWEEP). UNLOGGED: no WAL, and a crash, which ends every session,
# empties it.
SESSIONS_DDL: Final = """CREATE UNLOGGED TABLE IF NOT EXISTS {sessions} (
    pid integer PRIMARY KEY,
    backend_start timestamptz,
    identity text NOT NULL
)"""
SESSIONS_COMMENT: Final = (
    "COMMENT ON TABLE {sessions} IS 'aiodlock: the client identity of each session "
    "(pg_backend_pid()), written when the session opens'"
)
# A literal script fragment (it runs with the session settings, simple-query protocol): the
# identity goes in as hex digits, so no quoting can go wrong.
SESSION_ROW: Final = """INSERT INTO {sessions} AS s (pid, backend_start, identity)
SELECT pg_backend_pid(), (SELECT backend_start FROM pg_stat_get_activity(pg_backend_pid())),
       convert_from(decode('{identity_hex}', 'hex'), 'UTF8')
ON CONFLICT (pid) DO UPDATE
    SET backend_start = EXCLUDED.backend_start, identity = EXCLUDED.identity"""
# A row whose session has ended (its pid gone, or another session's now).
SESSION_ALIVE: Final = (
    "a.pid = s.pid AND (a.backend_start IS NULL OR a.backend_start = s.backend_start)"
)
SESSIONS_SWEEP: Final = f"""DELETE FROM {{sessions}} s
WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE {SESSION_ALIVE})"""

# $1 fence key, $2 namespace, $3 name, $4 the semaphore's limit (NULL for other kinds), and
# {holder} the parameter naming the grant's owner (``aiodlock:OWNER``: a mutex on a shared
# session is told apart from the others on it by this column, see INSPECT). A new
# row starts at the server clock in microseconds, and every bump keeps up with that clock, so a
# row deleted after fence_ttl comes back above every token it ever handed out. A row of
# another name (a hash collision) is left alone: no row comes back.
BUMP: Final = """bump AS (
    INSERT INTO {table} AS f (lock_key, namespace, name, token, sem_limit, touched, holder)
    SELECT $1, $2, $3, {clock}, $4::integer, clock_timestamp(), {holder} {source}
    ON CONFLICT (lock_key) DO UPDATE
        SET token = GREATEST(f.token + 1, {clock}), touched = clock_timestamp(),
            sem_limit = COALESCE(f.sem_limit, EXCLUDED.sem_limit), holder = EXCLUDED.holder
        WHERE f.namespace = EXCLUDED.namespace AND f.name = EXCLUDED.name
    RETURNING f.token, f.sem_limit)"""

# The grant: try the key(s) ($6, in order, stopping at the first taken) and bump the fencing
# row in the same statement, and set the holder's idle_session_timeout ($5, ms) — one round
# trip. Returns (slot taken or -1, token, sem_limit). A refusal leaves both settings as they
# were: on a shared session they belong to the leases it holds.
GRANT: Final = """WITH got AS MATERIALIZED (SELECT CASE {whens} ELSE -1 END AS slot),
{bump}
SELECT got.slot, bump.token, bump.sem_limit,
       set_config('idle_session_timeout',
                  CASE WHEN got.slot >= 0 THEN $5 ELSE current_setting('idle_session_timeout') END,
                  false),
       set_config('application_name',
                  CASE WHEN got.slot >= 0 THEN $7 ELSE current_setting('application_name') END,
                  false)
FROM got LEFT JOIN bump ON true"""

# A wait that fences: under lock_timeout ($8 ms, set for this statement only, and back to 0
# once the key is ours: the bump must not time out holding it), wait for the key ($7) and
# bump the fencing row in the same statement, so a grant inside the wait arrives with its
# token. A wait that runs out fails with lock_not_available; nothing of it remains.
FENCED_WAIT: Final = """WITH armed AS MATERIALIZED (SELECT set_config('lock_timeout', $8, true)),
got AS MATERIALIZED (SELECT {lock}($7::bigint) FROM armed),
disarmed AS MATERIALIZED (SELECT set_config('lock_timeout', '0', true) FROM got),
{bump}
SELECT 0, bump.token, bump.sem_limit, set_config('idle_session_timeout', $5, false),
       set_config('application_name', $6, false)
FROM disarmed LEFT JOIN bump ON true"""

# The claim of a lock the session got inside a wait: the bump alone.
CLAIM: Final = """WITH {bump}
SELECT 0, bump.token, bump.sem_limit, set_config('idle_session_timeout', $5, false),
       set_config('application_name', $6, false)
FROM (SELECT 1) AS one LEFT JOIN bump ON true"""

DATABASE: Final = "(SELECT oid FROM pg_database WHERE datname = current_database())"
APPLICATION: Final = "aiodlock:"
"""A session holding a lock is named ``aiodlock:OWNER`` (``application_name``, set by the
grant statement itself, back to ``aiodlock`` by the release), so that an operator's
``inspect`` can name the owner."""
ADVISORY_KEY: Final = "((l.classid::bigint << 32) | l.objid::bigint)"
# inspect: the namespace's fencing rows (name, newest token, sem_limit, holder), and every advisory
# lock of this database (key, mode, granted, pid, application_name, the session's identity):
# JSON, in one row. (a.backend_start is NULL for another role's session without
# pg_read_all_stats: the pid alone then matches its row.)
INSPECT: Final = f"""SELECT
  (SELECT coalesce(json_agg(json_build_array(name, token, sem_limit, holder)), '[]')::text
     FROM {{table}} WHERE namespace = $1),
  (SELECT coalesce(json_agg(json_build_array({ADVISORY_KEY}, l.mode, l.granted, l.pid,
                                             a.application_name, s.identity)), '[]')::text
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
          LEFT JOIN {{sessions}} s ON {SESSION_ALIVE}
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.database = {DATABASE})"""
# namespaces: every namespace of the fencing table (sorted by the client: no collation).
NAMESPACES: Final = "SELECT coalesce(json_agg(DISTINCT namespace), '[]')::text FROM {table}"
# break: end every session holding one of the keys ($1), waiting up to $2 ms for each to be
# gone (so its locks are free when this returns); how many were ended.
TERMINATE: Final = f"""SELECT count(*) FILTER (WHERE pg_terminate_backend(holder.pid, $2))
FROM (SELECT DISTINCT l.pid FROM pg_locks l
      WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
        AND l.database = {DATABASE} AND l.pid <> pg_backend_pid()
        AND {ADVISORY_KEY} = ANY($1::bigint[])) AS holder"""
TERMINATE_WAIT_MS: Final = 5000
# break: move the fencing row on, as a grant would (a row of another name is left alone).
FENCE_MOVE: Final = """UPDATE {table} SET token = GREATEST(token + 1, {clock}),
    touched = clock_timestamp()
WHERE lock_key = $1 AND namespace = $2 AND name = $3"""
KEEP_ALIVE: Final = f"""SELECT EXISTS (
    SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
    AND pid = pg_backend_pid() AND classid = $1::oid AND objid = $2::oid
    AND database = {DATABASE}), set_config('idle_session_timeout', $3, false)"""
HELD_BY_OTHERS: Final = f"""SELECT EXISTS (
    SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
    AND pid <> pg_backend_pid() AND database = {DATABASE}
    AND ((classid::bigint << 32) | objid::bigint) = ANY($1::bigint[]))"""
# Left to right: the key, then anything stacked on the session by mistake.
RELEASE: Final = (
    "SELECT {unlock}($1), pg_advisory_unlock_all(), "
    "set_config('idle_session_timeout', '0', false), "
    "set_config('application_name', 'aiodlock', false)"
)
RELEASE_EXCLUSIVE: Final = RELEASE.format(unlock="pg_advisory_unlock")
RELEASE_SHARED: Final = RELEASE.format(unlock="pg_advisory_unlock_shared")
# A lease on a shared session: its key alone (the others on the session stay), and the
# session's idle_session_timeout for the leases that remain ($2 ms; '0' when none do).
RELEASE_ONE: Final = "SELECT {unlock}($1), set_config('idle_session_timeout', $2, false)"
RELEASE_ONE_EXCLUSIVE: Final = RELEASE_ONE.format(unlock="pg_advisory_unlock")
CLEAN: Final = (
    "SELECT pg_advisory_unlock_all(); SET idle_session_timeout = 0; SET lock_timeout = 0; "
    "SET application_name = 'aiodlock'"
)
SWEEP: Final = """WITH gone AS (DELETE FROM {table} WHERE lock_key IN (
    SELECT lock_key FROM {table} WHERE touched < clock_timestamp() - make_interval(secs => $1)
    LIMIT {batch} FOR UPDATE SKIP LOCKED) RETURNING 1)
SELECT count(*) FROM gone"""


def owner_of(pid: int, application: str | None) -> str:
    """The owner a session holds a lock for (its ``application_name``), else its pid."""
    if application and application.startswith(APPLICATION):
        return application.removeprefix(APPLICATION)
    return f"pid {pid}"
