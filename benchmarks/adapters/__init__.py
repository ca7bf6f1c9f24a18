"""The catalogue: every library the benchmark measures, and how to build its adapter.

Adapter modules are imported only by the child process that measures them, so a library that
does not install or import costs its own rows (reported as unavailable), nothing else.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .base import AsyncAdapter, Endpoint, SyncAdapter

__all__ = ["LIBRARIES", "Library", "by_key"]

Role = Literal["floor", "aiodlock", "incumbent", "reference"]
ALL_SCENARIOS = ("uncontended", "contended", "contended_procs", "waiters", "handoff")


@dataclass(frozen=True, slots=True)
class Library:
    """One row of the results: a library (or the raw floor) on one backend."""

    key: str
    label: str
    backend: str  # "redis" | "zookeeper" | "etcd" | "mysql" | "postgres" | "none"
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
        if self.backend == "zookeeper":
            kwargs["session_timeout"] = session_timeout
        adapter = factory(endpoint, **kwargs)
        assert isinstance(adapter, AsyncAdapter | SyncAdapter)
        return adapter


_WAITING = ("contended", "contended_procs", "waiters", "handoff")
_AIODLOCK = ("uncontended", "contended", "contended_procs", "waiters", "handoff")

LIBRARIES: tuple[Library, ...] = (
    # ------------------------------------------------------------------ Redis
    Library("raw-redis", "raw floor: SET NX PX + EVALSHA", "redis", "floor", "raw", "RawRedis",
            True, ("uncontended",), ("redis", "hiredis")),
    Library("aiodlock-redis-pubsub", "aiodlock redis:// (pub/sub)", "redis", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "redis")),
    Library("aiodlock-redis-blpop", "aiodlock redis://?wakeup=blpop", "redis", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "redis"),
            {"query": "wakeup=blpop"}),
    Library("aiodlock-redis-fair", "aiodlock redis:// fair=True (pub/sub)", "redis",
            "aiodlock", "aiodlock_lib", "AiodlockAdapter", True, ("contended",),
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
            "redis-cluster", "aiodlock", "aiodlock_lib", "AiodlockAdapter", True,
            ("uncontended", "contended"), ("aiodlock", "redis")),
    Library("aiodlock-cluster-blpop", "aiodlock redis+cluster://?wakeup=blpop",
            "redis-cluster", "aiodlock", "aiodlock_lib", "AiodlockAdapter", True,
            ("uncontended", "contended"), ("aiodlock", "redis"), {"query": "wakeup=blpop"}),
    # ------------------------------------------------------------------ ZooKeeper
    Library("raw-zookeeper", "raw floor: create + get_children + delete", "zookeeper", "floor",
            "raw", "RawZooKeeper", True, ("uncontended",), ("aiozk",)),
    Library("aiodlock-zookeeper", "aiodlock zookeeper://", "zookeeper", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "aiozk")),
    Library("kazoo", "kazoo Lock (threads)", "zookeeper", "incumbent", "kazoo_lib",
            "KazooLockAdapter", False, ("uncontended", *_WAITING), ("kazoo",)),
    Library("aiozk", "aiozk recipes.Lock", "zookeeper", "incumbent", "aiozk_lib",
            "AiozkLockAdapter", True, ("uncontended", *_WAITING), ("aiozk",)),
    # ------------------------------------------------------------------ etcd
    Library("raw-etcd", "raw floor: txn (put if absent + list) + delete", "etcd", "floor",
            "raw", "RawEtcd", True, ("uncontended",), ("aetcd", "grpcio")),
    # (Not yet: the waiters and handoff scenarios, whose probes do not know etcd.)
    Library("aiodlock-etcd", "aiodlock etcd://", "etcd", "aiodlock", "aiodlock_lib",
            "AiodlockAdapter", True, ("uncontended", "contended"), ("aiodlock", "aetcd")),
    Library("aetcd", "aetcd Lock", "etcd", "incumbent", "aetcd_lib", "AetcdLockAdapter", True,
            ("uncontended", "contended"), ("aetcd",)),
    # ------------------------------------------------------------------ MySQL / MariaDB
    Library("raw-mysql", "raw floor: GET_LOCK + RELEASE_LOCK", "mysql", "floor", "raw",
            "RawMySQL", True, ("uncontended",), ("aiomysql",)),
    Library("aiodlock-mysql", "aiodlock mysql://", "mysql", "aiodlock", "aiodlock_lib",
            "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "aiomysql")),
    # ------------------------------------------------------------------ PostgreSQL
    Library("raw-postgres", "raw floor: pg_try_advisory_lock + pg_advisory_unlock", "postgres",
            "floor", "raw", "RawPostgres", True, ("uncontended",), ("asyncpg",)),
    Library("aiodlock-postgres", "aiodlock postgresql://", "postgres", "aiodlock",
            "aiodlock_lib", "AiodlockAdapter", True, _AIODLOCK, ("aiodlock", "asyncpg")),
    # ------------------------------------------------------------------ no server
    Library("asyncio-lock", "asyncio.Lock, in process (ceiling)", "none", "reference",
            "reference", "LocalLockAdapter", True, ("contended",), ()),
)  # fmt: skip


def by_key(key: str) -> Library:
    for library in LIBRARIES:
        if library.key == key:
            return library
    raise KeyError(f"unknown library {key!r}; known: {', '.join(x.key for x in LIBRARIES)}")
