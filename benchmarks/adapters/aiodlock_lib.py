"""aiodlock itself, on any backend: ``async with locks.lock(name, ttl=...)``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import aiodlock

from .base import AsyncAdapter, Endpoint

__all__ = ["AiodlockAdapter"]

NAMESPACE = "bench"


class AiodlockAdapter(AsyncAdapter):
    """One :class:`aiodlock.LockClient`; ``query`` is appended to the URL (``wakeup=blpop``).

    ``fair="1"`` takes ``locks.lock(name, fair=True)`` (FIFO handoff) instead, and
    ``limit="3"`` ``locks.semaphore(name, limit=3)``.
    """

    backend = "any"

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        query: str = "",
        fair: str = "",
        limit: str = "",
        session_timeout: float = 10.0,
    ) -> None:
        super().__init__(endpoint)
        self.fair = bool(fair)
        self.limit = int(limit) if limit else None
        self.holders = self.limit or 1
        params = [query] if query else []
        if endpoint.family == "zookeeper":
            params.append(f"session_timeout={session_timeout:g}")
        if endpoint.family == "etcd":  # a lease of whole seconds
            params.append(f"session_ttl={_etcd_session_ttl(session_timeout):g}")
        self.url = endpoint.url + ("?" + "&".join(params) if params else "")
        self._client: aiodlock.LockClient | None = None

    @property
    def client(self) -> aiodlock.LockClient:
        assert self._client is not None, "not open"
        return self._client

    async def open(self) -> None:
        client = aiodlock.connect(self.url, namespace=NAMESPACE)
        self._client = await client.__aenter__()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def hold(self, name: str, *, ttl: float) -> AbstractAsyncContextManager[object]:
        if self.limit is not None:
            return self.client.semaphore(name, limit=self.limit, ttl=ttl)
        return self.client.lock(name, ttl=ttl, fair=self.fair)

    def server_key(self, name: str) -> str | None:
        return f"{{{NAMESPACE}:{name}}}" if self.endpoint.family in ("redis", "redlock") else None

    def crash_lease(self, *, ttl: float, session_timeout: float) -> float:
        if self.endpoint.family == "etcd":  # the crashed holder's lease, as it made it
            return _etcd_session_ttl(session_timeout)
        return super().crash_lease(ttl=ttl, session_timeout=session_timeout)


def _etcd_session_ttl(session_timeout: float) -> float:
    """The etcd lease a client of the benchmark asks for: whole seconds, at least 2."""
    return float(max(2, round(session_timeout)))
