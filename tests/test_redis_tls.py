"""Redis over TLS (``rediss://`` and its ``ssl_*`` options) and ``redis_client=``: a client
of the application's, whose pool aiodlock borrows and never closes.

The TLS servers are real ``redis-server`` processes started with ``--tls-port`` (and
``--port 0``: TLS only), with a CA and certificates made here by trustme. A redis-server
built without TLS fails these tests; they are never skipped.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

import aiodlock
from tests.helpers import wait_until
from tests.servers import RedisTLSServer, TLSFiles

if TYPE_CHECKING:
    import redis.asyncio as aioredis

pytestmark = pytest.mark.redis


# ---------------------------------------------------------------------- certificates, servers


@pytest.fixture(scope="module")
def tls_server(tls_files: TLSFiles) -> Iterator[RedisTLSServer]:
    """TLS only; a client certificate is checked if one is presented."""
    with RedisTLSServer(tls_files, auth_clients="optional") as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(tls_files: TLSFiles) -> Iterator[RedisTLSServer]:
    """TLS only, and every client must present a certificate signed by the CA."""
    with RedisTLSServer(tls_files, auth_clients="yes") as server:
        yield server


def with_ca(url: str, files: TLSFiles) -> str:
    return f"{url}?ssl_ca_certs={files.ca}"


async def round_trip(url: str, **options: Any) -> None:
    """A lock taken, waited for (woken by the release), and taken again over ``url``."""
    async with (
        aiodlock.connect(url, namespace="tls", connect_timeout=5, **options) as a,
        aiodlock.connect(url, namespace="tls", connect_timeout=5, **options) as b,
    ):
        first = await a.lock("k", ttl=30).acquire()
        lock = b.lock("k", ttl=30)
        waiting = asyncio.create_task(lock.acquire(timeout=10))
        await wait_until(lambda: lock.statistics().waiting == 1)  # refused: the release wakes it
        assert not waiting.done()
        await first.release()
        second = await waiting  # woken by the release, not by the 30 s expiry
        assert second.fencing_token > first.fencing_token
        await second.release()


async def refused(url: str, **options: Any) -> aiodlock.BackendError:
    """The BackendError that opening a client on ``url`` raises, well within its bounds."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(aiodlock.BackendError) as info:
        async with asyncio.timeout(10):  # a hang fails here, as a TimeoutError
            async with aiodlock.connect(url, connect_timeout=5, **options):
                pass
    assert loop.time() - started < 4.5, "a failed handshake must not wait for the timeout"
    return info.value


def chain(exc: BaseException) -> list[BaseException]:
    found = []
    current: BaseException | None = exc
    while current is not None:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


# ---------------------------------------------------------------------- TLS


@pytest.mark.parametrize("wakeup", ["pubsub", "blpop"])
async def test_lock_round_trip_over_tls(
    tls_server: RedisTLSServer, tls_files: TLSFiles, wakeup: str
) -> None:
    """The CA as a URL query parameter; waiters are woken over TLS side connections too."""
    await round_trip(with_ca(tls_server.url, tls_files), wakeup=wakeup)


async def test_tls_options_as_keywords(tls_server: RedisTLSServer, tls_files: TLSFiles) -> None:
    await round_trip(tls_server.url, ssl_ca_certs=tls_files.ca, ssl_cert_reqs="required")


async def test_without_the_ca_the_server_is_refused(tls_server: RedisTLSServer) -> None:
    """The server's certificate is checked against the system's CAs, which do not know ours:
    a BackendError at once, not a hang and not a bare ssl error."""
    error = await refused(tls_server.url)
    assert "certificate verify failed" in str(error)
    assert any(isinstance(e, ssl.SSLCertVerificationError) for e in chain(error))


async def test_without_certificate_checks_it_connects(tls_server: RedisTLSServer) -> None:
    """``ssl_cert_reqs=none``: encrypted, but anyone's certificate is accepted."""
    await round_trip(f"{tls_server.url}?ssl_cert_reqs=none")


async def test_host_name_is_checked_unless_turned_off(
    tls_server: RedisTLSServer, tls_files: TLSFiles
) -> None:
    """The certificate names 127.0.0.1 only; redis-py before 6 did not check host names."""
    url = with_ca(f"rediss://localhost:{tls_server.port}/0", tls_files)
    error = await refused(url)
    mismatch = [e for e in chain(error) if isinstance(e, ssl.SSLCertVerificationError)]
    assert mismatch and "'localhost'" in str(mismatch[0]), chain(error)
    await round_trip(f"{url}&ssl_check_hostname=false")


async def test_client_certificate_when_the_server_requires_one(
    mtls_server: RedisTLSServer, tls_files: TLSFiles
) -> None:
    url = with_ca(mtls_server.url, tls_files)
    await refused(url)  # no client certificate: the server hangs up
    await round_trip(f"{url}&ssl_certfile={tls_files.client}")  # certificate and key in one
    directory = tls_files.client.parent
    await round_trip(
        url,
        ssl_certfile=directory / "client-cert.pem",
        ssl_keyfile=str(directory / "client-key.pem"),
    )


