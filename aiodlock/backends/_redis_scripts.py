"""The Lua scripts of the Redis backend, one named constant per atomic step.

Every lock step is one script, so it is atomic on the server and costs one round trip. The
keys of one lock all begin with the same hash tag ``{ns:name}``, so every script touches a
single slot and runs unchanged on Redis Cluster.

Keys of the lock ``name`` in namespace ``ns`` (``T`` = ``{ns:name}``)::

    T              STRING  owner of a mutex / the writer of a read-write lock   (PX = lease)
    T:fence        STRING  INCR counter of fencing tokens                        (no TTL)
    T:readers      ZSET    reader owner -> lease expiry, server ms               (PEXPIREAT max)
    T:sem          ZSET    permit owner -> lease expiry, server ms               (PEXPIREAT max)
    T:queue        LIST    fair mode: waiting owners, arrival order              (PEXPIRE)
    T:qdeadline    ZSET    fair mode: waiting owner -> liveness deadline, ms     (PEXPIRE)
    T:signal       pub/sub channel; in BLPOP mode a LIST of wake tokens          (PEXPIRE)
    T:rsignal      BLPOP mode only: wake tokens for waiting readers              (PEXPIRE)
    T:signal:OWNER BLPOP mode only: the wake token of one fair waiter            (PEXPIRE)

``T:fence`` is the only key that deliberately outlives its lock: if it expired, tokens would
start again at 1 and a fenced resource would refuse every new holder. It costs one small
string per lock name ever used. Every other key carries a TTL or is deleted when it empties,
so nothing is orphaned once holders and waiters are gone.

Times inside scripts come from the server (``TIME``), never from a client clock, so clients
with skewed clocks agree on when a reader, a permit or a fair waiter has expired.

Notification modes (the ``mode`` argument): ``p`` PUBLISH on ``T:signal``; ``s`` SPUBLISH
(sharded pub/sub, Redis >= 7, for Cluster); ``l`` LPUSH a token onto a signal list, trim it to
``cap`` tokens and give it a short TTL (BLPOP mode). Pub/sub payloads: ``1`` wakes one local
waiter, ``*`` wakes all of them, anything else is the owner id of the one fair waiter to wake.

Busy replies carry milliseconds: how long until it is worth trying again.
"""

from __future__ import annotations

__all__ = [
    "FAIR_ACQUIRE",
    "FAIR_RELEASE",
    "MUTEX_ACQUIRE",
    "MUTEX_RELEASE",
    "MUTEX_RENEW",
    "READ_ACQUIRE",
    "READ_RELEASE",
    "SCRIPTS",
    "SEM_ACQUIRE",
    "SEM_RELEASE",
    "SIGNAL_PUSH",
    "SIGNAL_TTL_MS",
    "WRITE_ACQUIRE",
    "WRITE_RELEASE",
    "ZSET_RENEW",
]

SIGNAL_TTL_MS = 5000
"""How long an unconsumed BLPOP wake token lives. It only has to outlast the gap between a
waiter's re-check and its BLPOP; afterwards a stale token is at worst one spurious wakeup."""

# Server time in whole milliseconds, as a Lua number (exact: it is far below 2^53).
_NOW = """
local _t = redis.call('TIME')
local now = tonumber(_t[1]) * 1000 + math.floor(tonumber(_t[2]) / 1000)
"""

_NOTIFY = f"""
local function notify(key, msg, mode, cap)
  if mode == 'p' then
    redis.call('PUBLISH', key, msg)
  elseif mode == 's' then
    redis.call('SPUBLISH', key, msg)
  else
    redis.call('LPUSH', key, msg)
    redis.call('LTRIM', key, 0, cap - 1)
    redis.call('PEXPIRE', key, {SIGNAL_TTL_MS})
  end
end
"""

# Keep a zset's TTL at its latest member expiry (or its latest fair-waiter deadline).
_EXPIRE_AT_MAX = """
local function expire_at_max(zset, other)
  local last = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', zset, last[2])
    if other then redis.call('PEXPIREAT', other, last[2]) end
  elseif other then
    redis.call('DEL', other)
  end
end
"""

# ---------------------------------------------------------------------------------- mutex

MUTEX_ACQUIRE = """
-- KEYS[1] lock, KEYS[2] fence
-- ARGV[1] owner, ARGV[2] lease ms
-- -> {1, fencing token} | {0, PTTL of the holder in ms (-1: the key has no TTL)}
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
"""

