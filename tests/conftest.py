"""Shared fixtures: one Prefect test server per session, the simulator over real sockets, a SQLite file per test."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncio

import httpx
import pytest
import pytest_asyncio
import respx

from llm_dispatch.core import LLMClient

StartSim = Callable[..., Awaitable[str]]

# The API the respx tests mock, and the key they send.
BASE_URL = "https://llm.test/v1"
API_KEY = "sk-test-0123456789abcdef-SECRET"


@dataclass(frozen=True)
class Sim:
    """A running simulator: its OpenAI base URL and its admin endpoints."""

    base_url: str

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def stats(self) -> dict:
        return httpx.get(f"{self.root}/_sim/stats", timeout=60).raise_for_status().json()

    def reset(self) -> None:
        httpx.post(f"{self.root}/_sim/reset", timeout=60).raise_for_status()

    def configure(self, **fields: object) -> None:
        httpx.post(f"{self.root}/_sim/config", json=fields, timeout=60).raise_for_status()


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """A real Prefect API (temporary SQLite-backed server), started once: it takes ~9 s."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    # The test server's telemetry heartbeat races its own SQLite writes and logs "database is locked".
    previous = os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    try:
        # A loaded machine can take minutes to start it; the bound only stops a server that never comes up.
        with prefect_test_harness(server_startup_timeout=600):
            yield str(PREFECT_API_URL.value())
    finally:
        if previous is None:
            os.environ.pop("PREFECT_SERVER_ANALYTICS_ENABLED", None)
        else:
            os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = previous


@pytest_asyncio.fixture(loop_scope="function")
async def start_sim() -> AsyncIterator[StartSim]:
    """Start a simulator in the test's loop with the given config fields; returns its base URL."""
    from llm_dispatch.simulator import Simulator, SimulatorConfig

    running: list[Simulator] = []

    async def start(**fields: Any) -> str:
        simulator = Simulator(SimulatorConfig(**fields))
        running.append(simulator)
        return await simulator.start()

    yield start
    for simulator in running:
        await simulator.stop()


@pytest.fixture(scope="session")
def sim_server() -> Iterator[Sim]:
    from llm_dispatch.simulator import Simulator, SimulatorConfig

    with Simulator.in_thread(SimulatorConfig(latency=0.01, seed=1)) as base_url:
        yield Sim(base_url=base_url)


@pytest.fixture
def sim(sim_server: Sim) -> Iterator[Sim]:
    """The session's simulator with zeroed stats and default behaviour for this test."""
    sim_server.reset()
    sim_server.configure(latency=0.01, rate_429=0.0, rate_500=0.0, rate_503=0.0, rate_hang=0.0, rate_drop=0.0,
                         rate_malformed=0.0, invalid_json_rate=0.0, rpm=None, tpm=None)
    yield sim_server
    sim_server.reset()


@pytest.fixture(autouse=True)
def batch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Batch files of flows run in-process go under the test's own directory, not the checkout."""
    monkeypatch.setenv("LLM_DISPATCH_BATCH_DIR", str(tmp_path / "batches"))
    return tmp_path / "batches"


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'test.db'}"


PG_URL_ENV = "LLM_DISPATCH_TEST_PG_URL"
# Every test that needs PostgreSQL skips with this reason when PG_URL_ENV is unset; the run then says so once.
PG_SKIP_REASON = f"set {PG_URL_ENV} to run on PostgreSQL"
PG_HOWTO = f"{PG_URL_ENV}=postgresql+asyncpg://postgres@127.0.0.1:5432/test (README, \"Tests\")"


def pytest_report_header(config: pytest.Config) -> str | None:
    return None if os.environ.get(PG_URL_ENV) else f"PostgreSQL: not tested, {PG_URL_ENV} is unset"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One loud line instead of many quiet skips: how many PostgreSQL tests did not run, and how to run them."""
    skipped = [report for report in terminalreporter.stats.get("skipped", [])
               if PG_SKIP_REASON in str(getattr(report, "longrepr", ""))]
    if skipped:
        terminalreporter.write_line(f"{len(skipped)} PostgreSQL tests skipped: set {PG_HOWTO} to run them",
                                    yellow=True, bold=True)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL database of this test's own on the server of ``LLM_DISPATCH_TEST_PG_URL`` (skipped when unset),
    dropped afterwards: a flow run migrates the database it is given, and other branches' tests share the server."""
    import asyncpg

    base = os.environ.get(PG_URL_ENV)
    if not base:
        pytest.skip(PG_SKIP_REASON)
    name = f"llmd_test_{uuid.uuid4().hex[:16]}"

    async def admin(sql: str) -> None:
        connection = await asyncpg.connect(base.replace("+asyncpg", ""))
        try:
            await connection.execute(sql)
        finally:
            await connection.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield base.rsplit("/", 1)[0] + f"/{name}"
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


# --- helpers shared by the HTTP client tests -----------------------------------------


