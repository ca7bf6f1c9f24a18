"""How redis-py's failures reach the caller: as :class:`~aiodlock.BackendError`, password-free.

Every redis-py exception (and every ``OSError``, which includes ``TimeoutError``) raised inside
an :class:`ErrorMap` block becomes a ``BackendError`` naming the action and the server, with
the driver's exception chained. The password never appears in the message, even where the
driver put it in its own text. Errors of the library itself (:class:`~aiodlock.LockError`)
pass through untouched.

Example::

    errors = ErrorMap("acquire", "redis://127.0.0.1:6379/0", password, limit=5.0)
    with errors:
        await client.ping()
"""

from __future__ import annotations

from types import TracebackType

import redis.asyncio.connection
from redis.exceptions import RedisClusterException, RedisError

from .. import BackendError, LockError

__all__ = ["ErrorMap"]

_CONNECTION_MODULE = redis.asyncio.connection.__file__


class ErrorMap:
    """``with``-block that turns driver exceptions into :class:`BackendError` (reusable).

    ``limit`` is the time bound of the action, named when a ``TimeoutError`` says nothing.
    """

    __slots__ = ("_action", "_limit", "_secret", "_where")

    def __init__(self, action: str, where: str, secret: str | None, limit: float) -> None:
        self._action = action
        self._where = where
        self._secret = secret
        self._limit = limit

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or isinstance(exc, LockError):
            return
        # OSError includes TimeoutError; RedisClusterException: a slot no master serves.
        if isinstance(exc, RedisError | RedisClusterException | OSError) or _closed_transport(exc):
            detail = str(exc)
            if not detail and isinstance(exc, TimeoutError):
                detail = f"no reply within {self._limit} s"
            if self._secret:
                detail = detail.replace(self._secret, "***")
            raise BackendError(
                f"redis {self._action} failed on {self._where}: {type(exc).__name__}: {detail}",
                request_sent=not _while_connecting(exc),
            ) from exc


def _closed_transport(exc: BaseException) -> bool:
    """uvloop's ``RuntimeError`` for a write to a transport that has just closed (a killed
    server), raised through redis-py's connection, which lets it out untranslated: a lost
    connection, not a programming error."""
    return isinstance(exc, RuntimeError) and _raised_in_connection(exc)


def _while_connecting(exc: BaseException) -> bool:
    """Whether redis-py raised ``exc`` while making a connection, before any command was
    written to it (so a lock step that failed so did nothing on the server)."""
    return _raised_in_connection(exc, function="connect_check_health")


def _raised_in_connection(exc: BaseException, function: str | None = None) -> bool:
    """Whether ``exc`` passed through redis-py's connection module (through ``function``
    of it, if given) on its way up."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == _CONNECTION_MODULE and function in (None, code.co_name):
            return True
        tb = tb.tb_next
    return False
