"""What the framework integrations share: which lock a ``kind`` names, and the HTTP answer
for each way of not getting (or not keeping) it. No framework is imported here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from .. import BackendError, BaseLock, LockClient, LockLostError, LockTimeoutError
from .._template import NameTemplate

__all__ = ["KINDS", "Answer", "Kind", "LockRecipe", "answer_for"]

Kind = Literal["mutex", "read", "write", "semaphore"]
KINDS: Final = ("mutex", "read", "write", "semaphore")


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status, a short reason, and the ``Retry-After`` seconds if any."""

    status: int
    detail: str
    retry_after: int | None

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


def answer_for(exc: BaseException, retry_after: int) -> Answer | None:
    """The answer for a lock failure, or None if ``exc`` is not one we map."""
    if isinstance(exc, LockTimeoutError):
        # 423 Locked (RFC 4918): the resource is busy, the service is fine; try again later.
        return Answer(423, f"locked: {exc}", retry_after)
    if isinstance(exc, LockLostError):
        return Answer(503, f"lock lost while handling the request: {exc}", retry_after)
    if isinstance(exc, BackendError):
        return Answer(503, f"lock service unavailable: {exc}", retry_after)
    return None


@dataclass(frozen=True, slots=True)
class LockRecipe:
    """A lock to take per request: its kind, a name template, and the lock's options.

    Checked when it is made (kind, template, ``limit`` for a semaphore and only for it), so a
    typo fails at import time rather than on the first request.
    """

    template: NameTemplate
    kind: Kind
    limit: int | None
    options: dict[str, Any]
    retry_after: int

    @classmethod
    def make(
        cls,
        name_template: str,
        kind: str,
        limit: int | None,
        options: dict[str, Any],
        retry_after: int,
    ) -> LockRecipe:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if (kind == "semaphore") != (limit is not None):
            raise TypeError("limit= is required for kind='semaphore', and only for it")
        if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0:
            raise ValueError(f"retry_after must be an int >= 0 (seconds), not {retry_after!r}")
        return cls(NameTemplate(name_template), kind, limit, options, retry_after)  # type: ignore[arg-type]

    def lock(self, client: LockClient, name: str) -> BaseLock:
        """The lock object for ``name`` on ``client`` (its options checked by the client)."""
        if self.kind == "mutex":
            return client.lock(name, **self.options)
        if self.kind == "read":
            return client.read_lock(name, **self.options)
        if self.kind == "write":
            return client.write_lock(name, **self.options)
        assert self.limit is not None
        return client.semaphore(name, limit=self.limit, **self.options)