class FakeTime:
    """A clock that only moves when someone sleeps on it; records every sleep."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def router() -> Iterator[respx.Router]:
    # Strict: an unmocked request fails the test, and so does a route that was never called.
    router = respx.Router(base_url=BASE_URL, assert_all_called=True, assert_all_mocked=True)
    yield router
    router.assert_all_called()


def make_client(router: respx.Router, fake_time: FakeTime, **options: Any) -> LLMClient:
    """An ``LLMClient`` whose transport is ``router``, on ``fake_time``, with no jitter (backoff 0.5, 1, 2, ...)."""
    settings: dict[str, Any] = {
        "base_url": BASE_URL,
        "api_key": API_KEY,
        "transport": httpx.MockTransport(router.async_handler),
        "sleep": fake_time.sleep,
        "clock": fake_time.monotonic,
        "random": lambda: 0.0,
    }
    settings.update(options)
    return LLMClient(**settings)


# --- helpers shared by the flow tests ------------------------------------------------


def cli(*args: str, env: dict[str, str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``llm-dispatch ARGS`` in a process of its own, as a user runs it: the installed command."""
    return subprocess.run([str(Path(sys.executable).with_name("llm-dispatch")), *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli_env(prefect_api: str, sim: Sim, db_url: str, tmp_path: Path) -> dict[str, str]:
    """The CLI in its own process, against the session's Prefect API, the simulator and this test's database."""
    sim.configure(batch_processing_seconds=1.0)
    return {**os.environ, "PREFECT_API_URL": prefect_api, "LLM_DISPATCH_BASE_URL": sim.base_url,
            "LLM_DISPATCH_DATABASE_URL": db_url, "LLM_DISPATCH_BATCH_DIR": str(tmp_path / "batches"),
            "LLM_DISPATCH_BATCH_POLL_INTERVAL": "0.2"}


def write_prompts(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def rows(db_url: str, sql: str, *args: object) -> list[tuple]:
    """Rows from a test's SQLite database, read with the standard library (not the code under test)."""
    with sqlite3.connect(db_url.split("///", 1)[1]) as con:
        return con.execute(sql, args).fetchall()


def successes_per_prompt(db_url: str) -> dict[str, int]:
    return dict(rows(db_url, """
        SELECT p.custom_id, COUNT(r.id) FROM prompts p
        LEFT JOIN results r ON r.prompt_id = p.id AND r.status = 'succeeded'
        GROUP BY p.id"""))


@dataclass
class BatchEnv:
    """What a test of the batch steps works with: a database's sessions, a client, a batch directory, the simulator."""

    sessions: Any
    client: LLMClient
    directory: Path
    sim: Sim

    @property
    def clients(self) -> Any:
        from llm_dispatch.jobs import Clients

        return Clients.of(self.client)

    async def batch(self, batch_id: int) -> Any:
        """The batch's stored record; it must exist."""
        from llm_dispatch import storage

        record = await storage.get_batch(self.sessions, batch_id=batch_id)
        assert record is not None, f"no batch {batch_id} is stored"
        return record

    async def poll(self, batch_id: int, *, until: Callable[[Any], bool] | None = None, tries: int = 400) -> Any:
        """Poll the batch every 50 ms until ``until(record)`` (default: the provider ended it); its last record."""
        from llm_dispatch.core import TERMINAL_BATCH_STATUSES
        from llm_dispatch.jobs import poll_batch

        done = until or (lambda r: r.status in TERMINAL_BATCH_STATUSES)
        record = await self.batch(batch_id)
        for _ in range(tries):
            record = await poll_batch(sessions=self.sessions, clients=self.clients, record=record)
            if done(record):
                return record
            await asyncio.sleep(0.05)
        raise AssertionError(f"batch {batch_id} is still {record.status} after {tries} polls")

    def queue_faults(self, *faults: str) -> None:
        """Batch faults for the simulator's next batches (``expire:0.5``, ``create_lost_drop``...)."""
        httpx.post(f"{self.sim.root}/_sim/batch_faults", json={"faults": list(faults)}, timeout=60).raise_for_status()

    async def job(self, contents: list[str]) -> tuple[str, list[int]]:
        """A job of batch-routed prompts, one per content; its id and its prompts' ids (each test file's own)."""
        raise NotImplementedError

    async def submit(self, job_id: str) -> list[int]:
        raise NotImplementedError

    async def finish(self, batch_id: int) -> Any:
        raise NotImplementedError

    async def check_a_lost_create_is_adopted(
        self, fault: str, *, client: LLMClient, made: Callable[[], list[dict]], counted: str
    ) -> None:
        """A create whose answer ``fault`` loses (hang, drop, 502): the batch the provider made is found again and
        finished, never made twice (``made()``: the provider's batches; ``counted``: the simulator's count of them),
        and each of five prompts is answered once."""
        from llm_dispatch import storage

        job_id, ids = await self.job([f"q {i}" for i in range(5)])
        self.queue_faults(fault)
        async with client as self.client:
            [batch_id] = await self.submit(job_id)
            [batch] = made()
            assert (await self.batch(batch_id)).provider_batch_id == batch["id"]
            await self.finish(batch_id)
        assert self.sim.stats()[counted] == 1
        assert await storage.job_counts(self.sessions, job_id=job_id) == {"succeeded": 5}
        assert sorted(r.prompt_id for r in await self.results(job_id)) == sorted(ids)

    async def results(self, job_id: str) -> list[Any]:
        from sqlalchemy import select

        from llm_dispatch.storage import Result

        async with self.sessions() as session:
            return list((await session.scalars(select(Result).where(Result.job_id == job_id).order_by(Result.id))).all())
