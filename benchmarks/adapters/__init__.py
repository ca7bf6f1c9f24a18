"""The catalogue: every library the benchmark measures, and how to build its adapter.

Adapter modules are imported only by the child process that measures them, so a library that
does not install or import costs its own rows (reported as unavailable), nothing else.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..config import FULL
from .base import AsyncAdapter, Endpoint, SyncAdapter

__all__ = ["LIBRARIES", "Library", "by_key"]

Role = Literal["floor", "aiodlock", "incumbent", "reference"]
ALL_SCENARIOS = ("uncontended", "contended", "contended_procs", "waiters", "handoff", "storm")


@dataclass(frozen=True, slots=True)
class Library:
    """One row of the results: a library (or the raw floor) on one backend."""

    key: str
    label: str
    backend: str  # a deployment: "redis", "redis-cluster", "zookeeper-ensemble", ..., "none"
    role: Role
    module: str
    cls: str
    asynchronous: bool
    scenarios: tuple[str, ...]
    distributions: tuple[str, ...]  # PyPI names, for the versions in the report
    options: Mapping[str, str] = field(default_factory=dict)
    note: str = ""

    def build(
        self, endpoint: Endpoint, *, session_timeout: float = 10.0
    ) -> AsyncAdapter | SyncAdapter:
        module = importlib.import_module(f"{__name__}.{self.module}")
        factory = getattr(module, self.cls)
        kwargs: dict[str, object] = dict(self.options)
        if endpoint.family in ("zookeeper", "etcd") and self.role != "reference":
            kwargs["session_timeout"] = session_timeout
        adapter = factory(endpoint, **kwargs)
        assert isinstance(adapter, AsyncAdapter | SyncAdapter)
        return adapter


_WAITING = ("contended", "contended_procs", "waiters", "handoff")
_AIODLOCK = ("uncontended", "contended", "contended_procs", "waiters", "handoff")
_STORMED = (*_AIODLOCK, "storm")

LIBRARIES: tuple[Library, ...] = (
    # ------------------------------------------------------------------ Redis
    Library("raw-redis", "raw floor: SET NX PX + EVALSHA", "redis", "floor", "raw", "RawRedis",
            True, ("uncontended",), ("redis", "hiredis")),
    Library("fenced-floor-redis", "fenced floor: SET NX PX and the token in one script + "
            "EVALSHA", "redis", "reference", "fenced", "FencedFloor", True, ("uncontended",),
            ("redis", "hiredis")),
    Library("aiodlock-redis-pubsub", "aiodlock redis:// (pub/sub)", "redis", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _STORMED, ("aiodlock", "redis")),
    Library("aiodlock-redis-blpop", "aiodlock redis://?wakeup=blpop", "redis", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "redis"),
            {"query": "wakeup=blpop"}),
    Library("aiodlock-redis-fair", "aiodlock redis:// fair=True (pub/sub)", "redis",
            "aiodlock", "aiodlock_lib", "AiodlockAdapter", True, ("contended", "contended_procs"),
            ("aiodlock", "redis"), {"fair": "1"}),
    Library("redis-py", "redis-py asyncio Lock (sleep=0.1)", "redis", "incumbent", "redis_py",
            "RedisPyLockAdapter", True, ("uncontended", *_WAITING), ("redis",)),
    Library("python-redis-lock", "python-redis-lock (threads)", "redis", "incumbent",
            "python_redis_lock", "PythonRedisLockAdapter", False, ("uncontended", *_WAITING),
            ("python-redis-lock", "redis")),
    Library("pottery-sync", "pottery Redlock, 1 master (threads)", "redis", "incumbent",
            "pottery_lib", "PotterySyncAdapter", False, ("uncontended", *_WAITING),
            ("pottery", "redis")),
    Library("pottery-async", "pottery AIORedlock, 1 master", "redis", "incumbent",
            "pottery_lib", "PotteryAsyncAdapter", True, ("uncontended", *_WAITING),
            ("pottery", "redis")),
    Library("aioredlock", "aioredlock (aioredis 1.x)", "redis", "incumbent", "aioredlock_lib",
            "AioredlockAdapter", True, ("uncontended", *_WAITING), ("aioredlock", "aioredis")),
    # ------------------------------------------------------------------ Redis Cluster
    Library("raw-redis-cluster", "raw floor: SET NX PX + EVALSHA (RedisCluster)",
            "redis-cluster", "floor", "raw", "RawRedisCluster", True, ("uncontended",),
            ("redis", "hiredis")),
    Library("aiodlock-cluster-pubsub", "aiodlock redis+cluster:// (sharded pub/sub)",
            "redis-cluster", "aiodlock", "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK,
            ("aiodlock", "redis")),
    Library("aiodlock-cluster-blpop", "aiodlock redis+cluster://?wakeup=blpop",
            "redis-cluster", "aiodlock", "aiodlock_lib", "AiodlockAdapter", True,
            ("uncontended", "contended"), ("aiodlock", "redis"), {"query": "wakeup=blpop"}),
    # ------------------------------------------------------------------ Redis Sentinel
    Library("raw-redis-sentinel", "raw floor: SET NX PX + EVALSHA (master from Sentinel)",
            "redis-sentinel", "floor", "raw", "RawRedisSentinel", True, ("uncontended",),
            ("redis", "hiredis")),
    Library("aiodlock-sentinel", "aiodlock redis+sentinel:// (pub/sub)", "redis-sentinel",
            "aiodlock", "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK,
            ("aiodlock", "redis")),
    # ------------------------------------------------------------------ Redlock, 3 masters
    Library("raw-redlock", "raw floor: SET NX PX + EVALSHA, each on a quorum of 3", "redlock",
            "floor", "raw", "RawRedlock", True, ("uncontended",), ("redis", "hiredis")),
    Library("aiodlock-redlock", "aiodlock redlock:// (3 masters)", "redlock", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "redis")),
    Library("pottery-async-redlock", "pottery AIORedlock, 3 masters", "redlock", "incumbent",
            "pottery_lib", "PotteryAsyncAdapter", True, ("uncontended", *_WAITING),
            ("pottery", "redis")),
    Library("pottery-sync-redlock", "pottery Redlock, 3 masters (threads)", "redlock",
            "incumbent", "pottery_lib", "PotterySyncAdapter", False, ("uncontended", *_WAITING),
            ("pottery", "redis")),
    Library("aioredlock-redlock", "aioredlock, 3 masters", "redlock", "incumbent",
            "aioredlock_lib", "AioredlockAdapter", True, ("uncontended", *_WAITING),
            ("aioredlock", "aioredis")),
    # ------------------------------------------------------------------ ZooKeeper
    Library("raw-zookeeper", "raw floor: create + get_children + delete", "zookeeper", "floor",
            "raw", "RawZooKeeper", True, ("uncontended",), ("aiozk",)),
    Library("aiodlock-zookeeper", "aiodlock zookeeper://", "zookeeper", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _STORMED, ("aiodlock", "aiozk")),
    Library("aiodlock-zookeeper-fair", "aiodlock zookeeper:// fair=True", "zookeeper",
            "aiodlock", "aiodlock_lib", "AiodlockAdapter", True, ("storm",),
            ("aiodlock", "aiozk"), {"fair": "1"}),
    Library("aiodlock-zookeeper-semaphore", "aiodlock zookeeper:// semaphore, limit 3",
            "zookeeper", "aiodlock", "aiodlock_lib", "AiodlockAdapter", True, ("storm",),
            ("aiodlock", "aiozk"), {"limit": "3"}),
    Library("kazoo", "kazoo Lock (threads)", "zookeeper", "incumbent", "kazoo_lib",
            "KazooLockAdapter", False, ("uncontended", *_WAITING), ("kazoo",)),
    Library("aiozk", "aiozk recipes.Lock", "zookeeper", "incumbent", "aiozk_lib",
            "AiozkLockAdapter", True, ("uncontended", *_WAITING), ("aiozk",)),
    # ------------------------------------------------------------------ ZooKeeper, 3 nodes
    Library("raw-zookeeper-ensemble", "raw floor: create + get_children + delete",
            "zookeeper-ensemble", "floor", "raw", "RawZooKeeper", True, ("uncontended",),
            ("aiozk",)),
    Library("aiodlock-zookeeper-ensemble", "aiodlock zookeeper://h1,h2,h3",
            "zookeeper-ensemble", "aiodlock", "aiodlock_lib", "AiodlockAdapter", True,
            _AIODLOCK, ("aiodlock", "aiozk")),
    Library("kazoo-ensemble", "kazoo Lock (threads)", "zookeeper-ensemble", "incumbent",
            "kazoo_lib", "KazooLockAdapter", False, ("uncontended", *_WAITING), ("kazoo",)),
    Library("aiozk-ensemble", "aiozk recipes.Lock", "zookeeper-ensemble", "incumbent",
            "aiozk_lib", "AiozkLockAdapter", True, ("uncontended", "contended_procs"),
            ("aiozk",)),
    # ------------------------------------------------------------------ etcd
    Library("raw-etcd", "raw floor: txn (put if absent + list) + delete", "etcd", "floor",
            "raw", "RawEtcd", True, ("uncontended",), ("aetcd", "grpcio")),
    Library("aiodlock-etcd", "aiodlock etcd://", "etcd", "aiodlock", "aiodlock_lib",
            "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "aetcd")),
    Library("aetcd", "aetcd Lock", "etcd", "incumbent", "aetcd_lib", "AetcdLockAdapter", True,
            ("uncontended", *_WAITING), ("aetcd",)),
    # ------------------------------------------------------------------ MySQL / MariaDB
    Library("raw-mysql", "raw floor: GET_LOCK + RELEASE_LOCK", "mysql", "floor", "raw",
            "RawMySQL", True, ("uncontended",), ("aiomysql",)),
    Library("fenced-floor-mysql", "fenced floor: GET_LOCK and the token in one INSERT + "
            "RELEASE_LOCK", "mysql", "reference", "fenced", "FencedFloor", True, ("uncontended",),
            ("aiomysql",)),
    Library("aiodlock-mysql", "aiodlock mysql://", "mysql", "aiodlock", "aiodlock_lib",
            "AiodlockAdapter", True, _STORMED, ("aiodlock", "aiomysql")),
    # ------------------------------------------------------------------ PostgreSQL
    Library("raw-postgres", "raw floor: pg_try_advisory_lock + pg_advisory_unlock", "postgres",
            "floor", "raw", "RawPostgres", True, ("uncontended",), ("asyncpg",)),
    Library("fenced-floor-postgres", "fenced floor: pg_try_advisory_lock and the token in one "
            "INSERT + pg_advisory_unlock", "postgres", "reference", "fenced", "FencedFloor", True,
            ("uncontended",), ("asyncpg",)),
    Library("aiodlock-postgres", "aiodlock postgresql://", "postgres", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "asyncpg")),
    # ------------------------------------------------------------------ no server
    Library("asyncio-lock", "asyncio.Lock, in process (ceiling)", "none", "reference",
            "reference", "LocalLockAdapter", True, ("contended",), ()),
    Library("fenced-asyncio-lock", "asyncio.Lock + one INCR per grant (ceiling of a fencing "
            "lock)", "redis", "reference", "fenced", "FencedLocalLock", True, ("contended",),
            ("redis", "hiredis")),
    Library("fenced-asyncio-lock-zookeeper", "asyncio.Lock + one setData per grant (ceiling "
            "of a fencing lock)", "zookeeper", "reference", "fenced", "FencedLocalLock", True,
            ("contended",), ("aiozk",)),
    Library("fenced-asyncio-lock-mysql", "asyncio.Lock + one fencing upsert per grant "
            "(ceiling of a fencing lock)", "mysql", "reference", "fenced", "FencedLocalLock",
            True, ("contended",), ("aiomysql",)),
    Library("pubsub-baton", "baton passed round the processes by PUBLISH (ceiling of a "
            "one-message handover)", "redis", "reference", "reference", "PubSubBaton", True,
            ("contended_procs",), ("redis", "hiredis"), {"members": str(FULL.workers)}),
)  # fmt: skip


def by_key(key: str) -> Library:
    for library in LIBRARIES:
        if library.key == key:
            return library
    raise KeyError(f"unknown library {key!r}; known: {', '.join(x.key for x in LIBRARIES)}")
