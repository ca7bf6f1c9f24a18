"""Markers per backend, real servers, capability deselection, and the CI's no-skip rule.

Layout:

- ``tests/backends/test_<backend>.py``: one module per backend (and per variant, such as
  Redis with BLPOP wakeups), each running the shipped conformance suite
  (``from aiodlock.testing.conformance import *``) with an ``aiodlock_url`` fixture, its
  probe, and a module attribute ``aiodlock_scheme`` naming the URL scheme.
- ``tests/test_<backend>.py``: what only that backend has (faults, layout, options).
- ``tests/test_api.py``, ``tests/test_examples.py``: the public surface, URLs, validation,
  the examples, the demo and the README.

**Markers.** Every test carries the marker of the backend it needs: ``memory`` (no server, no
driver: what ``pip install -e '.[dev]' && pytest -m memory`` runs), ``redis``, ``zookeeper``,
``mysql``, ``postgres``, ``etcd``. A test without one is a collection error. A new backend
registers its marker in ``pyproject.toml`` (``[tool.pytest.ini_options] markers``, description
starting with ``backend:``, which is how this file tells backend markers from others), adds its
server fixture below (importing its driver and harness inside the fixture, never at module
level: collection must work without any driver installed), and a
``tests/backends/test_<name>.py`` with ``pytestmark = pytest.mark.<name>``.

**Capabilities.** A test of the conformance suite whose lock kind (the ``make`` parameter) or
declared needs (``requires(...)`` in the suite, or a ``@pytest.mark.requires(...)`` marker
here) ask for a capability that the module's backend (``aiodlock_scheme``) does not declare
is *deselected* at collection, never skipped; so are the suite's process tests on an
in-process backend. The suite's own ``test_undeclared_kinds_fail_at_construction`` checks
that each undeclared kind fails with ``UnsupportedError``, so deselection cannot hide a
missing feature.

**No silent skips.** A server that cannot start is an error, never a skip. With
``--require-all-backends`` (CI and the README's test command) a skipped test is a failure too.

**Loops.** Every async test runs under the default asyncio loop and under uvloop, as two items
of one session (ids ``[asyncio]`` and ``[uvloop]``); ``AIODLOCK_TEST_LOOP=asyncio`` or
``uvloop`` keeps one of them. With pytest-xdist (``-n``) each worker is a session of its own
and starts its own servers, on free ports, when a test first asks for them.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import functools
import os
import re
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

# The harness starts servers with fork + exec (a preexec_fn ties each to its worker's life).
# gRPC's fork handlers (grpcio, under the etcd client) run in such a child between the two and,
# when the parent's gRPC threads are busy, can abort it before exec ("epoll_wait error: Bad
# file descriptor", exit -6). No test forks a process that goes on using gRPC: turn them off,
# before anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

pytest.register_assert_rewrite(
    "aiodlock.testing.conformance",
    "tests.helpers",
    "tests.support_memory",
    "tests.support_mysql",
    "tests.support_postgres",
    "tests.support_redis",
    "tests.support_redis_cluster",
    "tests.support_redlock",
    "tests.support_zookeeper",
    "tests.support_etcd",
)

# ruff: noqa: E402 - the modules above must be registered for assertion rewriting first
from aiodlock.backends import parse_url
from aiodlock.testing.conformance import unmet_needs

if TYPE_CHECKING:
    from tests.servers import RedisServer, TLSFiles
    from tests.support_etcd import EtcdCluster, EtcdServer
    from tests.support_mysql import MariaDBServer
    from tests.support_pgbouncer import PgBouncerServer
    from tests.support_postgres import PostgresServer
    from tests.support_redis_cluster import ClusterDeployment
    from tests.support_redlock import RedlockMasters
    from tests.support_sentinel import SentinelDeployment
    from tests.support_zookeeper import ZooKeeperEnsemble, ZooKeeperServer

_BACKEND_MARKER = re.compile(r"^(?P<name>\w+):\s*backend\b")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-all-backends",
        action="store_true",
        help="fail (not skip) when a backend cannot be tested: the CI setting",
    )


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every async test runs once per loop, ``[asyncio]`` and ``[uvloop]``, in one session.

    Both in one session lets pytest-xdist spread them over its workers side by side, on one
    set of servers per worker. ``AIODLOCK_TEST_LOOP=asyncio`` (or ``uvloop``) keeps one.
    """
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": _asyncio_loop_that_reports_unclosed_transports(),
        "uvloop": _uvloop_that_reports_unclosed_transports(),
    }
    chosen = os.environ.get("AIODLOCK_TEST_LOOP", "")
    if not chosen:
        return factories
    if chosen not in factories:
        raise pytest.UsageError(
            f"AIODLOCK_TEST_LOOP must be asyncio or uvloop (or unset: both), not {chosen!r}"
        )
    return {chosen: factories[chosen]}


