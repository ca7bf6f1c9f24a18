"""ZooKeeper over TLS (issue 37), against a ZooKeeper whose secure client port requires a
client certificate (tests/support_zookeeper.py, ``ZooKeeperTLSServer``; a CA and certificates
made by trustme at test time): a lock that works there went over TLS, the ``srvr`` probe and
the session alike. Also: a few conformance tests over TLS, a certificate from another CA, a
host name the certificate does not name, a missing client certificate, a plain client at the
secure port and a TLS client at the plain port, each refused within ``connect_timeout`` with
a message that says why; and TLS options checked when the client is made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_asyncio

import aiodlock
from aiodlock.testing.conformance import (  # the suite's fixtures and a few of its tests
    aiodlock_namespace as aiodlock_namespace,
    aiodlock_requirements as aiodlock_requirements,
    aiodlock_target as aiodlock_target,
    locks as locks,
    make as make,
    other as other,
    pytest_plugins as pytest_plugins,
    test_cancel_at_each_await_point_leaves_nothing as test_cancel_at_each_await_point_leaves_nothing,  # noqa: E501
    test_every_backend_fences_and_wakes as test_every_backend_fences_and_wakes,
    test_exclusion_read_sleep_write as test_exclusion_read_sleep_write,
    test_readers_share_writers_exclude as test_readers_share_writers_exclude,
    test_release_wakes_waiter_without_waiting_out_the_lease as test_release_wakes_waiter_without_waiting_out_the_lease,  # noqa: E501
    test_semaphore_limit as test_semaphore_limit,
    test_try_acquire as test_try_acquire,
)
from tests.servers import TLSFiles
from tests.support_zookeeper import ZooKeeperProbe, ZooKeeperTLSServer

pytestmark = pytest.mark.zookeeper
aiodlock_scheme = "zookeeper"  # read by tests/conftest.py at collection (capability deselection)

ROOT = "/tls"
CONNECT_TIMEOUT = 2.0
REFUSAL_SLACK = 1.0
"""A refused client gives up within connect_timeout; the rest is closing, on a loaded machine."""
AT_ONCE = 0.5
"""A refusal retrying cannot cure (a certificate not trusted, a TLS alert) ends the connect
without waiting for connect_timeout: one round over the endpoints (milliseconds here), plus a
loaded machine's slack."""


@pytest.fixture(scope="module")
def zookeeper_tls(tls_files: TLSFiles) -> Iterator[ZooKeeperTLSServer]:
    with ZooKeeperTLSServer(tls_files, client_auth="need") as server:
        yield server


def _tls(files: TLSFiles) -> str:
    return f"tls_ca={files.ca}&tls_cert={files.client}"


@pytest.fixture
def aiodlock_url(zookeeper_tls: ZooKeeperTLSServer, tls_files: TLSFiles) -> str:
    return f"{zookeeper_tls.tls_url}{ROOT}?session_timeout=3&{_tls(tls_files)}"


@pytest_asyncio.fixture
async def aiodlock_probe(zookeeper_tls: ZooKeeperTLSServer) -> ZooKeeperProbe:
    # The probe looks through the plain port: the same tree, another client library.
    return await ZooKeeperProbe(f"{zookeeper_tls.host}:{zookeeper_tls.port}", ROOT).start()


async def _round_trip(url: str, **options: object) -> list[int]:
    """A lock taken, waited for by a second client (woken by the release), taken again."""
    async with aiodlock.connect(url, **options) as a, aiodlock.connect(url, **options) as b:
        async with a.lock("tls") as first:
            waiter = asyncio.create_task(b.lock("tls", timeout=10).acquire())
            await asyncio.sleep(0)
            assert not waiter.done()
        second = await waiter
        await second.release()
        return [first.fencing_token, second.fencing_token]


async def test_locks_work_over_tls(zookeeper_tls: ZooKeeperTLSServer, tls_files: TLSFiles) -> None:
    first, second = await _round_trip(f"{zookeeper_tls.tls_url}{ROOT}?{_tls(tls_files)}")
    assert second > first
    # The key apart from the certificate, in MySQL's spellings.
    directory = tls_files.ca.parent
    first, second = await _round_trip(
        f"{zookeeper_tls.tls_url}{ROOT}",
        ssl_ca=str(tls_files.ca),
        ssl_cert=str(directory / "client-cert.pem"),
        ssl_key=str(directory / "client-key.pem"),
    )
    assert second > first


