"""The Lua scripts of the Redis backend, one named :class:`Script` per atomic step, and how
they are run (:func:`run`: EVALSHA, falling back to a reload on NOSCRIPT).

Every lock step is one script on the keys of one lock name (:mod:`._keys`): atomic, one round
trip, on one slot. Times come from the server's ``TIME``. Each script's ``KEYS`` and ``ARGV``
are documented with it; the notification modes (``p``, ``s``, ``l``) and the one-client-at-a-
time wakeups are explained in docs/redis.md ("The scripts").

Example::

    done = await run(client, MUTEX_RELEASE, keys.mutex_release, owner, "p")
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError

try:  # redis-py's own packer is pure Python, five times slower
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - the redis extra installs hiredis
    _hiredis_pack = None  # type: ignore[assignment]

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = [
    "ALL",
    "BREAK",
    "COURTESY_MS",
    "FAIR_ACQUIRE",
    "FAIR_RELEASE",
    "FENCE_RAISE",
    "INSPECT",
    "MUTEX_ACQUIRE",
    "MUTEX_HANDOFF",
    "MUTEX_RELEASE",
    "MUTEX_RENEW",
    "NOTE_POST",
    "NOTE_READ",
    "READ_ACQUIRE",
    "READ_RELEASE",
    "SEM_ACQUIRE",
    "SEM_RELEASE",
    "SIGNAL_PUSH",
    "SIGNAL_TTL_MS",
    "WAITERS_TTL_MS",
    "WAIT_ARM",
    "WAIT_LEAVE",
    "WAIT_SLICE_MS",
    "WAKE_NEXT",
    "WRITE_ACQUIRE",
    "WRITE_RELEASE",
    "ZSET_RENEW",
    "Script",
    "load_all",
    "run",
]


class Script:
    """A Lua script and its SHA1, computed once (EVALSHA sends the SHA, not the text)."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


async def run(client: aioredis.Redis, script: Script, keys: tuple[bytes, ...], *args: Any) -> Any:
    """``EVALSHA script keys args`` on ``client``: one round trip while the server has it.

    On a client with a connection of its own (a command slot's, see :mod:`._node`) the
    command goes straight to that connection: redis-py's ``execute_command`` layers (retry
    wrapper, telemetry hooks, response callbacks; none of which EVALSHA uses here) cost as
    much client time as the round trip itself.
    """
    try:
        return await _evalsha(client, script, keys, args)
    except NoScriptError:
        # The server lost its script cache (restart, failover, SCRIPT FLUSH): nothing ran, so
        # running it again is safe.
        await client.script_load(script.text)
        return await _evalsha(client, script, keys, args)


async def _evalsha(
    client: aioredis.Redis, script: Script, keys: tuple[bytes, ...], args: tuple[Any, ...]
) -> Any:
    conn = getattr(client, "connection", None)  # RedisCluster has none
    if conn is None:  # a pooled client, or a slot's first command (which connects it)
        return await client.execute_command(  # type: ignore[no-untyped-call]
            "EVALSHA", script.sha, len(keys), *keys, *args
        )
    # Either call disconnects on any failure, cancellation included, so the connection is
    # never left with a reply unread; the next command connects it again.
    command = ("EVALSHA", script.sha, len(keys), *keys, *args)
    packed = conn.pack_command(*command) if _hiredis_pack is None else _hiredis_pack(command)
    await conn.send_packed_command(packed, check_health=False)
    return await conn.read_response()


class NotReplicatedError(RedisError):
    """A grant that fewer replicas than asked for acknowledged in time (``wait_replicas``)."""


async def run_replicated(
    client: aioredis.Redis,
    script: Script,
    keys: tuple[bytes, ...],
    *args: Any,
    replicas: int,
    timeout_ms: int,
) -> Any:
    """:func:`run`, followed on the same connection by ``WAIT replicas timeout_ms`` (WAIT
    counts the writes of its own connection: a pipeline keeps both on one). A grant that fewer
    than ``replicas`` replicas acknowledged raises :class:`NotReplicatedError`."""
    for first in (True, False):
        async with client.pipeline(transaction=False) as pipe:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", replicas, timeout_ms)
            reply, acked = await pipe.execute(raise_on_error=False)
        if first and isinstance(reply, NoScriptError):
            await client.script_load(script.text)  # nothing ran: safe to run again
            continue
        for answer in (reply, acked):
            if isinstance(answer, Exception):
                raise answer
        if reply[0] == 1 and int(acked) < replicas:
            raise NotReplicatedError(
                f"the grant reached {acked} of the {replicas} replica(s) asked for "
                f"(wait_replicas) within {timeout_ms} ms; it was given back"
            )
        return reply
    raise AssertionError("unreachable")


async def load_all(client: aioredis.Redis) -> None:
    """Load every script in one pipelined round trip, so the first EVALSHAs find them.

    On Redis Cluster (a ``RedisCluster`` behind the name) one at a time: each ``SCRIPT LOAD``
    goes to every master, which a cluster pipeline (routed by key) cannot send.
    """
    cluster: object = client  # typed as a Redis: the sources hand every client in as one
    if isinstance(cluster, RedisCluster):
        for script in ALL:
            await cluster.script_load(script.text)
        return
    async with client.pipeline(transaction=False) as pipe:
        for script in ALL:
            pipe.script_load(script.text)
        await pipe.execute()


SIGNAL_TTL_MS = 5000
"""How long an unconsumed BLPOP wake token lives. It only has to outlast the gap between a
waiter's re-check and its BLPOP; afterwards a stale token is at worst one spurious wakeup."""

