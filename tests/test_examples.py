"""The examples, the demo, the CLI and the README's code all run and show what they claim.

Every example runs as a subprocess of ``sys.executable`` (with ``-W error``), the way a user
runs it, on ``memory://`` and on a throwaway Redis (the ``redis_url`` fixture). The FastAPI app
is also driven in-process through ``httpx.ASGITransport``, lifespan included. Every
``python`` block of README.md and of the documentation pages carved from it (quick start,
tutorial, semantics...) that starts with an ``import`` line is a complete program and is run
too, so neither the README nor the site can rot.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

import aiodlock
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
README = ROOT / "README.md"
# The README keeps one example; the rest of its snippets live in these pages of the site.
SITE_PAGES = ("quickstart", "tutorial", "helpers", "semantics", "backends", "development")
SNIPPET_PAGES = (README, *(ROOT / "docs" / f"{page}.md" for page in SITE_PAGES))
TIMEOUT = 90.0


def run(*args: str, url: str = "memory://") -> subprocess.CompletedProcess[str]:
    """Run ``python -W error ARGS`` from the repository root with ``AIODLOCK_URL=url``."""
    env = {**os.environ, "AIODLOCK_URL": url, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-W", "error", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def succeeded(result: subprocess.CompletedProcess[str]) -> str:
    """Assert exit status 0 (showing both streams if not); return stdout."""
    assert result.returncode == 0, (
        f"exit status {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result.stdout


# ---------------------------------------------------------------------- the oversell demo


@dataclass(frozen=True)
class DemoRow:
    buyers: int
    sold: int
    final_stock: int
    oversold_by: int
    elapsed: float


ROW = re.compile(
    r"^(?P<mode>no lock|with lock)\s+(?P<buyers>\d+)\s+(?P<sold>\d+)\s+(?P<final>-?\d+)\s+"
    r"(?P<oversold>\d+)\s+(?P<elapsed>[\d.]+) s$",
    re.MULTILINE,
)


def demo_rows(stdout: str) -> dict[str, DemoRow]:
    rows = {
        m["mode"]: DemoRow(
            int(m["buyers"]),
            int(m["sold"]),
            int(m["final"]),
            int(m["oversold"]),
            float(m["elapsed"]),
        )
        for m in ROW.finditer(stdout)
    }
    assert set(rows) == {"no lock", "with lock"}, f"no result table in:\n{stdout}"
    return rows


def check_demo(stdout: str, *, buyers: int, stock: int) -> None:
    """The unlocked run oversold (buyers > stock), the locked one is exact, fencing refused."""
    rows = demo_rows(stdout)
    unlocked, locked = rows["no lock"], rows["with lock"]
    assert unlocked.buyers == locked.buyers == buyers
    # Every buyer reads, then sleeps, before any buyer writes: all of them sell.
    assert unlocked.sold > stock
    assert unlocked.oversold_by == unlocked.sold - stock > 0
    assert unlocked.final_stock != 0  # lost updates: each write overwrote the others
    assert locked.sold == stock
    assert locked.final_stock == 0
    assert locked.oversold_by == 0
    assert (
        f"with lock: {stock} sold from a stock of {stock}, oversold by 0, final stock 0" in stdout
    )
    assert re.search(r"a late write with token \d+ was refused", stdout), stdout
    assert "OK: with the lock" in stdout


@pytest.mark.memory
def test_oversell_example_on_memory() -> None:
    stdout = succeeded(run("examples/oversell.py"))
    check_demo(stdout, buyers=300, stock=100)
    assert "300 buyers in 1 process, locks on memory://" in stdout


@pytest.mark.memory
def test_demo_command_runs_the_same_program() -> None:
    stdout = succeeded(run("-m", "aiodlock", "demo", "--buyers", "60", "--stock", "25"))
    check_demo(stdout, buyers=60, stock=25)


@pytest.mark.memory
def test_demo_with_more_stock_than_buyers_sells_to_everyone() -> None:
    stdout = succeeded(run("-m", "aiodlock", "demo", "--buyers", "20", "--stock", "50"))
    locked = demo_rows(stdout)["with lock"]
    assert (locked.sold, locked.final_stock, locked.oversold_by) == (20, 30, 0)


@pytest.mark.memory
def test_demo_via_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    """``main()`` is the ``aiodlock`` console script: it returns the exit status."""
    from aiodlock.cli import main as cli_main

    assert cli_main(["demo", "--buyers", "30", "--stock", "10"]) == 0
    check_demo(capsys.readouterr().out, buyers=30, stock=10)


@pytest.mark.memory
def test_demo_verdict_and_exit_status() -> None:
    """The exit status is 1 when the locked run is not exact (it would be a bug)."""
    from aiodlock.cli import demo

    config = demo.Config("memory://", buyers=300, stock=100, processes=1, shared=False)
    unlocked = demo.Run("no lock", 300, demo.Totals(99, 300, 0, 0), 0.01)

    def report(sold: int, stock: int, refused: int = 0, stale_refused: bool = True) -> Any:
        totals = demo.Totals(stock, sold, refused, 300)
        locked = demo.Run("with lock", 300, totals, 0.5)
        return demo.Report(config, unlocked, locked, 299, stale_refused)

    assert report(100, 0).ok
    assert "OK: with the lock, exactly 100 sold" in report(100, 0).render()
    for bad in (
        report(101, 0),
        report(100, 1),
        report(100, 0, refused=1),
        report(100, 0, stale_refused=False),
    ):
        assert not bad.ok
        assert "FAILED: the locked run was not exact" in bad.render()
    assert "oversold by 1" in report(101, 0).render()


@pytest.mark.memory
def test_demo_refuses_processes_on_memory() -> None:
    result = run("-m", "aiodlock", "demo", "--processes", "2")
    assert result.returncode == 2
    assert result.stdout == ""  # nothing ran
    assert "--processes 2 needs a stock that several processes share" in result.stderr
    assert "memory://" in result.stderr
    assert "--url redis://HOST:PORT/DB" in result.stderr


@pytest.mark.memory
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--buyers", "0"], "argument --buyers: must be at least 1, got 0"),
        (["--stock", "many"], "argument --stock: expected a whole number, got 'many'"),
        (["--url", "consul://h:8500"], "unknown URL scheme 'consul' in url; known schemes: "),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_demo_usage_errors(args: list[str], message: str) -> None:
    result = run("-m", "aiodlock", "demo", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "usage: python -m aiodlock" in result.stderr


@pytest.mark.memory
def test_cli_help_lists_commands() -> None:
    stdout = succeeded(run("-m", "aiodlock", "--help"))
    assert "usage: python -m aiodlock" in stdout
    assert re.search(r"^\s+demo\s+the oversell demo", stdout, re.MULTILINE), stdout
    demo_help = succeeded(run("-m", "aiodlock", "demo", "--help"))
    for option in ("--url URL", "--buyers N", "--stock N", "--processes N"):
        assert option in demo_help


@pytest.mark.memory
def test_cli_without_command_is_a_usage_error() -> None:
    result = run("-m", "aiodlock")
    assert result.returncode == 2
    assert "the following arguments are required: COMMAND" in result.stderr


@pytest.mark.memory
def test_cli_version() -> None:
    assert succeeded(run("-m", "aiodlock", "--version")).strip() == (
        f"python -m aiodlock {aiodlock.__version__}"
    )


@pytest.mark.redis
@pytest.mark.parametrize(
    ("query", "processes"), [("", 1), ("", 2), ("?wakeup=blpop", 2)], ids=["1", "2", "2-blpop"]
)
def test_oversell_demo_on_redis(redis_url: str, query: str, processes: int) -> None:
    url = redis_url + query
    result = run("examples/oversell.py", "--url", url, "--processes", str(processes), url=url)
    stdout = succeeded(result)
    check_demo(stdout, buyers=300, stock=100)
    where = "1 process" if processes == 1 else f"{processes} processes"
    assert f"300 buyers in {where}, locks on redis://" in stdout
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        leftovers = list(client.scan_iter(match="aiodlock-demo:*"))
    finally:
        client.close()
    assert leftovers == []  # the demo deletes its stock keys


@pytest.mark.redis
def test_demo_reports_an_unreachable_redis() -> None:
    from tests.servers import free_port

    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    result = run("-m", "aiodlock", "demo", "--url", url)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "error: the demo could not run: BackendError:" in result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr


# ---------------------------------------------------------------------- the other examples


@pytest.mark.memory
def test_worker_example() -> None:
    stdout = succeeded(run("examples/worker.py"))
    assert re.search(r"^nightly-report: 8 runs .*; at most 1 at a time$", stdout, re.M), stdout
    assert re.search(r"^cache-refresh: ran by worker-\d; .*at most 1 at a time$", stdout, re.M)
    assert "export: LockLostError, the job was cancelled" in stdout
    assert "import: lease.lost is set after" in stdout
    assert "release() says the lease was already lost (LockNotOwnedError)" in stdout
    assert stdout.rstrip().endswith("OK")


@pytest.mark.memory
def test_semaphore_example() -> None:
    stdout = succeeded(run("examples/semaphore.py"))
    assert "10 calls with limit=3: max concurrency observed: 3" in stdout


@pytest.mark.memory
def test_rwlock_example() -> None:
    stdout = succeeded(run("examples/rwlock.py"))
    most = re.search(r"most readers inside at once: (\d+)", stdout)
    assert most is not None and int(most[1]) > 1, stdout
    assert "writer overlapped a reader or a writer: 0 times" in stdout
    assert "catalog version after the writers: 2 (expected 2)" in stdout
    assert "locks.lock('catalog') free while the write lock was held: True" in stdout


@pytest.mark.memory
def test_fastapi_example_script() -> None:
    stdout = succeeded(run("examples/fastapi_app.py"))
    assert "statuses [200]" in stdout
    assert "order 42 got 50 items (expected 50)" in stdout
    assert "50 distinct fencing tokens" in stdout


@pytest.mark.redis
@pytest.mark.parametrize(
    ("example", "expected"),
    [
        ("worker.py", "nightly-report: 8 runs"),
        ("semaphore.py", "max concurrency observed: 3"),
        ("rwlock.py", "writer overlapped a reader or a writer: 0 times"),
        ("fastapi_app.py", "order 42 got 50 items (expected 50)"),
    ],
)
def test_examples_on_redis(redis_url: str, example: str, expected: str) -> None:
    stdout = succeeded(run(f"examples/{example}", url=redis_url))
    assert expected in stdout


# ---------------------------------------------------------------------- FastAPI, in-process


def load_module(path: Path, name: str) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]


@pytest.fixture
def fastapi_app() -> Iterator[ModuleType]:
    yield from load_module(EXAMPLES / "fastapi_app.py", "aiodlock_example_fastapi_app")


@pytest.mark.memory
async def test_fastapi_app_serialises_updates_to_one_order(fastapi_app: ModuleType) -> None:
    app: Any = fastapi_app.app
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://shop") as client,
    ):
        first, second = await asyncio.gather(
            asyncio.gather(*(client.post("/orders/7/items") for _ in range(40))),
            asyncio.gather(*(client.post("/orders/8/items") for _ in range(10))),
        )
        order7 = (await client.get("/orders/7")).json()
        order8 = (await client.get("/orders/8")).json()
        locks = app.state.locks
    assert [r.status_code for r in [*first, *second]] == [200] * 50
    # Under the lock the requests ran one at a time: each saw the count its predecessor left.
    assert sorted(r.json()["items"] for r in first) == list(range(1, 41))
    assert sorted(r.json()["items"] for r in second) == list(range(1, 11))
    assert order7["items"] == 40
    assert order8["items"] == 10
    tokens = [r.json()["fencing_token"] for r in first]
    assert len(set(tokens)) == 40
    assert order7["fencing_token"] == max(tokens)
    assert "closed" in repr(locks)  # the lifespan closed the client


async def check_stale_token_refused(orders: Any, order: type[Any], order_id: int) -> None:
    await orders.save(order_id, order(items=1, fencing_token=5))
    with pytest.raises(aiodlock.StaleTokenError, match=r"token 4 < stored 5"):
        await orders.save(order_id, order(items=2, fencing_token=4))
    assert await orders.load(order_id) == order(items=1, fencing_token=5)
    await orders.aclose()


@pytest.mark.memory
async def test_fastapi_app_refuses_a_stale_token(fastapi_app: ModuleType) -> None:
    await check_stale_token_refused(fastapi_app.MemoryOrders(), fastapi_app.Order, 1)


@pytest.mark.redis
async def test_fastapi_app_refuses_a_stale_token_in_redis(
    fastapi_app: ModuleType, redis_url: str
) -> None:
    orders = fastapi_app.open_orders(redis_url)
    assert isinstance(orders, fastapi_app.RedisOrders)
    await check_stale_token_refused(orders, fastapi_app.Order, random_order_id())


def random_order_id() -> int:
    """An order no other test (or earlier run on the same Redis) has touched."""
    return int.from_bytes(os.urandom(6), "big")


@contextlib.asynccontextmanager
async def uvicorn_workers(
    url: str, workers: int, app: str = "examples.fastapi_app:app", ready: str = "/orders/0"
) -> AsyncIterator[str]:
    """``uvicorn APP --workers N`` on a free port: its base URL, once every worker has
    answered ``GET ready`` with 200 (its JSON names the worker's pid); stopped (and its
    workers with it) on exit."""
    port = free_port()
    command = ["-m", "uvicorn", app, "--port", str(port)]
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        *command,
        "--workers",
        str(workers),
        cwd=ROOT,
        env={**os.environ, "AIODLOCK_URL": url},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(TIMEOUT):
            await every_worker_answers(base, ready, workers, server)
        yield base
    finally:
        if server.returncode is None:
            server.terminate()  # uvicorn's supervisor stops its workers, then itself
        _, err = await asyncio.wait_for(server.communicate(), TIMEOUT)
        if server.returncode not in (0, -15):
            pytest.fail(f"uvicorn exited with {server.returncode}:\n{err.decode()[-2000:]}")


async def every_worker_answers(
    base: str, path: str, workers: int, server: asyncio.subprocess.Process | None = None
) -> list[dict[str, Any]]:
    """``GET path`` on a new connection each time (the workers take turns accepting) until
    ``workers`` distinct worker pids have answered 200; the answers. A worker still starting
    answers nothing yet: the caller bounds the time."""
    answers: list[dict[str, Any]] = []
    while len({answer["worker"] for answer in answers}) < workers:
        assert server is None or server.returncode is None, "uvicorn exited before it served"
        async with httpx.AsyncClient(base_url=base) as client:
            try:
                response = await client.get(path)
            except httpx.TransportError:
                response = None
        if response is not None and response.status_code == 200:
            answers.append(response.json())
        else:
            await asyncio.sleep(0.1)
    return answers


@pytest.mark.redis
async def test_fastapi_app_is_exact_under_two_workers(redis_url: str) -> None:
    """Two uvicorn worker processes share the locks and the orders (in Redis): 50 concurrent
    POSTs land exactly 50 items, and every worker answers GET with the same order."""
    order = f"/orders/{random_order_id()}"
    async with uvicorn_workers(redis_url, workers=2) as base:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
            posts = await asyncio.gather(*(client.post(f"{order}/items") for _ in range(50)))
        assert [p.status_code for p in posts] == [200] * 50
        assert sorted(p.json()["items"] for p in posts) == list(range(1, 51))
        async with asyncio.timeout(TIMEOUT):
            reads = await every_worker_answers(base, order, 2)
    assert {(r["items"], r["fencing_token"]) for r in reads} == {
        (50, max(p.json()["fencing_token"] for p in posts))
    }


@pytest.mark.redis
async def test_fastapi_app_answers_503_while_redis_is_down(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis outage is a 503 with Retry-After on every route (one log line each), not a
    500; once Redis is back, the app serves again."""
    from tests.servers import RedisServer

    with RedisServer() as redis:
        monkeypatch.setenv("AIODLOCK_URL", redis.url)
        (module,) = load_module(EXAMPLES / "fastapi_app.py", "aiodlock_example_fastapi_outage")
        app: Any = module.app
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://shop") as client,
        ):
            assert (await client.post("/orders/5/items")).status_code == 200
            redis.stop()
            answers = [await client.post("/orders/5/items"), await client.get("/orders/5")]
            for answer in answers:
                assert answer.status_code == 503, answer.text
                assert answer.headers["Retry-After"] == "1"
            assert [r.levelname for r in caplog.records if r.name == "orders"] == ["WARNING"] * 2
            redis.start()
            assert (await client.post("/orders/5/items")).status_code == 200