@functools.cache  # asked once per test: one class for the run
def _asyncio_loop_that_reports_unclosed_transports() -> Callable[[], asyncio.AbstractEventLoop]:
    """The default loop, closing as ``asyncio.run`` would and reporting leaks as uvloop does.

    A transport whose ``close()`` ran in the test's last loop step closes its socket only in
    the next step (``connection_lost``), and a TLS one only once the peer answered its
    close_notify: closed with the loop right then, the socket stays open until the garbage
    collector reports it (``ResourceWarning``, unraisable) in whichever test happens to run
    then -- maybe on another loop, minutes later. So ``close()`` first ends every such
    transport and gives the loop the step that closes their sockets; and a transport nobody
    closed at all is a leak, reported then: it fails the test that opened it (at teardown,
    ``filterwarnings = error``), not a later one.
    """

    class Loop(asyncio.SelectorEventLoop):
        def close(self) -> None:
            leaked = []
            if not self.is_closed() and not self.is_running():
                # The selector loop's registry of its transports, by file descriptor; a
                # transport's socket is gone (None) once its connection_lost has run.
                registry = getattr(self, "_transports", {})
                live = [t for t in list(registry.values()) if getattr(t, "_sock", None)]
                leaked = [t for t in live if not _closing(t)]
                for transport in live:
                    transport.abort()
                if live:
                    self.run_until_complete(asyncio.sleep(0))  # their connection_lost
            super().close()
            for transport in leaked:
                warnings.warn(
                    f"unclosed transport {transport!r} when its event loop closed",
                    ResourceWarning,
                    stacklevel=2,
                )

    return Loop


def _closing(transport: asyncio.BaseTransport) -> bool:
    """Whether someone closed ``transport``, at its own layer or at the TLS layer above it.

    ``close()`` on a TLS connection closes the TLS transport and sends close_notify; the
    socket transport beneath stays open (``is_closing()`` false) until the peer answers, so
    it is closed, not leaked, when its TLS transport is.
    """
    if transport.is_closing():
        return True
    protocol = transport.get_protocol()
    tls = getattr(protocol, "_app_transport", None)  # asyncio.sslproto.SSLProtocol's
    return isinstance(protocol, asyncio.sslproto.SSLProtocol) and (tls is None or tls.is_closing())


@functools.cache  # asked once per test: one class for the run
def _uvloop_that_reports_unclosed_transports() -> Callable[[], asyncio.AbstractEventLoop]:
    """A uvloop whose ``close()`` cannot hang on a leaked transport.

    uvloop's ``close()`` warns (``ResourceWarning``) about each transport still open, from a
    libuv callback that cannot raise; with warnings as errors (``filterwarnings = error``) the
    warning aborts that handle's close, and ``close()`` then waits for the handle forever. The
    warnings are collected while it closes and raised once it has: a leak still fails the
    test (at teardown), and the run goes on.
    """
    import uvloop

    class Loop(uvloop.Loop):
        def close(self) -> None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ResourceWarning)
                super().close()
            for leak in caught:
                warnings.warn_explicit(leak.message, leak.category, leak.filename, leak.lineno)

    return Loop


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and item.config.getoption("--require-all-backends"):
        report.outcome = "failed"
        report.longrepr = f"skipped under --require-all-backends: {report.longrepr}"
    return report


def backend_markers(config: pytest.Config) -> list[str]:
    """The registered markers whose description starts with ``backend:``."""
    lines: list[str] = config.getini("markers")
    return [m["name"] for line in lines if (m := _BACKEND_MARKER.match(line))]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    """Refuse a test without a backend marker; deselect (never skip) what a backend lacks.

    The marker check runs before ``-m`` deselects anything. The deselection runs after:
    reading a backend's capabilities imports its driver, which ``pytest -m memory`` must never
    need. Where the driver is missing the items stay, and fail when they run, saying which
    extra to install.
    """
    markers = backend_markers(config)
    unmarked = [
        item.nodeid for item in items if not any(item.get_closest_marker(m) for m in markers)
    ]
    if unmarked:
        raise pytest.UsageError(
            f"tests without a backend marker ({', '.join(markers)}): "
            + ", ".join(unmarked[:10])
            + (f" and {len(unmarked) - 10} more" if len(unmarked) > 10 else "")
        )
    yield  # -m and -k deselect here
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        scheme = getattr(getattr(item, "module", None), "aiodlock_scheme", None)
        try:
            unmet = scheme is not None and unmet_needs(item, scheme) is not None
        except ImportError:
            unmet = False
        (dropped if unmet else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"aiodlock backend markers: {', '.join(backend_markers(config))}; "
        f"loops: {os.environ.get('AIODLOCK_TEST_LOOP') or 'asyncio, uvloop'}"
    )