WAIT_SLICE_MS = 10_000
"""A BLPOP waiter refreshes its registration at least this often (a long wait is cut into BLPOP
slices)."""

WAITERS_TTL_MS = 3 * WAIT_SLICE_MS
"""TTL of a waiter registry: a crashed waiter keeps it alive at most this long after the last
live waiter refreshed it."""

# Server time in whole milliseconds, as a Lua number (exact: it is far below 2^53).
_NOW = """
local _t = redis.call('TIME')
local now = tonumber(_t[1]) * 1000 + math.floor(tonumber(_t[2]) / 1000)
"""

# notify(channel or list, payload, mode, cap, registry): registry is the list's waiter ZSET
# (false: push unconditionally, for a fair waiter's own list). Returns how many waiting
# clients it reached: pub/sub, the subscribers; BLPOP, the registered waiters. Mode 'q'
# (quiet) tells nobody: a Redlock release on a master other than the name's arbiter, whose
# release wakes the next waiting client (see _redlock_release).
_NOTIFY = f"""
local function notify(key, msg, mode, cap, registry)
  if mode == 'q' then
    return 0
  elseif mode == 'p' then
    return redis.call('PUBLISH', key, msg)
  elseif mode == 's' then
    return redis.call('SPUBLISH', key, msg)
  end
  local waiting = 1
  if registry then waiting = redis.call('ZCARD', registry) end
  if waiting > 0 then
    redis.call('LPUSH', key, msg)
    redis.call('LTRIM', key, 0, cap - 1)
    redis.call('PEXPIRE', key, {SIGNAL_TTL_MS})
  end
  return waiting
end
"""

# Keep a zset's TTL at its latest member expiry (or its latest fair-waiter deadline), and the
# TTL of the keys that live as long as it (``...``; false: none); delete those once it is gone.
_EXPIRE_AT_MAX = """
local function expire_at_max(zset, ...)
  local last = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', zset, last[2])
  end
  for _, other in ipairs({...}) do
    if other and last[2] then
      redis.call('PEXPIREAT', other, last[2])
    elseif other then
      redis.call('DEL', other)
    end
  end
end
"""

# next_token(fence, ttl_ms): the next fencing token of a lock name; every acquire script passes
# the fence's ttl as its last ARGV. The token is the counter plus one, but never less than the
# server clock in microseconds. So a counter that is missing (first use, expired after ttl_ms
# without a grant, lost with a restart) or behind (a failover to a replica that had not
# received the last increments) still yields a token above every token handed out before, as
# long as the clock did not step back by more than the time the loss took: a failover or a
# restart takes far longer than the microseconds a counter can run ahead of the clock (one
# per grant). ttl_ms '0': the counter never expires. Exact in Lua's doubles (about 1.8e15,
# far below 2^53). ttl_ms 'MS:FLOOR' (Redlock, a master asked after the arbiter granted): the
# arbiter's token FLOOR, a reading of its clock, stands for this server's clock, so that the
# masters of a quorum agree on one token and no write phase is needed to spread it.
_NEXT_TOKEN = """
local function next_token(fence, ttl_ms)
  local clock
  local sep = string.find(ttl_ms, ':', 1, true)
  if sep then
    clock = tonumber(string.sub(ttl_ms, sep + 1))
    ttl_ms = string.sub(ttl_ms, 1, sep - 1)
  else
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local token = math.max((tonumber(redis.call('GET', fence)) or 0) + 1, clock)
  if ttl_ms == '0' then
    redis.call('SET', fence, string.format('%.0f', token))
  else
    redis.call('SET', fence, string.format('%.0f', token), 'PX', ttl_ms)
  end
  return token
end
"""

# BLPOP mode only (the backend then passes the extra KEYS): a waiter that is granted leaves
# the waiter registry in the same step, so once it holds the lock nothing is left to do --
# nothing that a cancellation could interrupt and turn into a lost grant.
_LEAVE_ON_GRANT = """
local function leave_on_grant(owner, registry, lists)
  redis.call('ZREM', registry, owner)
  if redis.call('EXISTS', registry) == 0 then
    for _, key in ipairs(lists) do
      redis.call('DEL', key)
    end
  end
end
"""

# wake_client(clients, signal, mode, skip, stop, keep): pop the longest-registered client of
# a mutex's registry and publish "1" on its own channel (signal .. ':' .. client), until one
# is reached: a channel without subscribers (the client crashed, or stopped waiting long ago)
# counts 0, and its entry is gone with the pop. Returns the client woken, or false. ``skip``:
# a client that is passing a wakeup on must not be handed it back; ``stop``: a client whose
# turn ends the search, left in place (false: none); ``keep``: the client woken keeps its
# place (it may not get the lock this time: see MUTEX_RELEASE).
_WAKE_CLIENT = (
    _NOTIFY
    + """
local function wake_client(clients, signal, mode, skip, stop, keep)
  while true do
    local client = redis.call('ZRANGE', clients, 0, 0)[1]
    if not client or client == stop then return false end
    if client ~= skip and notify(signal .. ':' .. client, '1', mode, 1, false) > 0 then
      if not keep then redis.call('ZREM', clients, client) end
      return client
    end
    redis.call('ZREM', clients, client)
  end
end
"""
)

