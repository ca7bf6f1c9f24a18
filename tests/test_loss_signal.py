"""A session backend's loss signal: watched by a callback, not by a task per grant.

The backend here is the memory backend with a :class:`~aiodlock.backends.LossSignal` per
grant (as the session backends give), so that a test can set it: the lease has no keep-alive
task until its first renewal is due, and setting the signal cancels the body at once all the
same. A plain :class:`asyncio.Event` (a third-party backend's) is watched by a task from the
grant on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import aiodlock
from aiodlock.backends import LossSignal, parse_url
from aiodlock.backends.memory import MemoryBackend

pytestmark = pytest.mark.memory


def test_a_loss_signal_calls_back_once_and_at_once_when_already_set() -> None:
    signal = LossSignal()
    calls: list[str] = []

    def removed() -> None:
        calls.append("removed")

    signal.add_callback(lambda: calls.append("first"))
    signal.add_callback(removed)
    signal.remove_callback(removed)
    signal.remove_callback(removed)  # not registered: nothing happens
    assert calls == []
    signal.set()
    signal.set()  # set once: callbacks run once
    assert calls == ["first"]
    assert signal.is_set()
    signal.add_callback(lambda: calls.append("late"))
    assert calls == ["first", "late"]


class _Signalled(MemoryBackend):
    """Memory locks whose grants each carry a loss signal the test can set."""

    def __init__(self, signal_type: type[asyncio.Event]) -> None:
        super().__init__(parse_url(f"memory://signal-{signal_type.__name__}"), {})
        self._signal_type = signal_type
        self.signals: dict[str, asyncio.Event] = {}

    def loss_signal(self, spec: Any, owner: str) -> asyncio.Event | None:
        return self.signals.setdefault(owner, self._signal_type())


def _keepalives() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("aiodlock-keepalive-")]


@pytest.mark.parametrize("signal_type", [LossSignal, asyncio.Event])
async def test_a_signalled_loss_cancels_the_body_at_once(
    signal_type: type[asyncio.Event],
) -> None:
    backend = _Signalled(signal_type)
    client = aiodlock.LockClient(backend, namespace="t", ttl=30, timeout=None, max_hold=None)
    async with client as locks:
        entered = asyncio.Event()

        async def body() -> None:
            async with locks.lock("held"):
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(body())
        await entered.wait()
        # A LossSignal is watched by a callback: no task until the first renewal (10 s).
        tasks = 0 if signal_type is LossSignal else 1
        assert len(_keepalives()) == tasks
        (signal,) = backend.signals.values()
        signal.set()
        with pytest.raises(aiodlock.LockLostError):
            await asyncio.wait_for(task, 1)
        await asyncio.sleep(0)  # the finished keep-alive leaves the group
        async with locks.lock("short"):
            assert len(_keepalives()) == tasks
        if signal_type is LossSignal:  # released: no callback is left on any signal
            assert all(not s._callbacks for s in backend.signals.values())  # type: ignore[attr-defined]