async def test_the_shared_tls_option_names(
    tls_server: RedisTLSServer, mtls_server: RedisTLSServer, tls_files: TLSFiles
) -> None:
    """``tls_ca``, ``tls_cert`` and ``tls_key`` (the names every backend shares) do what
    redis-py's ``ssl_ca_certs``, ``ssl_certfile`` and ``ssl_keyfile`` do."""
    await round_trip(f"{tls_server.url}?tls_ca={tls_files.ca}")
    await round_trip(tls_server.url, tls_ca=str(tls_files.ca), request_timeout=2)
    url = f"{mtls_server.url}?tls_ca={tls_files.ca}"
    await refused(url)  # no client certificate: the server hangs up
    await round_trip(f"{url}&tls_cert={tls_files.client}")
    directory = tls_files.client.parent
    await round_trip(
        url, tls_cert=directory / "client-cert.pem", tls_key=str(directory / "client-key.pem")
    )


async def test_tls_verify_false_checks_neither_certificate_nor_host(
    tls_server: RedisTLSServer, tls_files: TLSFiles
) -> None:
    """``tls_verify=false``: encrypted, no CA needed, and a host name the certificate does
    not carry is accepted (it checks what ``ssl_cert_reqs=none`` turns off)."""
    await round_trip(f"{tls_server.url}?tls_verify=false")
    await round_trip(f"rediss://localhost:{tls_server.port}/0", tls_verify=False)
    error = await refused(f"rediss://localhost:{tls_server.port}/0?tls_verify=true")
    assert any(isinstance(e, ssl.SSLCertVerificationError) for e in chain(error))


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("rediss://h:1/0?tls_ca=/a.pem", {"ssl_ca_certs": "/a.pem"}, "two names of one option"),
        ("rediss://h:1/0", {"socket_timeout": 1, "request_timeout": 1}, "two names of one"),
        ("rediss://h:1/0", {"tls_verify": False, "ssl_cert_reqs": "none"}, "overlap"),
        ("rediss://h:1/0", {"tls_key": __file__}, "tls_key needs tls_cert"),
        ("rediss://h:1/0", {"tls_ca": "/nonexistent/ca.pem"}, "option tls_ca: no such file"),
        ("redis://127.0.0.1:1/0?tls_ca=/ca.pem", {}, "tls_ca is for TLS"),
        (
            "redis+cluster://h:1",
            {"tls_ca": "/ca.pem"},
            "tls_ca is not supported on redis\\+cluster",
        ),
        ("redis+sentinel://h:1/svc", {"tls_verify": True}, "tls_verify is not supported"),
    ],
)
def test_the_shared_names_in_messages(url: str, options: dict[str, Any], message: str) -> None:
    """A wrong option is named as it was given; one option under two names is refused."""
    with pytest.raises((ValueError, TypeError), match=message):
        aiodlock.connect(url, **options)


def test_request_timeout_bounds_each_command() -> None:
    """``request_timeout`` is the canonical name of ``socket_timeout``."""
    for name in ("request_timeout", "socket_timeout"):
        client = aiodlock.connect("redis://127.0.0.1:1/0", **{name: 0.25})
        assert client.backend._source.request_timeout == 0.25  # type: ignore[attr-defined]
    client = aiodlock.connect("redis://127.0.0.1:1/0?request_timeout=0.5")
    assert client.backend._source.request_timeout == 0.5  # type: ignore[attr-defined]


async def test_a_bad_certificate_file_is_a_backend_error(
    tls_server: RedisTLSServer, tls_files: TLSFiles
) -> None:
    """A file that is not a certificate fails when the connection is made; one that does
    not exist fails at once (below, test_bad_tls_options)."""
    error = await refused(tls_server.url, ssl_ca_certs=tls_files.server_key)
    assert any(isinstance(e, ssl.SSLError) for e in chain(error)), chain(error)


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("redis://127.0.0.1:1/0?ssl_ca_certs=/ca.pem", {}),
        ("redis://127.0.0.1:1/0", {"ssl_cert_reqs": "none"}),
        ("redis://127.0.0.1:1/0?ssl_check_hostname=false", {}),
        ("unix:///run/redis.sock?ssl_certfile=/c.pem", {}),
    ],
)
def test_tls_options_need_rediss(url: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"is for TLS, which needs a rediss:// url"):
        aiodlock.connect(url, **options)