# register(clients, client, lock): put a refused client at the end of the mutex's registry
# (NX: a client already there keeps its place). The registry outlives the holder's lease by
# WAITERS_TTL_MS: a waiter re-checks at the latest when that lease would run out, and so
# registers again, long before.
_REGISTER = f"""
local function register(clients, client, lock)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', clients, 'NX', now, client)
  local left = redis.call('PTTL', lock)
  if left < 0 then left = 0 end
  redis.call('PEXPIRE', clients, math.max(left + {WAITERS_TTL_MS}, redis.call('PTTL', clients)))
end
"""

# The identity of each holder (its client's ``identity`` option, shown by INSPECT) lives in a
# hash beside the key it holds, ``KEY:ids`` (owner -> identity), in the same slot: written by
# the script that grants, dropped by the one that releases, breaks or purges the holder, and
# expiring with the key, so it never outlives its holder. A separate hash leaves the lock keys,
# their values and every comparison on them as they were (older clients share them). Every
# acquire script takes the identity as its last ARGV, the fence ttl ms just before it.
_IDS = """
-- name_holder(key, owner, identity, ms): the identity of the one holder of ``key`` (mutex,
-- writer), expiring with it
local function name_holder(key, owner, identity, ms)
  local ids = key .. ':ids'
  redis.call('HSET', ids, owner, identity)
  redis.call('PEXPIRE', ids, ms)
end

-- purge_members(zset, now): drop the members whose lease ended (crashed holders), and their
-- identities
local function purge_members(zset, now)
  local dead = redis.call('ZRANGEBYSCORE', zset, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', zset, '-inf', now)
    local ids = zset .. ':ids'
    for i = 1, #dead do redis.call('HDEL', ids, dead[i]) end
  end
end
"""

# ---------------------------------------------------------------------------------- mutex

COURTESY_MS = 30
"""How long a client that released a mutex other clients wait for stays out of it (``T:yield``):
long enough for a woken waiter of another process to send its attempt, so the releaser, which
is awake and first to try again, does not take the lock back round after round."""

MUTEX_ACQUIRE: Final = Script(
    _NEXT_TOKEN
    + _LEAVE_ON_GRANT
    + _REGISTER
    + _IDS
    + """
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] yield; then BLPOP mode: KEYS[4] waiters, KEYS[5]
-- signal; pub/sub mode: KEYS[4] clients, KEYS[5] run
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] client id, [pub/sub mode: ARGV[4] 'r' if this
-- client's channel for the lock is subscribed, so a refusal registers it, else '-'; ARGV[5]
-- run ms], fence ttl ms, identity last
-- -> {1, fencing token} | {0, ms to wait: the holder's PTTL (-1: no TTL), or the rest of
-- this client's courtesy after its own release (see MUTEX_RELEASE)}
-- A grant while other clients wait starts this client's run, unless one is under way: for
-- run ms (T:run) its releases neither stay out for the courtesy nor take the place of the
-- client they wake, so it may take the lock straight back (see MUTEX_RELEASE).
local pubsub = ARGV[4] == 'r' or ARGV[4] == '-'
local registry = pubsub and KEYS[4]
local yielding = redis.call('GET', KEYS[3])
if yielding == ARGV[3] then
  if registry and ARGV[4] == 'r' then register(registry, ARGV[3], KEYS[1]) end
  return {0, redis.call('PTTL', KEYS[3])}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  name_holder(KEYS[1], ARGV[1], ARGV[#ARGV], ARGV[2])
  if yielding then redis.call('DEL', KEYS[3]) end
  if not pubsub and #KEYS == 5 then leave_on_grant(ARGV[1], KEYS[4], {KEYS[5]}) end
  if registry then
    -- Granted: this client goes to the back of the line (its next waiter registers anew).
    redis.call('ZREM', registry, ARGV[3])
    if ARGV[5] ~= '0' and redis.call('EXISTS', registry) == 1
        and redis.call('GET', KEYS[5]) ~= ARGV[3] then
      redis.call('SET', KEYS[5], ARGV[3], 'PX', ARGV[5])
    end
  end
  return {1, next_token(KEYS[2], ARGV[#ARGV - 1])}
end
if registry and ARGV[4] == 'r' then register(registry, ARGV[3], KEYS[1]) end
return {0, redis.call('PTTL', KEYS[1])}
"""
)

MUTEX_RELEASE: Final = Script(
    _WAKE_CLIENT
    + """
-- KEYS[1] lock, KEYS[2] signal, KEYS[3] waiters (BLPOP registry), KEYS[4] yield; pub/sub
-- mode also KEYS[5] clients, KEYS[6] run
-- ARGV[1] owner, ARGV[2] notify mode; optional ARGV[3] client id, ARGV[4] waiters of this
-- client notified too (its own subscription / registrations), ARGV[5] courtesy ms, ARGV[6]
-- 'c': tell whom it woke
-- -> 1 released | 0 not the owner (never held, released already, or expired); with ARGV[6],
-- 2 released and another client woken (this one left a courtesy), 3 this client woken
-- Compare-and-delete, then wake the longest-registered client (pub/sub mode), or else one
-- waiter per process ("1" on the lock's channel: clients that do not register). If another
-- client was woken, this one stays out for the courtesy (until the woken one takes the lock,
-- or it expires): otherwise the releaser, awake and first to try again, takes the lock back
-- before anyone else has heard of the release, and the others starve. Within this client's
-- run (T:run, see MUTEX_ACQUIRE) it does not stay out, and the client woken keeps its place:
-- it takes the lock if it asks first, else at the latest when the run is over.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[1] .. ':ids')
  local in_run = #KEYS == 6 and redis.call('GET', KEYS[6]) == ARGV[3]
  local woken = #KEYS == 6 and wake_client(KEYS[5], KEYS[2], ARGV[2], false, false, in_run)
  local others
  if woken then
    others = woken ~= ARGV[3]
  else
    others = notify(KEYS[2], '1', ARGV[2], 1, KEYS[3]) > tonumber(ARGV[4] or '0')
  end
  local courtesy = ARGV[5] and others and not in_run
  if courtesy then
    redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[5])
  end
  if ARGV[6] == 'c' then
    if woken and not others then return 3 end
    if courtesy then return 2 end
  end
  return 1
end
return 0
"""
)

