"""The knobs of a full run and of a ``--quick`` smoke run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

__all__ = ["FULL", "QUICK", "Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    repeat: int = 3
    """Runs of every cell; the report shows the median of each metric."""
    ttl: float = 10.0
    """Lease of the locks in scenarios 1-3 (long enough never to expire there)."""
    cycles: int = 2000
    warmup: int = 200
    workers: int = 10
    duration: float = 2.0
    section: float = 0.001
    waiters: int = 1000
    settle: float = 1.0
    drain_timeout: float = 4.0
    trials: int = 2
    handoff_ttl: float = 0.5
    """Lease of the crashing holder in scenario 4 (Redis; python-redis-lock rounds up to 1 s)."""
    session_timeout: float = 1.0
    """ZooKeeper session timeout of the crashing holder in scenario 4."""
    storm_processes: int = 2
    storm_tasks: int = 100
    """Tasks per process in the cancellation storm (scenario 6)."""
    storm_duration: float = 10.0
    storm_ttl: float = 5.0
    storm_session_timeout: float = 2.0
    """ZooKeeper session timeout of the storm's clients."""

    def params(self) -> dict[str, float | int]:
        return asdict(self)


FULL = Settings()
QUICK = replace(
    FULL,
    repeat=1,
    cycles=300,
    warmup=50,
    duration=1.0,
    settle=0.5,
    drain_timeout=3.0,
    trials=1,
    storm_duration=3.0,
)
