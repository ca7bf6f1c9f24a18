"""What one SQL server contributes to the engine: :class:`Dialect` (and :class:`Connection`).

The engine runs the same steps on every server; a dialect says how this server takes a lock
(``GET_LOCK`` or an advisory lock), fences it, waits for it, confirms and releases it, which
errors its driver raises, and how its sessions are opened, checked, cleaned and ended. ``C`` is
the dialect's connection type, ``H`` what a session holds for an acquisition (hashable: the
local-holder table is keyed by it). docs/architecture.md shows where dialects plug in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .. import LockInfo, LockSpec
from ._connection import Connection, ConnectSettings
from ._settings import Settings

if TYPE_CHECKING:
    from ._acquisitions import Acquisition

__all__ = ["Attempt", "Dialect", "DialectBase", "Operate"]

T = TypeVar("T")


C = TypeVar("C", bound=Connection)
C_co = TypeVar("C_co", bound=Connection, covariant=True)
H = TypeVar("H")

Attempt = tuple[Any, int | None, bool]
"""What a lock attempt got: ``(held or None when busy, fencing token or None when the fencing
row belongs to another name, whether the semaphore's recorded limit must be checked)``."""


class Operate(Protocol[C_co]):
    """Runs one operator step (``inspect``, ``break``) on a lock-free connection."""

    async def __call__(self, action: str, work: Callable[[C_co], Awaitable[T]]) -> T: ...


class Dialect(Protocol[C, H]):
    """One server's way of doing each step of the engine (see the module docstring)."""

    name: str
    """``mysql`` or ``postgres``: in messages and task names."""
    driver_errors: tuple[type[BaseException], ...]
    """What the driver raises: translated to ``BackendError`` at the boundary."""
    max_semaphore_limit: int
    permit_unit: str
    """What one permit of a semaphore is, for the refusal of a larger limit."""
    sessions_outgrow: bool
    """Whether the sessions table grows without the sweep (MySQL's connection ids only go
    up; PostgreSQL's pids come round again and overwrite their rows): then it is swept even
    with ``fence_ttl=0``."""

    # sessions
    async def connect(self) -> C: ...
    async def start(self, conn: C) -> str:
        """First connection: check the server, prepare the fencing table; its version."""

    def stale(self, conn: C, idle_for: float) -> bool:
        """An idle connection too old to use (the server may end it any moment)."""

    async def ping(self, conn: C) -> None: ...
    def doubtful(self, conn: C) -> bool:
        """A reply was abandoned: the session may hold something; clean before reuse."""

    async def clean(self, conn: C) -> None:
        """Drop whatever a doubtful session holds (raise if that cannot be known)."""

    def abandoned_session(self, conn: C) -> int | None:
        """The server id of a session closed mid-query that the server must end, or None."""

    async def kill(self, conn: C, session: int) -> None:
        """End ``session`` on the server (one gone already is fine)."""

    async def close_all(self, conns: list[C]) -> None: ...
    def detail(self, exc: BaseException) -> str:
        """A driver exception's message, as the translated error shows it."""

    # locks
    def mutex_target(self, spec: LockSpec) -> H: ...
    async def attempt(self, spec: LockSpec, acq: Acquisition[C, H], conn: C, ttl: float) -> Attempt:
        """Take the lock without waiting (or claim what a wait got: ``acq.held``) and bump
        its fencing row."""

    async def recorded_limit(
        self, spec: LockSpec, conn: C, *, lock_row: bool = False
    ) -> int | None:
        """The semaphore limit recorded in the name's fencing row (None: no row, or no
        table yet); ``lock_row``: read it ``FOR UPDATE``, inside :meth:`begin`."""

    async def record_limit(self, spec: LockSpec, conn: C) -> None:
        """Write ``spec.limit`` into the name's fencing row (inside :meth:`begin`)."""

    async def slots_held_by_others(self, spec: LockSpec, conn: C, limit: int) -> bool:
        """Whether another session holds one of the slots of a semaphore of ``limit``."""

    async def begin(self, conn: C) -> None: ...
    async def finish(self, conn: C, *, commit: bool) -> None: ...
    def foreign_row(self, spec: LockSpec) -> str: ...
    async def wait(self, spec: LockSpec, acq: Acquisition[C, H], conn: C, slice_: float) -> None:
        """One server-side wait of at most ``slice_``; sets ``acq.held`` (and ``acq.claim``
        for a grant fenced by the wait itself) when it got the lock."""

    async def confirm(self, conn: C, held: H, ttl: float) -> bool: ...
    async def release(self, conn: C, held: H) -> tuple[bool, bool]:
        """Unlock: ``(released, the session holds nothing now)``."""

    async def release_one(self, conn: C, held: H, ttl: float | None) -> bool:
        """Unlock one mutex of a shared session (its others stay), its idle timeout set for
        ``ttl``, the shortest lease left on it (None: none is); whether it was held."""

    async def keep_idle(self, conn: C, ttl: float) -> None:
        """Set a shared session's idle timeout back to ``ttl`` after a refused attempt that
        changed it (MySQL sets ``wait_timeout`` before ``GET_LOCK``)."""

    # fencing and operators
    async def sweep_batch(self, conn: C) -> int: ...
    async def sweep_sessions(self, conn: C) -> None:
        """Delete the identity rows of sessions that have ended (once per fencing sweep)."""

    async def inspect(self, run: Operate[C], namespace: str, pattern: str) -> list[LockInfo]: ...
    async def namespaces(self, run: Operate[C]) -> list[str]:
        """The namespaces of the fencing table, sorted."""

    async def break_lock(self, run: Operate[C], spec: LockSpec) -> int: ...


class DialectBase:
    """What every dialect keeps of the settings (a dialect class derives from it)."""

    max_semaphore_limit: int = 256
    """One server lock per permit, all tried in one statement: keep N reasonable."""

    def __init__(self, settings: Settings, connect: ConnectSettings) -> None:
        self._connect = connect
        self._where = settings.where
        self._table = settings.fence_table
        self._bounds = settings.bounds
        self._request_timeout = settings.request_timeout

    def detail(self, exc: BaseException) -> str:
        """A driver exception's message, as the translated error shows it."""
        return str(exc)
