"""What the framework integrations share: which lock a ``kind`` names, its options checked
when ``hold()`` is declared, and the HTTP answer (and log line) for each way of not getting
(or not keeping) it. No framework is imported here.

Example::

    recipe = LockRecipe.make("order:{order_id}", "mutex", None, {"timeout": 5}, 1, None)
    answer_for(exc, recipe)   # Answer(423, "locked", 1) for a LockTimeoutError
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from .. import (
    BackendError,
    BaseLock,
    LockClient,
    LockError,
    LockLostError,
    LockTimeoutError,
    NameTemplate,
    UnsupportedError,
)
from .._validate import check_bool, check_limit, check_seconds, check_timeout, check_ttl

__all__ = [
    "KINDS",
    "Answer",
    "DetailHook",
    "Kind",
    "LockRecipe",
    "answer_for",
    "check_backend",
    "default_detail",
    "logger",
]

Kind = Literal["mutex", "read", "write", "semaphore"]
KINDS: Final = ("mutex", "read", "write", "semaphore")

DetailHook = Callable[[LockError], str]
"""Chooses the ``detail`` of a 423/503 body from the exception (``detail=`` of ``hold()``)."""

logger = logging.getLogger("aiodlock.integrations")

# The client's factory for each kind: hold()'s options are bound to its signature, so an
# option the kind has not (``fair`` on a read lock, a typo) fails as the client would fail.
_FACTORIES: Final[dict[str, Callable[..., BaseLock]]] = {
    "mutex": LockClient.lock,
    "read": LockClient.read_lock,
    "write": LockClient.write_lock,
    "semaphore": LockClient.semaphore,
}


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status, a short reason, and the ``Retry-After`` seconds if any."""

    status: int
    detail: str
    retry_after: int | None

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


def default_detail(exc: LockError) -> str:
    """The body's ``detail`` unless ``hold(detail=...)`` chooses: generic words that tell a
    client nothing of the lock service (its URL, its driver's error); those go to the log.

    Wrap it to reword one case and keep the others::

        def detail(exc: aiodlock.LockError) -> str:
            if isinstance(exc, aiodlock.LockTimeoutError):
                return "this order is being changed; try again"
            return default_detail(exc)
    """
    if isinstance(exc, LockTimeoutError):
        return "locked"
    if isinstance(exc, LockLostError):
        return "lock lost while handling the request"
    return "lock service unavailable"


def answer_for(exc: BaseException, recipe: LockRecipe, where: str) -> Answer | None:
    """The answer for a lock failure, or None if ``exc`` is not one we map; logs it (one line:
    WARNING for a 503, INFO for a busy 423) with the exception's own text, which the client
    does not see unless ``recipe.detail`` shows it. ``where`` names the request."""
    if isinstance(exc, LockTimeoutError):
        # 423 Locked (RFC 4918): the resource is busy, the service is fine; try again later.
        status, level = 423, logging.INFO
    elif isinstance(exc, LockLostError | BackendError):
        status, level = 503, logging.WARNING
    else:
        return None
    detail = (recipe.detail or default_detail)(exc)
    logger.log(level, "%s: %d (%s): %s: %s", where, status, detail, type(exc).__name__, exc)
    return Answer(status, detail, recipe.retry_after)


@dataclass(frozen=True, slots=True)
class LockRecipe:
    """A lock to take per request: its kind, a name template, and the lock's options.

    Checked when it is made (kind, template, ``limit`` for a semaphore and only for it, every
    lock option with the client's own checks), so a typo or a ``ttl=0`` fails at import time
    rather than on every request.
    """

    template: NameTemplate
    kind: Kind
    limit: int | None
    options: dict[str, Any]
    retry_after: int
    detail: DetailHook | None

    @classmethod
    def make(
        cls,
        name_template: str,
        kind: str,
        limit: int | None,
        options: dict[str, Any],
        retry_after: int,
        detail: DetailHook | None,
    ) -> LockRecipe:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if (kind == "semaphore") != (limit is not None):
            raise TypeError("limit= is required for kind='semaphore', and only for it")
        if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0:
            raise ValueError(f"retry_after must be an int >= 0 (seconds), not {retry_after!r}")
        if detail is not None and not callable(detail):
            raise TypeError(
                "detail must be a function (exception) -> str, not " + type(detail).__name__
            )
        template = NameTemplate(name_template)
        extra = {} if limit is None else {"limit": limit}
        check_options(kind, {**extra, **options})
        return cls(template, kind, limit, options, retry_after, detail)  # type: ignore[arg-type]

    def lock(self, client: LockClient, name: str) -> BaseLock:
        """The lock object for ``name`` on ``client``."""
        if self.kind == "semaphore":
            assert self.limit is not None
            return client.semaphore(name, limit=self.limit, **self.options)
        return _FACTORIES[self.kind](client, name, **self.options)


def check_options(kind: str, options: dict[str, Any]) -> None:
    """Check a lock's options as ``LockClient.lock()`` (``read_lock()``...) would, with its
    messages: an option the kind has not is the ``TypeError`` of the call, a bad value the
    client's ``TypeError``/``ValueError``. Only the backend's support (``fair=True``) is left
    to the request."""
    factory = _FACTORIES[kind]
    try:
        inspect.signature(factory).bind(None, "name", **options)
    except TypeError as exc:
        raise TypeError(f"{factory.__qualname__}() {exc}") from None
    # In the order the client checks them, so that two bad values give its first message.
    if "limit" in options:
        check_limit(options["limit"])
    for flag in ("fair", "reentrant"):
        if flag in options:
            check_bool(options[flag], argument=flag)
    if "ttl" in options:
        check_ttl(options["ttl"])
    if "timeout" in options:
        check_timeout(options["timeout"])
    if "max_hold" in options:
        check_seconds(options["max_hold"], argument="max_hold")


def check_backend(client: LockClient, held: Iterable[tuple[str, LockRecipe]]) -> None:
    """Refuse, at startup, a lock the app's backend cannot provide (``fair=True`` or a read
    lock where the backend has none): an ``UnsupportedError`` naming each ``(route, recipe)``,
    rather than a 500 on every request. Building a lock object does no I/O."""
    problems = []
    for route, recipe in held:
        try:
            recipe.lock(client, "startup-check")
        except UnsupportedError as exc:
            problems.append(f"hold({recipe.template.template!r}) on route {route!r}: {exc}")
    if problems:
        raise UnsupportedError("; ".join(problems))
