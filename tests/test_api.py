"""The public surface, argument validation and URL handling (no server, no driver needed).

Checks that need a driver (a backend's own options) are in that backend's test module.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import re
import sys

import pytest

import aiodlock
from aiodlock.backends import parse_url

from .helpers import running_loop_name, wait_until

pytestmark = pytest.mark.memory


def test_all_is_sorted_and_complete() -> None:
    assert aiodlock.__all__ == sorted(aiodlock.__all__)
    subpackages = {"backends", "cli", "integrations", "testing"}
    public = {n for n in dir(aiodlock) if not n.startswith("_")} - subpackages
    assert public == set(aiodlock.__all__)
    for name in aiodlock.__all__:
        obj = getattr(aiodlock, name)
        assert getattr(obj, "__module__", "aiodlock") == "aiodlock", name


def test_the_inspect_types_are_public_and_shared_with_the_backend_surface() -> None:
    # What inspect() returns is named where users look; a backend gets the very same types.
    import aiodlock.backends

    for name in ("LockInfo", "HolderInfo", "Kind", "Capability"):
        assert getattr(aiodlock, name) is getattr(aiodlock.backends, name), name
    assert aiodlock.Kind("mutex") is aiodlock.Kind.MUTEX


def test_name_template_fills_fields_and_refuses_a_missing_one() -> None:
    # The integrations and @exclusive name their locks with it, through the public path.
    template = aiodlock.NameTemplate("order:{order_id}")
    assert template.fields == frozenset({"order_id"})
    assert template.format({"order_id": 42}) == "order:42"
    assert template.missing(set()) == ["order_id"]
    with pytest.raises(KeyError, match=r"have no value for \{order_id\}"):
        template.format({})
    with pytest.raises(ValueError, match="not a plain name"):
        aiodlock.NameTemplate("order:{0}")


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
        (
            "consul://x",
            "known schemes: etcd://, memory://, mysql://, postgres://, postgresql://, redis://",
        ),
        ("nonsense", "unknown URL scheme"),
        ("redis://h:99999", "port out of range"),
        ("redis://h:abc", "bad port"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        aiodlock.connect(url)


# Each URL hides a secret (user name or password) holding a special character that is not
# percent-encoded, or is malformed elsewhere; no piece of the secret may reach a message.
NASTY_URLS = [
    ("redis://:Sc4rab#Ee1x@host:6379/0", "Sc4rab#Ee1x"),
    ("redis://:Sc4rab?Ee1x@host:6379/0", "Sc4rab?Ee1x"),
    ("redis://:Sc4rab/Ee1x@host:6379/0", "Sc4rab/Ee1x"),
    ("redis://user:4711/Ee1x@host:6379/0", "4711/Ee1x"),  # was host "user", port 4711
    ("redis://user:4711?Ee1x@host:6379/0", "4711?Ee1x"),  # was an option named "Ee1x@host..."
    ("redis://user:4711#Ee1x@host:6379/0", "4711#Ee1x"),  # was host "user", port 4711
    ("redis://Sc4rab#Ee1x:pw@host:6379/0", "Sc4rab#Ee1x"),  # the user name
    ("redis://Sc4rab/Ee1x@host:6379/0", "Sc4rab/Ee1x"),
    ("redis://:Sc4rab://Ee1x@host:6379/0", "Sc4rab://Ee1x"),
    ("redis://:Sc4rab@Ee1x@host:abc/0", "Sc4rab@Ee1x"),  # "@" kept in the password
    ("redis://:Sc4rab@Ee1x@host:/0", "Sc4rab@Ee1x"),  # no port digits
    ("redis://:Sc4rab@Ee1x@[::1/0", "Sc4rab@Ee1x"),
    ("redis://:Sc4rab@Ee1x@host:99999/0", "Sc4rab@Ee1x"),
    ("redis:Sc4rab://Ee1x@host", "Sc4rab://Ee1x"),
    ("redis//:Sc4rab#Ee1x@host", "Sc4rab#Ee1x"),
    ("mysql://app:Sc4rab/Ee1x@db:3306/shop", "Sc4rab/Ee1x"),
    ("postgresql://app:Sc4rab#Ee1x@db:5432/shop", "Sc4rab#Ee1x"),
    ("zookeeper://:Sc4rab?Ee1x@h1:2181,h2:2181/locks", "Sc4rab?Ee1x"),
    ("etcd://app:Sc4rab#Ee1x@host", "Sc4rab#Ee1x"),
]


def _pieces(secret: str) -> list[str]:
    """The secret and every run of 3+ of its letters and digits (what a split URL shows)."""
    return [secret, *(p for p in re.split(r"[^A-Za-z0-9]+", secret) if len(p) >= 3)]


def _messages(exc: BaseException) -> str:
    """``str`` and ``repr`` of ``exc`` and of every exception chained to it."""
    seen: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 20:
        seen += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return "\n".join(seen)


@pytest.mark.parametrize(("url", "secret"), NASTY_URLS)
def test_no_piece_of_the_credentials_in_any_message(url: str, secret: str) -> None:
    """Issue 12: an unencoded '#' in a password used to come back as "bad port 'Sc4rab'"."""
    try:
        parsed = parse_url(url)
    except ValueError as exc:
        _assert_hidden(secret, exc)
        with pytest.raises(ValueError, match=re.escape(str(exc))) as info:  # parsed first
            aiodlock.connect(url)
        _assert_hidden(secret, info.value)
    else:
        # Accepted only where the whole secret is the password ("@" may stay unencoded).
        assert parsed.password == secret
        assert secret not in repr(parsed) and secret not in parsed.redacted()


def _assert_hidden(secret: str, exc: BaseException) -> None:
    shown = _messages(exc)
    for piece in _pieces(secret):
        assert piece not in shown, (piece, shown)


@pytest.mark.parametrize(
    "url", ["redis://:a#b@h/0", "redis://u:1/x@h/0", "redis://:x@y@h:z/0", "redis:a://b@h"]
)
def test_malformed_url_says_to_percent_encode(url: str) -> None:
    with pytest.raises(ValueError, match="must be percent-encoded"):
        parse_url(url)


def test_percent_encoded_credentials_are_decoded() -> None:
    parsed = parse_url("redis://us%40er:a%23b%2Fc%3Fd%3Ae%40f@host:6379/0")
    assert (parsed.username, parsed.password) == ("us@er", "a#b/c?d:e@f")
    assert (parsed.hosts, parsed.path) == ((("host", 6379),), "/0")
    assert "a#b" not in repr(parsed) and "a#b" not in parsed.redacted()


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
    if argument == "timeout" and value == 0:
        assert aiodlock.connect(timeout=0).timeout == 0  # "do not wait"
        return
    with pytest.raises(ValueError, match=argument):
        aiodlock.connect(None, **{argument: value})


@pytest.mark.parametrize("ttl", [0.001, 0.019])
def test_ttl_below_the_minimum_is_refused(ttl: float) -> None:
    """A lease shorter than a few round trips would be lost at once: refused, saying why."""
    with pytest.raises(ValueError, match=r"ttl must be at least 0\.02 s"):
        aiodlock.connect(ttl=ttl)
    locks = aiodlock.connect()
    with pytest.raises(ValueError, match="at least"):
        locks.lock("x", ttl=ttl)
    assert locks.lock("x", ttl=aiodlock.MIN_TTL).ttl == aiodlock.MIN_TTL


async def test_run_exclusive_refuses_a_plain_function_before_locking() -> None:
    """A sync function used to fail with a raw TypeError from ``await``, after the lock was
    taken and the function had run. Now it is refused before either, saying what to pass."""
    calls: list[int] = []

    def report(day: int) -> int:
        calls.append(day)
        return day

    async with aiodlock.connect() as locks:
        with pytest.raises(TypeError, match=r"plain function.*asyncio\.to_thread, .*report"):
            await locks.run_exclusive("job", report, 1)  # type: ignore[arg-type]
        assert calls == []
        assert locks.lock("job").statistics().acquired == 0
        assert await locks.run_exclusive("job", asyncio.to_thread, report, 2) == 2
        assert await locks.run_exclusive("job", functools.partial(_double, 3)) == 6
        assert await locks.run_exclusive("job", lambda: _double(4)) == 8
        with pytest.raises(TypeError, match="must return an awaitable"):
            await locks.run_exclusive("job", lambda: 5)  # type: ignore[arg-type, return-value]
        assert calls == [2]


async def _double(x: int) -> int:
    return 2 * x


@pytest.mark.parametrize("value", ["10", True, [1]])
def test_duration_types(value: object) -> None:
    with pytest.raises(TypeError, match="ttl must be a number"):
        aiodlock.connect(ttl=value)


@pytest.mark.parametrize("namespace", ["", "a:b", "{x}", "a\x00"])
def test_bad_namespace(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        aiodlock.connect(namespace=namespace)


@pytest.mark.parametrize(
    ("identity", "error", "message"),
    [
        (42, TypeError, "identity must be a str, not int"),
        ("", ValueError, "identity must have 1 to 128 characters, not 0"),
        ("x" * 129, ValueError, "identity must have 1 to 128 characters, not 129"),
        ("web\n1", ValueError, "identity must be printable text"),
    ],
)
def test_bad_identity(identity: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        aiodlock.connect(identity=identity)


def test_identity_defaults_to_host_and_pid_and_comes_from_the_url_too() -> None:
    import socket

    assert aiodlock.connect().identity == f"{socket.gethostname()}:{os.getpid()}"
    assert aiodlock.connect("memory://?identity=cron%20job").identity == "cron job"
    assert aiodlock.connect("memory://?identity=a", identity="b").identity == "b"


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
        with pytest.raises(TypeError, match="fn must be an async function"):
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


async def test_runs_on_the_loop_its_id_names(request: pytest.FixtureRequest) -> None:
    """The ``[uvloop]`` item of a test really runs on uvloop, the ``[asyncio]`` one on the
    default loop (tests/conftest.py; AIODLOCK_TEST_LOOP keeps one, and then no id names it)."""
    assert isinstance(request.node, pytest.Function)
    ids = request.node.callspec.id.split("-") if hasattr(request.node, "callspec") else []
    named: list[str] = [loop for loop in ("asyncio", "uvloop") if loop in ids]
    expected = named or [os.environ["AIODLOCK_TEST_LOOP"]]
    assert [running_loop_name()] == expected


async def test_a_waiter_cancelled_from_outside_while_its_client_closes_stays_cancelled() -> None:
    """Closing interrupts a waiter with RuntimeError, unless the task was also cancelled from
    outside: that cancellation is the caller's and must propagate."""
    async with aiodlock.connect("memory://close-race") as holder:
        closing = aiodlock.connect("memory://close-race")
        await closing.__aenter__()
        async with holder.lock("x"):
            lock = closing.lock("x")
            waiter = asyncio.create_task(lock.acquire())
            await wait_until(lambda: lock.statistics().waiting == 1)
            waiter.cancel()
            await closing.aclose()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert waiter.cancelled()