@pytest.mark.parametrize(
    ("url", "options", "error", "message"),
    [
        ("rediss://h:1/0?ssl_cert_reqs=maybe", {}, ValueError, "ssl_cert_reqs must be one of"),
        ("rediss://h:1/0?ssl_check_hostname=maybe", {}, ValueError, "must be a boolean"),
        ("rediss://h:1/0", {"ssl_check_hostname": "no"}, TypeError, "must be a bool"),
        ("rediss://h:1/0", {"ssl_ca_certs": 42}, TypeError, "must be a file path"),
        ("rediss://h:1/0?ssl_keyfile=/k.pem&ssl_certfile=/c.pem", {}, ValueError, "no such"),
        ("rediss://h:1/0", {"ssl_keyfile": __file__}, ValueError, "needs ssl_certfile"),
        ("rediss://h:1/0?ssl_ca_certs=/nonexistent/ca.pem", {}, ValueError, "no such file"),
        ("rediss://h:1/0?ssl_ca_cert=/ca.pem", {}, TypeError, "unknown URL query parameter"),
        ("rediss://h:1/0", {"ssl_password": "x"}, TypeError, "unknown option 'ssl_password'"),
    ],
)
def test_bad_tls_options(
    url: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        aiodlock.connect(url, **options)


# ---------------------------------------------------------------------- redis_client=


@pytest.fixture
async def app_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """The application's own client, set up as applications do (RESP3, decoded replies),
    with connections named so that the server shows whose pool they came from."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(
        redis_url, protocol=3, decode_responses=True, client_name="app-pool"
    )
    try:
        yield client
    finally:
        await client.aclose()


async def connection_names(redis_url: str) -> list[str]:
    import redis.asyncio as aioredis

    async with aioredis.Redis.from_url(redis_url, client_name="probe") as probe:
        return [str(c.get("name", "")) for c in await probe.client_list()]


@pytest.mark.parametrize("wakeup", ["pubsub", "blpop"])
async def test_redis_client_is_used_and_left_open(
    redis_url: str, app_client: aioredis.Redis, wakeup: str
) -> None:
    assert "app-pool" not in await connection_names(redis_url)  # the pool is still empty
    async with (
        aiodlock.connect("redis://", redis_client=app_client, wakeup=wakeup) as a,
        aiodlock.connect("redis://", redis_client=app_client, wakeup=wakeup) as b,
    ):
        assert "redis://127.0.0.1" in repr(a)
        first = await a.lock("k", ttl=30).acquire()
        lock = b.lock("k", ttl=30)
        waiting = asyncio.create_task(lock.acquire(timeout=10))
        await wait_until(lambda: lock.statistics().waiting == 1)  # refused: the release wakes it
        await first.release()
        second = await waiting  # woken by the release: side connections work
        assert second.fencing_token > first.fencing_token
        names = await connection_names(redis_url)
        assert "app-pool" in names  # the commands went through the application's pool
        await second.release()
    # Closing aiodlock left the application's client and pool open and usable.
    assert "app-pool" in await connection_names(redis_url)
    await app_client.set("tls-test:after", "still here")
    assert await app_client.get("tls-test:after") == "still here"


async def test_redis_client_over_tls(tls_server: RedisTLSServer, tls_files: TLSFiles) -> None:
    """Side connections made from a TLS pool's settings speak TLS as well."""
    import redis.asyncio as aioredis

    async with aioredis.Redis(
        host=tls_server.host, port=tls_server.port, ssl=True, ssl_ca_certs=str(tls_files.ca)
    ) as app:
        await round_trip("rediss://", redis_client=app)
        # The application's client is left open and still answers over TLS.
        await app.set("tls-test:app-after", "still here")
        assert await app.get("tls-test:app-after") == b"still here"


async def test_an_unreachable_redis_client_is_a_backend_error_without_the_password() -> None:
    import redis.asyncio as aioredis

    from tests.servers import free_port

    app = aioredis.Redis(host="127.0.0.1", port=free_port(), password="hunter2")
    with pytest.raises(aiodlock.BackendError) as info:
        async with aiodlock.connect("redis://", redis_client=app, connect_timeout=1):
            pass
    assert "hunter2" not in str(info.value) and "127.0.0.1" in str(info.value)
    await app.aclose()


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("redis://127.0.0.1:6379/0", {}, "comes with its own server"),
        ("redis://:hunter2@", {}, "comes with its own server"),
        ("redis:///3", {}, "comes with its own server"),
        ("unix:///run/redis.sock", {}, "comes with its own server"),
        ("redis://", {"db": 1}, "db cannot be combined with redis_client"),
        ("redis://?db=1", {}, "db cannot be combined with redis_client"),
        ("rediss://", {"ssl_ca_certs": "/ca.pem"}, "ssl_ca_certs cannot be combined"),
    ],
)
async def test_redis_client_with_connection_settings_is_refused(
    app_client: aioredis.Redis, url: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        aiodlock.connect(url, redis_client=app_client, **options)
    assert "hunter2" not in str(info.value)


def test_redis_client_must_be_an_asyncio_redis(redis_url: str) -> None:
    import redis

    message = r"redis_client must be a redis\.asyncio\.Redis"
    with redis.Redis.from_url(redis_url) as blocking:  # the synchronous client: not ours
        for wrong in (object(), blocking, "redis://127.0.0.1"):
            with pytest.raises(TypeError, match=message):
                aiodlock.connect("redis://", redis_client=wrong)
    with pytest.raises(TypeError, match=message):
        aiodlock.connect("redis://?redis_client=mine")
