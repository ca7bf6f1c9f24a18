"""The public surface, argument validation and URL handling (no server, no driver needed).

Checks that need a driver (a backend's own options) are in that backend's test module.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys

import pytest

import aiodlock

pytestmark = pytest.mark.memory


def test_all_is_sorted_and_complete() -> None:
    assert aiodlock.__all__ == sorted(aiodlock.__all__)
    public = {n for n in dir(aiodlock) if not n.startswith("_")} - {"backends", "cli", "testing"}
    assert public == set(aiodlock.__all__)
    for name in aiodlock.__all__:
        obj = getattr(aiodlock, name)
        assert getattr(obj, "__module__", "aiodlock") == "aiodlock", name


def test_exception_tree() -> None:
    assert issubclass(aiodlock.LockTimeoutError, TimeoutError)
    # A mismatched semaphore limit is a programming error: catchable as one, never a
    # BackendError that retry or outage handling would swallow.
    assert issubclass(aiodlock.LimitMismatchError, ValueError)
    assert not issubclass(aiodlock.LimitMismatchError, aiodlock.BackendError)
    error = aiodlock.LimitMismatchError("pool", 2, 5)
    assert str(error) == "semaphore 'pool' is in use with limit 2; this one asks for limit 5"
    assert (error.name, error.in_use, error.requested) == ("pool", 2, 5)
    for exc in (
        aiodlock.LockTimeoutError,
        aiodlock.LockLostError,
        aiodlock.LockNotOwnedError,
        aiodlock.UnsupportedError,
        aiodlock.BackendError,
        aiodlock.StaleTokenError,
        aiodlock.LimitMismatchError,
    ):
        assert issubclass(exc, aiodlock.LockError)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("etcd://x", "known schemes: memory://, mysql://, redis://"),
        ("nonsense", "unknown URL scheme"),
        ("redis://h:99999", "port out of range"),
        ("redis://h:abc", "bad port"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        aiodlock.connect(url)


def test_url_type() -> None:
    with pytest.raises(TypeError, match="url must be a str"):
        aiodlock.connect(42)  # type: ignore[arg-type]


def test_unknown_option_lists_known_ones() -> None:
    with pytest.raises(TypeError, match=r"'tll'.*ttl"):
        aiodlock.connect("memory://", tll=3)
    with pytest.raises(TypeError, match="URL query parameter 'colour'"):
        aiodlock.connect("memory://?colour=blue")


def test_query_options_are_converted_and_keywords_win() -> None:
    client = aiodlock.connect("memory://?ttl=7&timeout=2", timeout=3)
    assert (client.ttl, client.timeout) == (7.0, 3.0)
    with pytest.raises(ValueError, match="option ttl must be a number"):
        aiodlock.connect("memory://?ttl=soon")


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("argument", ["ttl", "timeout", "max_hold"])
def test_bad_durations(argument: str, value: float) -> None:
    with pytest.raises(ValueError, match=argument):
        aiodlock.connect(None, **{argument: value})


@pytest.mark.parametrize("value", ["10", True, [1]])
def test_duration_types(value: object) -> None:
    with pytest.raises(TypeError, match="ttl must be a number"):
        aiodlock.connect(ttl=value)


@pytest.mark.parametrize("namespace", ["", "a:b", "{x}", "a\x00"])
def test_bad_namespace(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        aiodlock.connect(namespace=namespace)


async def test_bad_names_and_limits() -> None:
    async with aiodlock.connect() as locks:
        with pytest.raises(ValueError, match="name must not be empty"):
            locks.lock("")
        with pytest.raises(TypeError, match="name must be a str"):
            locks.lock(b"x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="NUL"):
            locks.lock("a\x00b")
        with pytest.raises(ValueError, match="1025 bytes"):
            locks.lock("é" * 512 + "x")
        with pytest.raises(ValueError, match="limit must be >= 1"):
            locks.semaphore("s", limit=0)
        with pytest.raises(TypeError, match="limit must be an int"):
            locks.semaphore("s", limit=2.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="ttl must be > 0"):
            locks.lock("x", ttl=-1)
        with pytest.raises(ValueError, match="timeout must be finite"):
            await locks.lock("x").acquire(timeout=math.nan)
        with pytest.raises(TypeError, match="fn must be a coroutine function"):
            await locks.run_exclusive("x", 42)  # type: ignore[arg-type]


async def test_client_must_be_open() -> None:
    client = aiodlock.connect()
    with pytest.raises(RuntimeError, match="not open"):
        await client.lock("x").acquire()
    async with client:
        pass
    with pytest.raises(RuntimeError, match="already opened"):
        await client.__aenter__()


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    # As in a fresh interpreter: no module of the redis backend package imported yet.
    package = "aiodlock.backends.redis"
    for module in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ImportError, match=r"pip install 'aiodlock\[redis\]'"):
        aiodlock.connect("redis://127.0.0.1:6379/0")


def test_fencing_guard() -> None:
    guard = aiodlock.FencingGuard()
    guard.check(3)
    guard.check(3)
    guard.check(5)
    with pytest.raises(aiodlock.StaleTokenError, match="4 is older than 5"):
        guard.check(4)
    assert guard.newest == 5


async def test_runs_on_the_requested_event_loop() -> None:
    """The uvloop run of the suite really runs on uvloop (AIODLOCK_TEST_LOOP)."""
    expected = os.environ.get("AIODLOCK_TEST_LOOP", "asyncio")
    module = type(asyncio.get_running_loop()).__module__
    assert module.startswith("uvloop") == (expected == "uvloop")