MUTEX_HANDOFF: Final = Script(
    _WAKE_CLIENT
    + _NEXT_TOKEN
    + _REGISTER
    + _IDS
    + """
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] yield, KEYS[4] clients, KEYS[5] signal, KEYS[6] run
-- ARGV[1] taker (a waiter of this client), ARGV[2] owner, ARGV[3] taker's lease ms,
-- ARGV[4] client id, ARGV[5] notify mode, ARGV[6] courtesy ms, ARGV[7] fence ttl ms,
-- ARGV[8] identity (the taker's: its client is ours)
-- -> {2, fencing token} handed to the taker | {1} released: another client has waited
-- longer and was woken | {0} not the owner
-- A release that hands the lock straight to the next waiter of the same client, in the
-- same step: one round trip where a release, its wakeup and the waiter's attempt would be
-- three. Only within this client's run (T:run, see MUTEX_ACQUIRE) or while no other
-- client waits longer (registered ahead of this one): those are woken as by MUTEX_RELEASE,
-- and this client stays out for the courtesy. It is registered then (NX: a place it has is
-- kept): its waiting task may have been refused by the client itself while it held the lock,
-- with nothing sent, so a release of the client woken now must wake this one.
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return {0}
end
local in_run = redis.call('GET', KEYS[6]) == ARGV[4]
if not in_run and wake_client(KEYS[4], KEYS[5], ARGV[5], false, ARGV[4], false) then
  redis.call('DEL', KEYS[1], KEYS[1] .. ':ids')
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[6])
  register(KEYS[4], ARGV[4], KEYS[1])
  return {1}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('HDEL', KEYS[1] .. ':ids', ARGV[2])
name_holder(KEYS[1], ARGV[1], ARGV[#ARGV], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[4])
return {2, next_token(KEYS[2], ARGV[#ARGV - 1])}
"""
)

WAKE_NEXT: Final = Script(
    _WAKE_CLIENT
    + """
-- KEYS[1] lock, KEYS[2] clients, KEYS[3] signal
-- ARGV[1] client id, ARGV[2] notify mode
-- -> 1 if another client was woken. Passes on a wakeup that reached a client with nobody
-- left to use it (its waiter timed out or was cancelled as the release came): unless the
-- lock is held again (its holder's release wakes the next), the next registered client is
-- woken instead.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if wake_client(KEYS[2], KEYS[3], ARGV[2], ARGV[1], false, false) then
  return 1
end
return 0
"""
)

MUTEX_RENEW: Final = Script(
    """
-- KEYS[1] lock (also the writer key of a read-write lock, and the fair mutex)
-- ARGV[1] owner, ARGV[2] lease ms
-- -> 1 extended | 0 not held. Compare-and-PEXPIRE: an expired key is gone, so GET is nil
-- and nothing is recreated. The holder's identity (KEY:ids) keeps the key's expiry.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1] .. ':ids', ARGV[2])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
)

NOTE_POST: Final = Script(
    """
-- KEYS[1] mutex, KEYS[2] its note
-- ARGV[1] owner, ARGV[2] note, ARGV[3] ms the note lives unless posted again
-- -> 1 posted | 0 not held (nothing written). The note carries its poster's owner, so
-- NOTE_READ never shows it once another holder has the lock.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1] .. '\\n' .. ARGV[2], 'PX', ARGV[3])
return 1
"""
)

NOTE_READ: Final = Script(
    """