async def test_the_memory_store_keeps_nothing_for_names_nobody_uses() -> None:
    """Fencing tokens keep increasing per name although the store forgets idle names."""
    async with aiodlock.connect("memory://forgetful") as locks:
        async with locks.lock("name-0") as first:
            pass
        for i in range(200):
            async with locks.lock(f"name-{i}"), locks.write_lock(f"name-{i}"):
                pass
            async with locks.semaphore(f"name-{i}", limit=3):
                pass
        assert locks.statistics().backend["entries"] == 0
        async with locks.lock("name-0") as again:
            assert again.fencing_token > first.fencing_token


def test_public_signatures_show_public_types_only() -> None:
    """help() and mypy messages show the signatures: no private name may appear in them
    (a private ``_Unset`` default marker used to)."""
    import inspect

    seen = 0
    for name in aiodlock.__all__:
        obj = getattr(aiodlock, name)
        members = [obj] if inspect.isfunction(obj) else []
        if inspect.isclass(obj):
            public = [getattr(obj, n) for n in dir(obj) if not n.startswith("_")]
            members += [m for m in public if callable(m)]
        for member in members:
            try:
                signature = str(inspect.signature(member))
            except (TypeError, ValueError):
                continue
            seen += 1
            private = re.findall(r"(?<![\w.])_[A-Za-z]\w*|\._\w+", signature)
            assert not private, f"{name}.{getattr(member, '__name__', '')}{signature}"
    assert seen > 20  # the client's and the locks' methods, connect()...