async def _refused(
    url: str, match: str, *, within: float = CONNECT_TIMEOUT + REFUSAL_SLACK, **options: object
) -> str:
    """Connect, expecting a BackendError matching ``match`` within ``within`` seconds."""
    started = time.monotonic()
    with pytest.raises(aiodlock.BackendError, match=match) as info:
        async with aiodlock.connect(url, connect_timeout=CONNECT_TIMEOUT, **options):
            pass
    assert time.monotonic() - started < within
    return str(info.value)


@pytest.mark.parametrize("trust", ["other CA", "system CAs"])
async def test_a_server_certificate_not_trusted_is_refused(
    zookeeper_tls: ZooKeeperTLSServer, tls_files: TLSFiles, tmp_path: Path, trust: str
) -> None:
    import trustme

    if trust == "other CA":
        other_ca = tmp_path / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(other_ca))
        options: dict[str, object] = {"tls_ca": str(other_ca)}
    else:
        options = {"tls": True}
    await _refused(
        zookeeper_tls.tls_url,
        r"127\.0\.0\.1:\d+: TLS: the server's certificate is not trusted "
        r"\(.*certificate.*\): check tls_ca",
        within=AT_ONCE,
        tls_cert=str(tls_files.client),
        **options,
    )


async def test_the_host_name_is_checked_unless_told_not_to(
    zookeeper_tls: ZooKeeperTLSServer, tls_files: TLSFiles
) -> None:
    """The certificate names 127.0.0.1, not localhost."""
    url = f"zookeeper://localhost:{zookeeper_tls.secure_port}{ROOT}?{_tls(tls_files)}"
    await _refused(
        url, r"TLS: the server's certificate is not trusted \(.*match.*localhost", within=AT_ONCE
    )
    first, second = await _round_trip(url + "&ssl_check_hostname=false")
    assert second > first


async def test_a_client_without_a_certificate_is_refused(
    zookeeper_tls: ZooKeeperTLSServer, tls_files: TLSFiles
) -> None:
    """The server requires one (``ssl.clientAuth=need``)."""
    await _refused(
        zookeeper_tls.tls_url,
        r"127\.0\.0\.1:\d+: TLS handshake failed \(.*\): .*client certificate \(tls_cert\)",
        within=AT_ONCE,
        tls_ca=str(tls_files.ca),
    )


async def test_a_plain_client_at_the_secure_port_is_refused(
    zookeeper_tls: ZooKeeperTLSServer,
) -> None:
    await _refused(
        zookeeper_tls.tls_url,
        r"closed the connection without answering: if it is a secureClientPort, give the "
        r"TLS options",
    )


async def test_a_tls_client_at_the_plain_port_is_refused(
    zookeeper_tls: ZooKeeperTLSServer, tls_files: TLSFiles
) -> None:
    """The plain port serves (the probe uses it), but not TLS."""
    plain = f"zookeeper://{zookeeper_tls.host}:{zookeeper_tls.port}"
    async with aiodlock.connect(plain) as client:
        assert await client.lock("plain").try_acquire() is not None
    await _refused(f"{plain}?{_tls(tls_files)}", r"TLS handshake failed")


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"ssl": False, "ssl_ca": "/ca.pem"}, ValueError, "contradicts ssl_ca"),
        ({"tls": False, "tls_verify": True}, ValueError, "contradicts tls_verify"),
        ({"tls_key": "/k.pem"}, ValueError, "tls_key needs tls_cert"),
        ({"tls_ca": "/nonexistent/ca.pem"}, ValueError, "tls_ca='/nonexistent/ca.pem'"),
        ({"ssl_cert": "/nonexistent/c.pem"}, ValueError, "ssl_cert='/nonexistent/c.pem'"),
        ({"tls_ca": 3}, TypeError, "tls_ca must be"),
        ({"ssl_ca_certs": "/ca.pem"}, TypeError, "unknown option 'ssl_ca_certs'.*ssl_ca,"),
    ],
)
def test_bad_tls_options_are_refused_when_the_client_is_made(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        aiodlock.connect("zookeeper://127.0.0.1:2281/locks", **options)
    aiodlock.connect("zookeeper://127.0.0.1:2281/locks?ssl=false")  # asks for nothing: fine