-- KEYS[1] mutex, KEYS[2] its note
-- -> the current holder's note | false (free, or its holder posted none)
local holder = redis.call('GET', KEYS[1])
if not holder then return false end
local note = redis.call('GET', KEYS[2])
if not note then return false end
local prefix = holder .. '\\n'
if string.sub(note, 1, #prefix) ~= prefix then return false end
return string.sub(note, #prefix + 1)
"""
)

# ------------------------------------------------------------------------------ read/write

READ_ACQUIRE: Final = Script(
    _NEXT_TOKEN
    + _NOW
    + _NOTIFY
    + _EXPIRE_AT_MAX
    + _LEAVE_ON_GRANT
    + _IDS
    + """
-- KEYS[1] writer, KEYS[2] fence, KEYS[3] readers, KEYS[4] rsignal, KEYS[5] waiters;
-- BLPOP mode also KEYS[6] (writers') signal
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] '1' to pass a BLPOP wakeup on to the next reader,
-- ARGV[4] fence ttl ms, ARGV[5] identity
-- -> {1, token} | {0, PTTL of the writer}
-- Readers share; only a writer blocks them (no writer preference).
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  return {0, pttl}
end
purge_members(KEYS[3], now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[3] .. ':ids', ARGV[1], ARGV[#ARGV])
expire_at_max(KEYS[3], KEYS[3] .. ':ids')
if #KEYS > 5 then leave_on_grant(ARGV[1], KEYS[5], {KEYS[6], KEYS[4]}) end
if ARGV[3] == '1' then
  -- BLPOP mode: a write release pushes one reader token; every reader it lets in passes
  -- one on, so all blocked readers wake in a chain instead of one per release.
  notify(KEYS[4], '1', 'l', 1, KEYS[5])
end
return {1, next_token(KEYS[2], ARGV[#ARGV - 1])}
"""
)

WRITE_ACQUIRE: Final = Script(
    _NEXT_TOKEN
    + _NOW
    + _LEAVE_ON_GRANT
    + _IDS
    + """
-- KEYS[1] writer, KEYS[2] fence, KEYS[3] readers;
-- BLPOP mode also KEYS[4] waiters, KEYS[5] signal, KEYS[6] rsignal
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] fence ttl ms, ARGV[4] identity
-- -> {1, token} | {0, PTTL of the writer} | {0, ms until the earliest reader lease ends}
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  return {0, pttl}
end
purge_members(KEYS[3], now)
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, tonumber(first[2]) - now}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
name_holder(KEYS[1], ARGV[1], ARGV[#ARGV], ARGV[2])
if #KEYS > 3 then leave_on_grant(ARGV[1], KEYS[4], {KEYS[5], KEYS[6]}) end
return {1, next_token(KEYS[2], ARGV[#ARGV - 1])}
"""
)

READ_RELEASE: Final = Script(
    _NOW
    + _NOTIFY
    + _IDS
    + """
-- KEYS[1] readers, KEYS[2] signal, KEYS[3] waiters
-- ARGV[1] owner, ARGV[2] notify mode
-- -> 1 released | 0 not held (absent, or its lease had already ended)
-- The last reader out wakes one waiter per process: only writers wait on readers.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
purge_members(KEYS[1], now)
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1] .. ':ids')
  notify(KEYS[2], '1', ARGV[2], 1, KEYS[3])
else
  redis.call('HDEL', KEYS[1] .. ':ids', ARGV[1])
end
if tonumber(score) > now then
  return 1
end
return 0
"""
)

WRITE_RELEASE: Final = Script(
    _NOTIFY
    + """
-- KEYS[1] writer, KEYS[2] signal, KEYS[3] rsignal, KEYS[4] waiters
-- ARGV[1] owner, ARGV[2] notify mode
-- -> 1 released | 0 not the owner
-- Readers and writers may both be waiting: wake them all ('*'). BLPOP mode has no
-- broadcast, so it wakes one writer and starts the reader chain (see READ_ACQUIRE).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[1] .. ':ids')
  if ARGV[2] == 'l' then
    notify(KEYS[2], '1', 'l', 1, KEYS[4])
    notify(KEYS[3], '1', 'l', 1, KEYS[4])
  else
    notify(KEYS[2], '*', ARGV[2], 1, false)
  end
  return 1
end
return 0
"""
)

# ------------------------------------------------------------------------------ semaphore

SEM_ACQUIRE: Final = Script(
    _NEXT_TOKEN
    + _NOW
    + _EXPIRE_AT_MAX
    + _LEAVE_ON_GRANT
    + _IDS
    + """
-- KEYS[1] sem, KEYS[2] fence, KEYS[3] sem limit; BLPOP mode also KEYS[4] waiters, KEYS[5] signal
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] limit, ARGV[4] fence ttl ms, ARGV[5] identity
-- -> {1, token} | {0, ms until the earliest permit lease ends}
--  | {-1, the limit the holders use}: ARGV[3] differs, and granting it would over-grant.
-- Expired permits (crashed holders) are reclaimed first, so once every permit is gone any
-- limit is accepted. The limit key lives exactly as long as the permits (expire_at_max).
purge_members(KEYS[1], now)
local count = redis.call('ZCARD', KEYS[1])
if count > 0 then
  local in_use = redis.call('GET', KEYS[3])
  if in_use and in_use ~= ARGV[3] then
    return {-1, tonumber(in_use)}
  end
end
if count < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('SET', KEYS[3], ARGV[3])
  redis.call('HSET', KEYS[1] .. ':ids', ARGV[1], ARGV[#ARGV])
  expire_at_max(KEYS[1], KEYS[3], KEYS[1] .. ':ids')
  if #KEYS > 3 then leave_on_grant(ARGV[1], KEYS[4], {KEYS[5]}) end
  return {1, next_token(KEYS[2], ARGV[#ARGV - 1])}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(first[2]) - now}
"""
)

SEM_RELEASE: Final = Script(
    _NOW
    + _NOTIFY
    + _EXPIRE_AT_MAX
    + """
-- KEYS[1] sem, KEYS[2] signal, KEYS[3] waiters, KEYS[4] sem limit
-- ARGV[1] owner, ARGV[2] notify mode, ARGV[3] limit (the BLPOP token cap: one per permit)
-- -> 1 released | 0 not held (absent, or its lease had already ended)
-- The ZSET and its limit key then expire with the latest remaining permit; the last
-- permit out deletes the limit key, so the next holder may bring another limit.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1] .. ':ids', ARGV[1])
expire_at_max(KEYS[1], KEYS[4], KEYS[1] .. ':ids')
notify(KEYS[2], '1', ARGV[2], tonumber(ARGV[3]), KEYS[3])
if tonumber(score) > now then
  return 1
end
return 0
"""
)

ZSET_RENEW: Final = Script(
    _NOW
    + _EXPIRE_AT_MAX
    + """
-- KEYS[1] readers or sem; for sem also KEYS[2] its limit key, which expires with it
-- ARGV[1] owner, ARGV[2] lease ms
-- -> 1 extended | 0 not held. A member whose lease ended is removed, never extended, even
-- if no acquire has purged it yet: renewal must not resurrect.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
if tonumber(score) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[1] .. ':ids', ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
-- the members' identities (KEY:ids) live as long as they do
expire_at_max(KEYS[1], KEYS[1] .. ':ids', KEYS[2] or false)
return 1
"""
)

# ------------------------------------------------------------------------------ fair mutex

# Fair-queue helpers. A waiter's liveness deadline is refreshed by each of its attempts (its
# heartbeat); a waiter that stops trying (crashed, partitioned) is purged once it passes, so
# it cannot hold up the queue for longer than one lease. A queued waiter's identity waits in
# ``queue:ids`` (kept like qclients) so that a release handing it the lock can name it.
_FAIR = (
    _NOTIFY
    + _EXPIRE_AT_MAX
    + _IDS
    + """
-- Wake one fair waiter: ``payload`` (default: its owner id) on the channel of its client (its
-- client id is in ``qclients``: only that process hears it, not every one with a waiter), or
-- on the lock's channel for a waiter whose client is not recorded. A fair waiter's BLPOP list
-- is its own: the queue is its registry.
local function notify_owner(signal, owner, mode, qclients, payload)
  if mode == 'l' then
    notify(signal .. ':' .. owner, '1', 'l', 1, false)
    return
  end
  local client = qclients and redis.call('HGET', qclients, owner)
  if client then signal = signal .. ':' .. client end
  notify(signal, payload or owner, mode, 1, false)
end

-- Drop waiters whose deadline passed (and, in BLPOP mode, their token lists); returns how
-- many were dropped.
local function purge(queue, qd, now, signal, mode, qclients)
  local dead = redis.call('ZRANGEBYSCORE', qd, '-inf', now)
  for i = 1, #dead do
    redis.call('LREM', queue, 1, dead[i])
    redis.call('HDEL', qclients, dead[i])
    redis.call('HDEL', queue .. ':ids', dead[i])
    if mode == 'l' then redis.call('DEL', signal .. ':' .. dead[i]) end
  end
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', qd, '-inf', now)
    expire_at_max(qd, queue, qclients, queue .. ':ids')
  end
  return #dead
end
"""
)

FAIR_ACQUIRE: Final = Script(
    _NEXT_TOKEN
    + _NOW
    + _FAIR
    + """
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] queue, KEYS[4] qdeadline, KEYS[5] signal, KEYS[6]
-- qclients
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] notify mode, ARGV[4] client id, ARGV[5] fence ttl
-- ms, ARGV[6] identity
-- -> {1, token}
--  | {0, ms}: min(holder PTTL, the head's remaining deadline, lease/3) -- at most lease/3 so
--    this heartbeat keeps our place; at most the head's deadline so a dead head is purged
--    (and its successor let in) as soon as it may be.
-- Granted only if the lock is free and we are at the head of the queue (or it is empty).
-- A refused owner is appended once; each attempt refreshes its deadline to now + lease.
local lock, fence, queue, qd, signal, qclients = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
  KEYS[6]
local owner, ttl, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('GET', lock) == owner then
  -- A release handed us the lock (FAIR_RELEASE) and we did not hear it: confirm, and time
  -- the lease from this request, as the client will.
  redis.call('PEXPIRE', lock, ttl)
  name_holder(lock, owner, ARGV[#ARGV], ttl)
  return {1, tonumber(redis.call('GET', fence)) or next_token(fence, ARGV[#ARGV - 1])}
end
local dropped = purge(queue, qd, now, signal, mode, qclients)
local free = redis.call('EXISTS', lock) == 0
local head = redis.call('LINDEX', queue, 0)
if free and (not head or head == owner) then
  redis.call('SET', lock, owner, 'PX', ttl)
  name_holder(lock, owner, ARGV[#ARGV], ttl)
  if head then
    redis.call('LPOP', queue)
    redis.call('ZREM', qd, owner)
    redis.call('HDEL', qclients, owner)
    redis.call('HDEL', queue .. ':ids', owner)
    expire_at_max(qd, queue, qclients, queue .. ':ids')
    if mode == 'l' then redis.call('DEL', signal .. ':' .. owner) end
  end
  return {1, next_token(fence, ARGV[#ARGV - 1])}
end
if free and dropped > 0 then
  -- A dead head was just purged: the new head has not been told the lock is free.
  notify_owner(signal, head, mode, qclients)
end
if not redis.call('ZSCORE', qd, owner) then
  redis.call('RPUSH', queue, owner)
  if mode ~= 'l' then redis.call('HSET', qclients, owner, ARGV[4]) end
  redis.call('HSET', queue .. ':ids', owner, ARGV[#ARGV])
  if not head then head = owner end
end
redis.call('ZADD', qd, now + ttl, owner)
expire_at_max(qd, queue, qclients, queue .. ':ids')
local wait = redis.call('PTTL', lock)
if free or wait < 0 then
  wait = ttl
end
if head ~= owner then
  -- Try again when the head's deadline passes: if it died, that attempt purges it and
  -- moves us up, instead of leaving the queue stuck until our next heartbeat.
  local deadline = redis.call('ZSCORE', qd, head)
  if deadline and tonumber(deadline) - now < wait then
    wait = tonumber(deadline) - now
  end
end
local beat = math.floor(ttl / 3)
if wait > beat then wait = beat end
return {0, wait}
"""
)

FAIR_RELEASE: Final = Script(
    _NEXT_TOKEN
    + _NOW
    + _FAIR
    + """
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] qdeadline, KEYS[4] signal, KEYS[5] fence, KEYS[6]
-- qclients
-- ARGV[1] owner, ARGV[2] notify mode, ARGV[3] 'h': hand the lock over, ARGV[4] fence ttl ms
-- -> 1 released the lock | 0 did not hold it (a waiter leaving the queue also returns 0)
-- Doubles as "leave the queue" for a cancelled or timed-out waiter. If the lock ends up
-- free and the head changed (we released, the head left, or dead heads were purged), the
-- head -- and only the head -- is woken.
-- With 'h' (pub/sub mode), a release hands the lock straight to the head: the key names it,
-- the fencing counter moves on, and the wakeup (on the head's client's channel) says
-- "HEAD TOKEN", so the head needs no attempt of its own. Its lease ends at its liveness
-- deadline (its last attempt + its ttl), which is no earlier than its client reckons (from
-- that attempt's request); a head that died holds the lock no longer than it would have held
-- its place.
local lock, queue, qd, signal, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local qclients = KEYS[6]
local owner, mode = ARGV[1], ARGV[2]
local changed = purge(queue, qd, now, signal, mode, qclients) > 0
local released = 0
if redis.call('GET', lock) == owner then
  redis.call('DEL', lock, lock .. ':ids')
  released = 1
  changed = true
elseif redis.call('ZREM', qd, owner) == 1 then
  if redis.call('LINDEX', queue, 0) == owner then changed = true end
  redis.call('LREM', queue, 1, owner)
  redis.call('HDEL', qclients, owner)
  redis.call('HDEL', queue .. ':ids', owner)
  expire_at_max(qd, queue, qclients, queue .. ':ids')
  if mode == 'l' then redis.call('DEL', signal .. ':' .. owner) end
end
if changed and redis.call('EXISTS', lock) == 0 then
  local head = redis.call('LINDEX', queue, 0)
  -- purge() left only heads whose deadline is still ahead
  local deadline = head and released == 1 and ARGV[3] == 'h' and redis.call('ZSCORE', qd, head)
  if deadline then
    local ms = math.max(math.floor(tonumber(deadline) - now), 1)
    redis.call('SET', lock, head, 'PX', ms)
    local identity = redis.call('HGET', queue .. ':ids', head)
    if identity then name_holder(lock, head, identity, ms) end
    redis.call('HDEL', queue .. ':ids', head)
    redis.call('LPOP', queue)
    redis.call('ZREM', qd, head)
    local token = next_token(fence, ARGV[4])
    notify_owner(signal, head, mode, qclients, head .. ' ' .. string.format('%.0f', token))
    redis.call('HDEL', qclients, head)
    expire_at_max(qd, queue, qclients, queue .. ':ids')
  elseif head then
    notify_owner(signal, head, mode, qclients)
  end
end
return released
"""
)

# ------------------------------------------------------------------------------ wakeups

SIGNAL_PUSH: Final = Script(
    _NOTIFY
    + """
-- KEYS[1] a BLPOP signal list, KEYS[2] its waiters
-- ARGV[1] cap
-- -> 1. Hands back a wake token that a waiter took without using it (it was cancelled with
-- the BLPOP reply in flight, or left with the token banked), so no other waiter misses the
-- release.
notify(KEYS[1], '1', 'l', tonumber(ARGV[1]), KEYS[2])
return 1
"""
)

WAIT_ARM: Final = Script(
    """
-- KEYS[1] waiters
-- ARGV[1] owner, ARGV[2] registry TTL ms
-- -> 1. Registers a BLPOP waiter *before* its re-check, so a release after that re-check
-- pushes a token (BLPOP mode's equivalent of a confirmed SUBSCRIBE). Members carry no
-- deadline: the registry's TTL, refreshed by every live waiter, bounds a crashed one.
redis.call('ZADD', KEYS[1], 0, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

WAIT_LEAVE: Final = Script(
    """
-- KEYS[1] waiters, KEYS[2..] the signal lists it guards
-- ARGV[1] owner
-- -> 1 if that was the last waiter (and the lists, whose tokens nobody needs, are deleted)
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  for i = 2, #KEYS do
    redis.call('DEL', KEYS[i])
  end
  return 1
end
return 0
"""
)


# ------------------------------------------------------------------------------ operators

INSPECT: Final = Script(
    _NOW
    + """
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] queue, KEYS[4] waiters, KEYS[5] writer, KEYS[6] readers,
-- KEYS[7] rw waiters, KEYS[8] sem, KEYS[9] sem waiters
-- -> {now ms, fence, mutex owner, its PTTL, queue length + mutex waiters, writer, its PTTL,
--     {reader, expiry ms, ...}, rw waiters, {permit owner, expiry ms, ...}, sem waiters,
--     mutex owner's identity, writer's identity, {reader's identity, ...},
--     {permit owner's identity, ...}}
-- Read-only: one consistent snapshot of every family of one name (false: absent; an
-- identity is absent for a holder granted by an older client).
local function live(zset)
  return redis.call('ZRANGEBYSCORE', zset, '(' .. now, '+inf', 'WITHSCORES')
end
local function identity(key, owner)
  return owner and redis.call('HGET', key .. ':ids', owner)
end
local function identities(zset, flat)
  local found = {}
  for i = 1, #flat, 2 do found[#found + 1] = identity(zset, flat[i]) end
  return found
end
local owner, writer = redis.call('GET', KEYS[1]), redis.call('GET', KEYS[5])
local readers, permits = live(KEYS[6]), live(KEYS[8])
return {
  now,
  redis.call('GET', KEYS[2]),
  owner,
  redis.call('PTTL', KEYS[1]),
  redis.call('LLEN', KEYS[3]) + redis.call('ZCARD', KEYS[4]),
  writer,
  redis.call('PTTL', KEYS[5]),
  readers,
  redis.call('ZCARD', KEYS[7]),
  permits,
  redis.call('ZCARD', KEYS[9]),
  identity(KEYS[1], owner),
  identity(KEYS[5], writer),
  identities(KEYS[6], readers),
  identities(KEYS[8], permits),
}
"""
)

BREAK: Final = Script(
    _NEXT_TOKEN
    + _NOW
    + _FAIR
    + """
-- KEYS[1] family ('m' mutex, 'rw' read-write, 's' semaphore) is in ARGV[1], and the keys are:
--   m:  lock, fence, note, signal, waiters, queue, clients, qclients
--   rw: writer, fence, readers, signal, rsignal, waiters
--   s:  sem, fence, sem limit, signal, waiters
-- ARGV[1] family, ARGV[2] notify mode, ARGV[3] the namespace's broken channel ('': none),
-- ARGV[4] fence ttl ms
-- -> {holders dropped, the fencing token it moved to (0: nothing was held)}
-- Force-release: every holder's key or member goes, so its next renewal is refused; the
-- owners dropped are published on the broken channel (plain PUBLISH, heard cluster-wide),
-- where their clients listen, so their bodies are cancelled at once rather than at that
-- renewal. The fencing counter moves on, so a fenced resource refuses the broken holder's
-- writes even before the next grant; waiters are woken as by a release.
local family, mode = ARGV[1], ARGV[2]
local dropped = 0
local owners = {}
local function live_members(zset)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', zset, '(' .. now, '+inf')) do
    owners[#owners + 1] = member
  end
end
if family == 'm' then
  local owner = redis.call('GET', KEYS[1])
  if owner then owners[1] = owner end
  if redis.call('DEL', KEYS[1]) == 1 then dropped = 1 end
  redis.call('DEL', KEYS[3], KEYS[1] .. ':ids')
  if dropped > 0 then
    local head = redis.call('LINDEX', KEYS[6], 0)
    if head then notify_owner(KEYS[4], head, mode, KEYS[8]) end
    notify(KEYS[4], '*', mode, 1, KEYS[5])
  end
  if KEYS[7] then
    -- Every registered client re-checks (its waiters were refused by the broken holder).
    for _, client in ipairs(redis.call('ZRANGE', KEYS[7], 0, -1)) do
      notify(KEYS[4] .. ':' .. client, '*', mode, 1, false)
    end
    redis.call('DEL', KEYS[7])
  end
elseif family == 'rw' then
  local writer = redis.call('GET', KEYS[1])
  if writer then owners[1] = writer end
  live_members(KEYS[3])
  dropped = redis.call('DEL', KEYS[1]) + redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
  redis.call('DEL', KEYS[3], KEYS[1] .. ':ids', KEYS[3] .. ':ids')
  if dropped > 0 then
    notify(KEYS[4], '*', mode, 1, KEYS[6])
    if mode == 'l' then notify(KEYS[5], '1', 'l', 1, KEYS[6]) end
  end
else
  live_members(KEYS[1])
  dropped = #owners
  local limit = tonumber(redis.call('GET', KEYS[3]) or '1')
  redis.call('DEL', KEYS[1], KEYS[3], KEYS[1] .. ':ids')
  if dropped > 0 then notify(KEYS[4], '*', mode, limit, KEYS[5]) end
end
if dropped == 0 then
  return {0, 0}
end
if ARGV[3] ~= '' and #owners > 0 then
  redis.call('PUBLISH', ARGV[3], table.concat(owners, ' '))
end
return {dropped, next_token(KEYS[2], ARGV[#ARGV])}
"""
)


ALL: Final = (
    MUTEX_ACQUIRE,
    MUTEX_RELEASE,
    MUTEX_HANDOFF,
    MUTEX_RENEW,
    NOTE_POST,
    NOTE_READ,
    READ_ACQUIRE,
    WRITE_ACQUIRE,
    READ_RELEASE,
    WRITE_RELEASE,
    SEM_ACQUIRE,
    SEM_RELEASE,
    ZSET_RENEW,
    FAIR_ACQUIRE,
    FAIR_RELEASE,
    SIGNAL_PUSH,
    WAKE_NEXT,
    WAIT_ARM,
    WAIT_LEAVE,
    INSPECT,
    BREAK,
)
"""Every script, in the order :func:`load_all` loads them."""

# ------------------------------------------------------------------------------ redlock
# Used by the Redlock backend (:mod:`._redlock`) only, and loaded by it: not in ALL.

FENCE_RAISE: Final = Script(
    """
-- KEYS[1] fence
-- ARGV[1] token, ARGV[2] fence ttl ms ('0': forever)
-- -> 1. "Set if greater": the write phase of the Redlock fencing token (quorum max + 1). A
-- counter already at or above the token is left alone, so a slow write can never move a
-- counter back.
local token = tonumber(ARGV[1])
if token > (tonumber(redis.call('GET', KEYS[1])) or 0) then
  if ARGV[2] == '0' then
    redis.call('SET', KEYS[1], ARGV[1])
  else
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  end
end
return 1
"""
)