@pytest.fixture(autouse=True)
def _url_matches_module_scheme(request: pytest.FixtureRequest) -> None:
    """A backend module's ``aiodlock_scheme`` (read at collection) is its URL's scheme."""
    scheme = getattr(request.module, "aiodlock_scheme", None)
    if scheme is not None and "aiodlock_url" in request.fixturenames:
        url = request.getfixturevalue("aiodlock_url")
        assert parse_url(url).scheme == scheme, f"aiodlock_scheme = {scheme!r} but {url=}"


# ---------------------------------------------------------------------- servers
# Each imports its harness (and so its driver) when first used, never at collection.


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One throwaway redis-server for the session (tests use unique namespaces)."""
    from tests.servers import RedisServer

    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelDeployment]:
    """A master, its replica and three sentinels for the session (no failover on these: the
    failover tests make their own)."""
    from tests.support_sentinel import SentinelDeployment

    with SentinelDeployment() as deployment:
        yield deployment


@pytest.fixture(scope="session")
def redlock_masters() -> Iterator[RedlockMasters]:
    """Three independent redis-server masters for the session (a fault test heals them)."""
    from tests.support_redlock import RedlockMasters

    with RedlockMasters(3) as masters:
        yield masters


@pytest.fixture(scope="session")
def redlock_masters5() -> Iterator[RedlockMasters]:
    """Five independent masters, started only for the tests that ask for them."""
    from tests.support_redlock import RedlockMasters

    with RedlockMasters(5) as masters:
        yield masters


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterDeployment]:
    """Three masters with a replica each, for the session (no faults on this one: the fault
    tests make their own)."""
    from tests.support_redis_cluster import ClusterDeployment

    with ClusterDeployment() as deployment:
        yield deployment


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """One standalone ZooKeeper for the session (tests use unique namespaces)."""
    from tests.support_zookeeper import ZooKeeperServer

    with ZooKeeperServer() as server:
        yield server


@pytest.fixture(scope="session")
def zookeeper_ensemble() -> Iterator[ZooKeeperEnsemble]:
    """A three-server quorum, started only for the tests that ask for it."""
    from tests.support_zookeeper import ZooKeeperEnsemble

    with ZooKeeperEnsemble() as ensemble:
        yield ensemble


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDBServer]:
    """One throw-away MariaDB for the session (tests use unique namespaces)."""
    from tests.support_mysql import MariaDBServer

    with MariaDBServer() as server:
        yield server


@pytest.fixture(scope="session")
def mysql_url(mariadb_server: MariaDBServer) -> str:
    return mariadb_server.url


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throw-away PostgreSQL for the session (tests use unique namespaces)."""
    from tests.support_postgres import PostgresServer

    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    return postgres_server.url


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A CA, a server certificate for the IP address 127.0.0.1 only (not "localhost", so
    that host-name checking shows), and a client certificate."""
    import trustme

    from tests.servers import TLSFiles

    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("client@aiodlock.test")
    files = TLSFiles(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client=directory / "client.pem",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    server.cert_chain_pems[0].write_to_path(str(files.server_cert))
    server.private_key_pem.write_to_path(str(files.server_key))
    client.private_key_and_cert_chain_pem.write_to_path(str(files.client))
    # The same client certificate as two files, for ssl_certfile + ssl_keyfile.
    client.cert_chain_pems[0].write_to_path(str(directory / "client-cert.pem"))
    client.private_key_pem.write_to_path(str(directory / "client-key.pem"))
    return files


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One single-member etcd for the session (tests use unique namespaces)."""
    from tests.support_etcd import EtcdServer

    with EtcdServer() as server:
        yield server


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A three-member etcd cluster, started only for the tests that ask for it."""
    from tests.support_etcd import EtcdCluster

    with EtcdCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pgbouncer_transaction(postgres_server: PostgresServer) -> Iterator[PgBouncerServer]:
    """PgBouncer in transaction pooling mode in front of the session's PostgreSQL."""
    from tests.support_pgbouncer import PgBouncerServer

    with PgBouncerServer(postgres_server, pool_mode="transaction") as server:
        yield server


@pytest.fixture(scope="session")
def pgbouncer_session(postgres_server: PostgresServer) -> Iterator[PgBouncerServer]:
    """PgBouncer in session pooling mode in front of the session's PostgreSQL, with a server
    session for each client PgBouncer admits (``max_client_conn``, 100): with a smaller pool,
    a connection beyond it waits in PgBouncer's queue until another client leaves, and a lock
    wait that needs a new connection times out there (the suite's contention tests did, at 5)."""
    from tests.support_pgbouncer import PgBouncerServer

    with PgBouncerServer(postgres_server, pool_mode="session", default_pool_size=100) as server:
        yield server