MUTEX_RELEASE = (
    _NOTIFY
    + """
-- KEYS[1] lock, KEYS[2] signal
-- ARGV[1] owner, ARGV[2] notify mode
-- -> 1 released | 0 not the owner (never held, released already, or expired)
-- Compare-and-delete, then wake one waiter per process ("1").
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  notify(KEYS[2], '1', ARGV[2], 1)
  return 1
end
return 0
"""
)

MUTEX_RENEW = """
-- KEYS[1] lock (also the writer key of a read-write lock, and the fair mutex)
-- ARGV[1] owner, ARGV[2] lease ms
-- -> 1 extended | 0 not held. Compare-and-PEXPIRE: an expired key is gone, so GET is nil
-- and nothing is recreated.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# ------------------------------------------------------------------------------ read/write

READ_ACQUIRE = (
    _NOW
    + _EXPIRE_AT_MAX
    + f"""
-- KEYS[1] lock (writer), KEYS[2] fence, KEYS[3] readers, KEYS[4] rsignal
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] '1' to pass a BLPOP wakeup on to the next reader
-- -> {{1, token}} | {{0, PTTL of the writer}}
-- Readers share; only a writer blocks them (no writer preference).
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  return {{0, pttl}}
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
expire_at_max(KEYS[3], false)
if ARGV[3] == '1' then
  -- BLPOP mode: a write release pushes one reader token; every reader it lets in passes
  -- one on, so all blocked readers wake in a chain instead of one per release.
  redis.call('LPUSH', KEYS[4], '1')
  redis.call('LTRIM', KEYS[4], 0, 0)
  redis.call('PEXPIRE', KEYS[4], {SIGNAL_TTL_MS})
end
return {{1, redis.call('INCR', KEYS[2])}}
"""
)

WRITE_ACQUIRE = (
    _NOW
    + """
-- KEYS[1] lock (writer), KEYS[2] fence, KEYS[3] readers
-- ARGV[1] owner, ARGV[2] lease ms
-- -> {1, token} | {0, PTTL of the writer} | {0, ms until the earliest reader lease ends}
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  return {0, pttl}
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, tonumber(first[2]) - now}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, redis.call('INCR', KEYS[2])}
"""
)

READ_RELEASE = (
    _NOW
    + _NOTIFY
    + """
-- KEYS[1] readers, KEYS[2] signal
-- ARGV[1] owner, ARGV[2] notify mode
-- -> 1 released | 0 not held (absent, or its lease had already ended)
-- The last reader out wakes one waiter per process: only writers wait on readers.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('EXISTS', KEYS[1]) == 0 then
  notify(KEYS[2], '1', ARGV[2], 1)
end
if tonumber(score) > now then
  return 1
end
return 0
"""
)

WRITE_RELEASE = (
    _NOTIFY
    + """
-- KEYS[1] lock (writer), KEYS[2] signal, KEYS[3] rsignal
-- ARGV[1] owner, ARGV[2] notify mode
-- -> 1 released | 0 not the owner
-- Readers and writers may both be waiting: wake them all ('*'). BLPOP mode has no
-- broadcast, so it wakes one writer and starts the reader chain (see READ_ACQUIRE).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] == 'l' then
    notify(KEYS[2], '1', 'l', 1)
    notify(KEYS[3], '1', 'l', 1)
  else
    notify(KEYS[2], '*', ARGV[2], 1)
  end
  return 1
end
return 0
"""
)

# ------------------------------------------------------------------------------ semaphore

SEM_ACQUIRE = (
    _NOW
    + _EXPIRE_AT_MAX
    + """
-- KEYS[1] sem, KEYS[2] fence
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] limit
-- -> {1, token} | {0, ms until the earliest permit lease ends}
-- Expired permits (crashed holders) are reclaimed first.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  expire_at_max(KEYS[1], false)
  return {1, redis.call('INCR', KEYS[2])}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(first[2]) - now}
"""
)

SEM_RELEASE = (
    _NOW
    + _NOTIFY
    + """
-- KEYS[1] sem, KEYS[2] signal
-- ARGV[1] owner, ARGV[2] notify mode, ARGV[3] limit (the BLPOP token cap: one per permit)
-- -> 1 released | 0 not held (absent, or its lease had already ended)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
notify(KEYS[2], '1', ARGV[2], tonumber(ARGV[3]))
if tonumber(score) > now then
  return 1
end
return 0
"""
)

ZSET_RENEW = (
    _NOW
    + _EXPIRE_AT_MAX
    + """