# ---------------------------------------------------------------------- README.md and the site


@dataclass(frozen=True)
class Block:
    page: str  # the file's name: README.md, tutorial.md...
    line: int
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def snippet_blocks() -> list[Block]:
    blocks = []
    for path in SNIPPET_PAGES:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(
            r"^```(?P<language>\w*)\n(?P<code>.*?)^```$", text, re.MULTILINE | re.DOTALL
        ):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(Block(path.name, line, match["language"], match["code"]))
    return blocks


RUNNABLE = [b for b in snippet_blocks() if b.language == "python" and b.code.startswith("import ")]


@pytest.mark.memory
def test_readme_and_site_have_runnable_snippets() -> None:
    python_blocks = [b for b in snippet_blocks() if b.language == "python"]
    assert len(RUNNABLE) >= 5
    assert any(b.page == "README.md" for b in RUNNABLE)  # the README's one example runs too
    fragments = [b for b in python_blocks if b not in RUNNABLE]
    for block in fragments:  # a fragment must say so
        assert block.code.startswith("# fragment"), block.where


@pytest.mark.memory
@pytest.mark.parametrize(
    "block", RUNNABLE, ids=[f"{b.page.removesuffix('.md')}-line{b.line}" for b in RUNNABLE]
)
def test_snippet_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / f"{block.page.removesuffix('.md')}_line_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    succeeded(run(str(script)))


@pytest.mark.memory
async def test_fastapi_snippet_counts_exactly() -> None:
    (block,) = [b for b in RUNNABLE if "FastAPI(" in b.code]
    namespace: dict[str, Any] = {"__name__": "readme_fastapi"}
    exec(compile(block.code, f"{block.page}:{block.line}", "exec"), namespace)
    app = namespace["app"]
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://shop") as client,
    ):
        answers = await asyncio.gather(*(client.post("/orders/3/items") for _ in range(20)))
    assert sorted(a.json()["items"] for a in answers) == list(range(1, 21))
    assert namespace["ORDERS"] == {3: 20}
