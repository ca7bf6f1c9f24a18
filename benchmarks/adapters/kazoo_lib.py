"""kazoo's ``Lock`` recipe (blocking; kazoo runs its own connection thread)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from kazoo.client import KazooClient  # type: ignore[import-untyped]  # untyped

from .base import Endpoint, SyncAdapter

__all__ = ["KazooLockAdapter"]

ROOT = "/bench-kazoo"


class KazooLockAdapter(SyncAdapter):
    """``with client.Lock(f"{ROOT}/{name}")``: one contender node, watching its predecessor."""

    backend = "zookeeper"

    def __init__(self, endpoint: Endpoint, *, session_timeout: float = 10.0) -> None:
        super().__init__(endpoint)
        self._session_timeout = session_timeout
        self._client: KazooClient | None = None

    def open(self) -> None:
        client = KazooClient(hosts=self.endpoint.hosts, timeout=self._session_timeout)
        client.start(timeout=15)
        self._client = client

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()

    def hold(self, name: str, *, ttl: float) -> AbstractContextManager[object]:
        assert self._client is not None, "not open"
        return self._client.Lock(f"{ROOT}/{name}")  # type: ignore[no-any-return]