-- KEYS[1] readers or sem
-- ARGV[1] owner, ARGV[2] lease ms
-- -> 1 extended | 0 not held. A member whose lease ended is removed, never extended, even
-- if no acquire has purged it yet: renewal must not resurrect.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
if tonumber(score) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
expire_at_max(KEYS[1], false)
return 1
"""
)

# ------------------------------------------------------------------------------ fair mutex

# Fair-queue helpers. A waiter's liveness deadline is refreshed by each of its attempts (its
# heartbeat); a waiter that stops trying (crashed, partitioned) is purged once it passes, so
# it cannot hold up the queue for longer than one lease.
_FAIR = (
    _NOTIFY
    + _EXPIRE_AT_MAX
    + """
local function notify_owner(signal, owner, mode)
  if mode == 'l' then
    notify(signal .. ':' .. owner, '1', 'l', 1)
  else
    notify(signal, owner, mode, 1)
  end
end

-- Drop waiters whose deadline passed; returns how many were dropped.
local function purge(queue, qd, now)
  local dead = redis.call('ZRANGEBYSCORE', qd, '-inf', now)
  for i = 1, #dead do
    redis.call('LREM', queue, 1, dead[i])
  end
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', qd, '-inf', now)
    expire_at_max(qd, queue)
  end
  return #dead
end
"""
)

FAIR_ACQUIRE = (
    _NOW
    + _FAIR
    + """
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] queue, KEYS[4] qdeadline, KEYS[5] signal
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] notify mode
-- -> {1, token}
--  | {0, ms}: min(holder PTTL, or the head's remaining deadline if the lock is free but the
--    head has not taken it yet; lease/3) -- at most lease/3 so the heartbeat keeps our place.
-- Granted only if the lock is free and we are at the head of the queue (or it is empty).
-- A refused owner is appended once; each attempt refreshes its deadline to now + lease.
local lock, fence, queue, qd, signal = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, ttl, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local dropped = purge(queue, qd, now)
local free = redis.call('EXISTS', lock) == 0
local head = redis.call('LINDEX', queue, 0)
if free and (not head or head == owner) then
  redis.call('SET', lock, owner, 'PX', ttl)
  if head then
    redis.call('LPOP', queue)
    redis.call('ZREM', qd, owner)
    expire_at_max(qd, queue)
  end
  return {1, redis.call('INCR', fence)}
end
if free and dropped > 0 then
  -- A dead head was just purged: the new head has not been told the lock is free.
  notify_owner(signal, head, mode)
end
if not redis.call('ZSCORE', qd, owner) then
  redis.call('RPUSH', queue, owner)
  if not head then head = owner end
end
redis.call('ZADD', qd, now + ttl, owner)
expire_at_max(qd, queue)
local wait = redis.call('PTTL', lock)
if free then
  local deadline = redis.call('ZSCORE', qd, head)
  wait = deadline and (tonumber(deadline) - now) or 0
elseif wait < 0 then
  wait = ttl
end
local beat = math.floor(ttl / 3)
if wait > beat then wait = beat end
return {0, wait}
"""
)

FAIR_RELEASE = (
    _NOW
    + _FAIR
    + """
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] qdeadline, KEYS[4] signal
-- ARGV[1] owner, ARGV[2] notify mode
-- -> 1 released the lock | 0 did not hold it (a waiter leaving the queue also returns 0)
-- Doubles as "leave the queue" for a cancelled or timed-out waiter. If the lock ends up
-- free and the head changed (we released, the head left, or dead heads were purged), the
-- head -- and only the head -- is woken.
local lock, queue, qd, signal = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, mode = ARGV[1], ARGV[2]
local changed = purge(queue, qd, now) > 0
local released = 0
if redis.call('GET', lock) == owner then
  redis.call('DEL', lock)
  released = 1
  changed = true
elseif redis.call('ZREM', qd, owner) == 1 then
  if redis.call('LINDEX', queue, 0) == owner then changed = true end
  redis.call('LREM', queue, 1, owner)
  expire_at_max(qd, queue)
end
if changed and redis.call('EXISTS', lock) == 0 then
  local head = redis.call('LINDEX', queue, 0)
  if head then notify_owner(signal, head, mode) end
end
return released
"""
)

# ------------------------------------------------------------------------------ wakeups

SIGNAL_PUSH = f"""
-- KEYS[1] a BLPOP signal list
-- ARGV[1] cap
-- -> 1. Hands back a wake token that a waiter may have consumed without using it (it was
-- cancelled with the BLPOP reply in flight), so no other waiter misses the release.
redis.call('LPUSH', KEYS[1], '1')
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[1]) - 1)
redis.call('PEXPIRE', KEYS[1], {SIGNAL_TTL_MS})
return 1
"""

SCRIPTS: tuple[str, ...] = (
    MUTEX_ACQUIRE,
    MUTEX_RELEASE,
    MUTEX_RENEW,
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
)
"""Every script, loaded with SCRIPT LOAD when the backend opens."""
