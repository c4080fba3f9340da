"""End-to-end check of the deployments in prefect.yaml: a real Prefect server (on Postgres when one
answers on 127.0.0.1:5432, else SQLite), the bundled simulator in its own process, two process
workers, and one `dispatch` run with shards=2 under a tag limit; then the results database, the
deployments and the API key's absence from every log and record are checked.

    .venv/bin/python scripts/e2e.py [--prompts 600] [--long-prompts 20] [--latency 0.2]
                                    [--server-db auto|postgres|sqlite] [--results-db auto|postgres|sqlite] [--keep]

Run from the repo root with the repo installed in that interpreter's environment. Exits 0 when every
check passes; otherwise prints what failed and the tail of each process log, and exits 1. Every
process it starts is stopped at the end, on failure too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
POOL = "llm-dispatch"
TAG = "llm-realtime"
TAG_LIMIT = 2
CHUNK_CONCURRENCY = 16
BOUND = TAG_LIMIT * CHUNK_CONCURRENCY
SECRET_BLOCK = "llm-dispatch-api-key"
PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
# Each run makes databases of its own, named with its marker, and drops only those: two runs on one host (or a
# test suite on the same server) never meet.
PG_SERVER_DB = "prefect_e2e_{marker}"
PG_RESULTS_DB = "llm_e2e_results_{marker}"
EXPECTED_DEPLOYMENTS = (
    "dispatch/dispatch", "realtime-dispatch/realtime", "dispatch-directory/nightly", "collect-batches/collect-batches",
)
# Children must not see the caller's Prefect profile, API URL or llm-dispatch settings.
_FOREIGN_ENV = ("PREFECT_", "LLM_DISPATCH_", "OPENAI_")
STOP_TIMEOUT = 15.0
LOG_TAIL_LINES = 40


class E2EFailure(Exception):
    """A check failed; the message says which and what was seen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise E2EFailure(message)


# --- timing -----------------------------------------------------------------------------------------

@dataclass
class Phases:
    started: float = field(default_factory=time.monotonic)
    times: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        print(f"--- {name}", flush=True)
        begun = time.monotonic()
        try:
            yield
        finally:
            self.times[name] = time.monotonic() - begun
            print(f"    {name}: {self.times[name]:.1f} s", flush=True)

    def report(self) -> None:
        print("\nphase times:")
        for name, seconds in self.times.items():
            print(f"  {name:<28} {seconds:7.1f} s")
        print(f"  {'wall time':<28} {time.monotonic() - self.started:7.1f} s", flush=True)


# --- processes --------------------------------------------------------------------------------------

def _children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name may hold spaces and parentheses; the ppid is the 2nd field after the last ')'.
            ppid = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, found, todo = _children_by_parent(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries this run's marker: what is left of ours once parents died
    (Prefect starts each flow run in a session of its own, out of the worker's process group)."""
    needle = f"E2E_RUN_MARKER={marker}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if needle in entry.joinpath("environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return [pid for pid in found if pid != os.getpid()]


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    family: list[int] = field(default_factory=list)

    def terminate(self) -> None:
        """SIGTERM to the process group and to every descendant (flow runs sit in sessions of their own)."""
        if self.process.poll() is not None:
            return
        self.family = _descendants(self.process.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        for pid in self.family:
            _signal(pid, signal.SIGTERM)

    def reap(self, deadline: float) -> None:
        """Wait until ``deadline`` (monotonic) for the process to end, then SIGKILL what is left."""
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"    {self.name} still running {STOP_TIMEOUT:.0f} s after SIGTERM; killing it", flush=True)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for pid in self.family:
            _signal(pid, signal.SIGKILL)

    def stop(self) -> None:
        self.terminate()
        self.reap(time.monotonic() + STOP_TIMEOUT)

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Harness:
    tmp: Path
    marker: str
    base_env: dict[str, str]
    children: list[Child] = field(default_factory=list)
    cleanups: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        return {**self.base_env, "E2E_RUN_MARKER": self.marker, **extra}

    def start(self, name: str, command: list[str], *, env: Mapping[str, str], cwd: Path = REPO) -> Child:
        log = self.tmp / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=dict(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        child = Child(name=name, process=process, log=log)
        self.children.append(child)
        return child

    def run(self, name: str, command: list[str], *, env: Mapping[str, str], timeout: float,
            cwd: Path = REPO, check_exit: bool = True) -> str:
        """Run a command to its end (killed after ``timeout``); its output goes to a log and is returned."""
        child = self.start(name, command, env=env, cwd=cwd)
        try:
            code = child.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.stop()
            raise E2EFailure(f"`{' '.join(command[:6])}` did not finish within {timeout:.0f} s:\n{child.tail()}") from None
        output = child.log.read_text(errors="replace")
        if code != 0 and check_exit:
            raise E2EFailure(f"`{' '.join(command[:6])}` exited with {code}:\n{child.tail()}")
        return output

    def stop_all(self) -> None:
        # Workers and commands first (they own flow runs and report to the server), in parallel; then the
        # simulator and the server.
        last = {"prefect-server", "simulator"}
        for wave in ([c for c in self.children if c.name not in last], [c for c in self.children if c.name in last]):
            for child in wave:
                child.terminate()
            deadline = time.monotonic() + STOP_TIMEOUT
            for child in wave:
                child.reap(deadline)
        for pid in _marked_pids(self.marker):
            _signal(pid, signal.SIGKILL)
        for name, cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception as exc:  # keep cleaning up; say what was left behind
                print(f"    cleanup {name} failed: {exc}", flush=True)

    def dump_logs(self) -> None:
        for child in self.children:
            print(f"\n===== {child.name} ({child.log}) last {LOG_TAIL_LINES} lines =====")
            print(child.tail())
        sys.stdout.flush()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(what: str, probe: Callable[[], Any], *, timeout: float, child: Child | None = None,
               interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if child is not None and child.process.poll() is not None:
            raise E2EFailure(f"{child.name} exited with {child.process.returncode} while waiting for {what}")
        with contextlib.suppress(Exception):
            result = probe()
            if result:
                return result
        if time.monotonic() > deadline:
            raise E2EFailure(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def http_json(url: str, *, method: str = "GET", body: Any = None, headers: Mapping[str, str] | None = None,
              timeout: float = 10) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


# --- Postgres ---------------------------------------------------------------------------------------

async def _pg(sql: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def postgres_available() -> bool:
    try:
        asyncio.run(_pg("select 1"))
    except Exception:
        return False
    return True


def scratch_database(harness: Harness, template: str) -> str:
    """A new database of this run's own (its name carries the run's marker), dropped at teardown."""
    name = template.format(marker=harness.marker)
    asyncio.run(_pg(f'create database "{name}"'))
    # Only this run made it, so only its own server and workers can hold it open at teardown (stopped by then).
    harness.cleanups.append((f"drop database {name}",
                             lambda: asyncio.run(_pg(f'drop database if exists "{name}" with (force)'))))
    return f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"


# --- the steps --------------------------------------------------------------------------------------

def start_server(harness: Harness, *, database_url: str | None) -> str:
    port = free_port()
    env = harness.env(PREFECT_HOME=str(harness.tmp / "server-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                      PREFECT_UI_ENABLED="false")
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    server = harness.start("prefect-server", [sys.executable, "-m", "prefect", "server", "start",
                                              "--host", "127.0.0.1", "--port", str(port)], env=env)
    api = f"http://127.0.0.1:{port}/api"
    wait_until("the Prefect server's /api/health", lambda: http_json(f"{api}/health", timeout=3)[0] == 200,
               timeout=180, child=server)
    return api


def start_simulator(harness: Harness, *, secret: str, latency: float) -> str:
    config = {"latency": latency, "batch_processing_seconds": 2.0}
    sim = harness.start("simulator", [sys.executable, "-m", "llm_dispatch.simulator", "--host", "127.0.0.1",
                                      "--port", str(free_port()), "--config-json", json.dumps(config)],
                        env=harness.env())

    def ready_url() -> str | None:
        lines = [ln for ln in sim.log.read_text().splitlines() if ln.startswith("http")]
        return lines[0].strip() if lines else None

    base_url: str = wait_until("the simulator's ready line", ready_url, timeout=60, child=sim)
    root = base_url.removesuffix("/v1")
    # The key goes in through the control route, not the command line, where `ps` would show it.
    status, _ = http_json(f"{root}/_sim/config", method="POST", body={"api_key": secret})
    check(status == 200, f"could not set the simulator's api_key (HTTP {status})")
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "ping"}]}
    wrong, _ = http_json(f"{base_url}/chat/completions", method="POST", body=chat,
                         headers={"authorization": "Bearer sk-wrong-key-000"})
    right, _ = http_json(f"{base_url}/chat/completions", method="POST", body=chat,
                         headers={"authorization": f"Bearer {secret}"})
    check((wrong, right) == (401, 200), f"simulator auth: wrong key got {wrong} (want 401), right key {right} (want 200)")
    return base_url


def write_prompts(path: Path, *, short: int, long: int) -> int:
    with path.open("w") as out:
        for i in range(short):
            out.write(json.dumps({"id": f"short-{i:05d}", "prompt": f"Question {i}: name a prime above {i * 7}."}) + "\n")
        for i in range(long):
            body = f"Summarise document {i}. " + " ".join(f"sentence {j} of document {i}." for j in range(60))
            check(len(body) > 1000, "a long prompt must exceed 1000 characters to be routed to the Batch API")
            out.write(json.dumps({"id": f"long-{i:05d}", "prompt": body}) + "\n")
    return short + long


async def read_deployments(api: str) -> dict[str, Any]:
    from prefect.client.orchestration import PrefectClient

    from prefect.exceptions import ObjectNotFound

    found = {}
    async with PrefectClient(api=api) as client:
        for name in EXPECTED_DEPLOYMENTS:
            try:
                found[name] = await client.read_deployment_by_name(name)
            except ObjectNotFound:
                raise E2EFailure(f"`prefect deploy --all` did not register deployment {name}") from None
    return found


async def online_workers(api: str) -> list[str]:
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api=api) as client:
        workers = await client.read_workers_for_work_pool(POOL, offset=0, limit=200)
    return [w.name for w in workers if str(getattr(w.status, "value", w.status)).upper() == "ONLINE"]


async def read_runs_and_logs(api: str) -> tuple[list[Any], list[Any], list[Any]]:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, FlowRunFilter, TaskRunFilter
    from prefect.client.schemas.sorting import ArtifactSort, FlowRunSort

    # Sort, limit and offset are always given, whatever the FastAPI version's view of nulls.
    async with PrefectClient(api=api) as client:
        runs = await client.read_flow_runs(sort=FlowRunSort.ID_DESC, limit=200, offset=0)
        logs: list[Any] = []
        while True:
            page = await client.read_logs(limit=200, offset=len(logs))
            logs.extend(page)
            if len(page) < 200:
                break
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(), flow_run_filter=FlowRunFilter(), task_run_filter=TaskRunFilter(),
            sort=ArtifactSort.ID_DESC, limit=200, offset=0)
    return runs, logs, artifacts


async def read_results(database_url: str) -> dict[str, Any]:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            async def rows(sql: str) -> list[Any]:
                return list((await conn.execute(text(sql))).all())

            out: dict[str, Any] = {
                "jobs": await rows("select id, status from jobs"),
                "prompt_status": dict(await rows("select status, count(*) from prompts group by status")),
                "planned": dict(await rows("select planned_route, count(*) from prompts group by planned_route")),
                "success_counts": dict(await rows(
                    "select n, count(*) from (select p.id, sum(case when r.status = 'succeeded' then 1 else 0 end) as n"
                    " from prompts p left join results r on r.prompt_id = p.id group by p.id) per_prompt group by n")),
                "routes": dict(await rows("select route, count(*) from results where status = 'succeeded' group by route")),
                "result_status": dict(await rows("select status, count(*) from results group by status")),
            }
            if engine.dialect.name == "postgresql":
                tables = [t for (t,) in await rows("select tablename from pg_tables where schemaname = 'public'")]
                dump = []
                for table in tables:
                    dump.extend(r[0] for r in await rows(f'select t::text from "{table}" t'))
                out["dump"] = "\n".join(dump)
        return out
    finally:
        await engine.dispose()


def find_secret(secret: str, sources: Mapping[str, str | bytes]) -> list[str]:
    return [name for name, content in sources.items()
            if (secret.encode() in content if isinstance(content, bytes) else secret in content)]


# --- main -------------------------------------------------------------------------------------------

def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=600, help="short prompts (real-time)")
    parser.add_argument("--long-prompts", type=int, default=20, help="prompts over 1000 characters (Batch API)")
    # Long enough that a shard keeps its 16 requests in flight for seconds: both shards then overlap for
    # sure, and the peak shows the bound is reached, not only respected.
    parser.add_argument("--latency", type=float, default=None,
                        help="simulator latency, seconds (default 0.2; 1.0 with a SQLite-backed Prefect server, whose "
                             "runs start further apart: each shard then sends for longer than that gap)")
    for which in ("server", "results"):
        parser.add_argument(f"--{which}-db", choices=("auto", "postgres", "sqlite"), default="auto",
                            help=f"database of the {'Prefect server' if which == 'server' else 'results'} "
                                 "(auto: Postgres when it answers on 127.0.0.1:5432, else SQLite)")
    parser.add_argument("--run-timeout", type=float, default=300, help="seconds for the dispatch run")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, databases)")
    args = parser.parse_args()

    # CI cancelling the job sends SIGTERM: make it unwind through the finally below.
    signal.signal(signal.SIGTERM, _interrupt)
    phases = Phases()
    tmp = Path(tempfile.mkdtemp(prefix="llm-dispatch-e2e-"))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}
    harness = Harness(tmp=tmp, marker=secrets.token_hex(8), base_env=base_env)
    secret = f"sk-e2e-{secrets.token_hex(12)}"
    failure: str | None = None
    try:
        summary = run_checks(harness, phases, args, secret)
        print(f"\nE2E PASSED: {summary}")
    except E2EFailure as exc:
        failure = str(exc)
    except KeyboardInterrupt:
        failure = "interrupted"
    except Exception as exc:  # an unexpected error is a failure with a traceback, not a hang
        import traceback

        failure = f"unexpected {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    finally:
        if failure is not None:
            harness.dump_logs()
        with phases.phase("teardown"):
            harness.stop_all()
            if args.keep or failure is not None and os.environ.get("CI"):
                print(f"    kept {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        phases.report()
    if failure is not None:
        print(f"\nE2E FAILED: {failure}", file=sys.stderr, flush=True)
        return 1
    return 0


def run_checks(harness: Harness, phases: Phases, args: argparse.Namespace, secret: str) -> str:
    tmp = harness.tmp
    prefect = [sys.executable, "-m", "prefect"]

    with phases.phase("databases"):
        have_pg = {args.server_db, args.results_db} != {"sqlite"} and postgres_available()
        check(have_pg or "postgres" not in (args.server_db, args.results_db),
              f"Postgres was asked for but does not answer at {PG_ADMIN_DSN} (trust auth, user postgres)")
        server_pg = args.server_db == "postgres" or args.server_db == "auto" and have_pg
        results_pg = args.results_db == "postgres" or args.results_db == "auto" and have_pg
        server_db = scratch_database(harness, PG_SERVER_DB) if server_pg else None
        results_db = (scratch_database(harness, PG_RESULTS_DB) if results_pg
                      else f"sqlite+aiosqlite:///{tmp / 'results.db'}")
        print(f"    Prefect server on {'Postgres' if server_pg else 'SQLite'}; results in {results_db}")

    with phases.phase("prefect server"):
        api = start_server(harness, database_url=server_db)
        # This process reads the API through Prefect's client; keep it off the caller's profile too.
        for key in [k for k in os.environ if k.startswith("PREFECT_")]:
            del os.environ[key]
        os.environ.update(PREFECT_HOME=str(tmp / "client-home"), PREFECT_API_URL=api)
        client_env = harness.env(PREFECT_API_URL=api, PREFECT_HOME=str(tmp / "client-home"))

    with phases.phase("simulator"):
        latency = args.latency if args.latency is not None else 0.2 if server_pg else 1.0
        sim_url = start_simulator(harness, secret=secret, latency=latency)
        sim_root = sim_url.removesuffix("/v1")

    with phases.phase("pool, secret, limit, deploy"):
        harness.run("work-pool-create", [*prefect, "work-pool", "create", POOL, "--type", "process", "--overwrite"],
                    env=client_env, timeout=120)
        harness.run("secret-block", [sys.executable, "-c",
                                     "import os; from prefect.blocks.system import Secret; "
                                     f"Secret(value=os.environ['E2E_SECRET']).save({SECRET_BLOCK!r}, overwrite=True)"],
                    env={**client_env, "E2E_SECRET": secret}, timeout=120)
        harness.run("tag-limit", [*prefect, "concurrency-limit", "create", TAG, str(TAG_LIMIT)],
                    env=client_env, timeout=120)
        # prefect.yaml's pull step is `set_working_directory: {{ $PWD }}`: PWD must be this checkout.
        deploy_env = {**client_env, "PWD": str(REPO)}
        harness.run("deploy", [*prefect, "--no-prompt", "deploy", "--all"], env=deploy_env, timeout=300)
        deployments = asyncio.run(read_deployments(api))
        for name, deployment in deployments.items():
            check(deployment.work_pool_name == POOL, f"{name} is on pool {deployment.work_pool_name!r}, not {POOL!r}")

    with phases.phase("workers"):
        worker_env = harness.env(
            PREFECT_API_URL=api, PREFECT_HOME=str(tmp / "worker-home"),
            # Poll the pool every 2 s (default 10 s), so both shard runs start close together.
            PREFECT_WORKER_QUERY_SECONDS="2",
            LLM_DISPATCH_BASE_URL=sim_url, LLM_DISPATCH_DATABASE_URL=results_db,
            LLM_DISPATCH_BATCH_DIR=str(tmp / "batches"), LLM_DISPATCH_BATCH_POLL_INTERVAL="0.5",
            # Two chunks a shard: a shard holds a tag slot for its chunk begun ahead too, so with more chunks
            # the first shard to start could take turns with itself for both slots; with two, the slot its
            # first chunk frees can only go to the other shard, while its second chunk is still sending.
            LLM_DISPATCH_CONCURRENCY=str(CHUNK_CONCURRENCY), LLM_DISPATCH_CHUNK_SIZE="150",
        )
        names = [f"e2e-worker-{n}" for n in (1, 2)]
        for name in names:
            harness.start(name, [*prefect, "worker", "start", "--pool", POOL, "--limit", "4", "--name", name],
                          env=worker_env)
        wait_until("both workers online", lambda: set(names) <= set(asyncio.run(online_workers(api))),
                   timeout=120, interval=1)

    with phases.phase("dispatch run (shards=2)"):
        prompts = tmp / "prompts.jsonl"
        total = write_prompts(prompts, short=args.prompts, long=args.long_prompts)
        status, _ = http_json(f"{sim_root}/_sim/reset", method="POST", body={})
        check(status == 200, f"simulator reset answered {status}")
        params = {"prompts": str(prompts), "wait": True, "shards": 2}
        output = harness.run(
            "deployment-run",
            [*prefect, "deployment", "run", "dispatch/dispatch", "--params", json.dumps(params), "--watch",
             "--watch-interval", "2", "--watch-timeout", str(int(args.run_timeout))],
            env=client_env, timeout=args.run_timeout + 60, check_exit=False)  # the run's state says more
        match = re.search(r"UUID:\s*([0-9a-f-]{36})", output)
        check(match is not None, f"no flow run id in the output of `prefect deployment run`:\n{output[-2000:]}")
        run_id = match.group(1) if match else ""
        _, stats = http_json(f"{sim_root}/_sim/stats")

    with phases.phase("checks"):
        runs, logs, artifacts = asyncio.run(read_runs_and_logs(api))
        by_id = {str(r.id): r for r in runs}
        check(run_id in by_id, f"dispatch run {run_id} is not in the API")
        for run in runs:
            if run.state_type is None or run.state_type.value != "COMPLETED":
                message = run.state.message if run.state else None
                print(f"    flow run {run.name!r} ({run.parameters.get('shard', '')}) ended "
                      f"{run.state_type.value if run.state_type else None}: {message}")
        dispatch_run = by_id[run_id]
        check(dispatch_run.state_type.value == "COMPLETED" if dispatch_run.state_type else False,
              f"dispatch run {dispatch_run.name!r} ended {dispatch_run.state_type.value if dispatch_run.state_type else None}: "
              f"{dispatch_run.state.message if dispatch_run.state else ''}")
        shard_runs = [r for r in runs if r.parameters.get("planned_route") == "realtime" and "shard" in r.parameters]
        check(sorted(r.parameters["shard"] for r in shard_runs) == [0, 1]
              and all(r.state_type.value == "COMPLETED" for r in shard_runs),
              f"want 2 completed realtime-dispatch shard runs (shard 0 and 1), got "
              f"{[(r.name, r.parameters.get('shard'), r.state_type.value) for r in shard_runs]}")
        names = sorted(r.name for r in shard_runs)
        check(names == ["shard 1/2 of prompts.jsonl", "shard 2/2 of prompts.jsonl"],
              f"shard runs are named {names}, not for their share of the job")

        peak = stats["peak_in_flight"]
        print(f"    simulator: peak_in_flight {peak} (bound {TAG_LIMIT} x {CHUNK_CONCURRENCY} = {BOUND}), "
              f"requests {stats['requests_total']}, by status {stats['by_status']}, "
              f"batches {stats['batches']}, batch lines {stats['batch_lines']}")
        check(peak <= BOUND, f"peak in flight {peak} is above tag limit x chunk concurrency = {BOUND}")
        check(peak > CHUNK_CONCURRENCY,
              f"peak in flight {peak} never went above one chunk's {CHUNK_CONCURRENCY}: the two shards did not send at "
              "the same time (see the shard runs' start times in the worker logs)")
        check(set(stats["by_status"]) <= {"200"}, f"the simulator answered more than 200s: {stats['by_status']}")

        results = asyncio.run(read_results(results_db))
        print(f"    results: jobs {results['jobs']}, prompts {results['prompt_status']}, planned {results['planned']}, "
              f"successes per route {results['routes']}")
        check(len(results["jobs"]) == 1 and results["jobs"][0][1] == "finished",
              f"want one finished job, got {results['jobs']}")
        check(results["prompt_status"] == {"succeeded": total}, f"want {total} prompts succeeded, got {results['prompt_status']}")
        check(results["success_counts"] == {1: total},
              f"want exactly one successful result per prompt, got {{successes: prompts}} {results['success_counts']}")
        check(results["routes"] == {"realtime": args.prompts, "batch": args.long_prompts},
              f"want {args.prompts} real-time and {args.long_prompts} batch results, got {results['routes']}")

        collect = deployments["collect-batches/collect-batches"]
        intervals = [getattr(s.schedule, "interval", None) for s in collect.schedules]
        check(intervals == [timedelta(seconds=900)] and collect.schedules[0].active,
              f"collect-batches schedules: want one active 900 s interval, got {intervals}")
        limit = collect.global_concurrency_limit.limit if collect.global_concurrency_limit else None
        check(limit == 1, f"collect-batches concurrency limit is {limit}, want 1")

        db_text: dict[str, str | bytes] = {}
        if "dump" in results:
            db_text["results database (every row)"] = results["dump"]
        else:
            for path in tmp.glob("results.db*"):
                db_text[path.name] = path.read_bytes()
        for path in (tmp / "batches").rglob("*"):
            if path.is_file():
                db_text[f"batch file {path.name}"] = path.read_bytes()
        for child in harness.children:
            db_text[f"log {child.name}"] = child.log.read_bytes()
        db_text["flow run parameters"] = json.dumps([r.parameters for r in runs], default=str)
        db_text["flow run logs (API)"] = "\n".join(entry.message for entry in logs)
        db_text["artifacts (API)"] = json.dumps([a.data for a in artifacts], default=str)
        leaked = find_secret(secret, db_text)
        check(not leaked, f"the API key appears in: {leaked}")
        check(len(logs) > 0 and len(db_text) > 5, "nothing to search for the key: no API logs or no captured files")
        print(f"    key absent from {len(db_text)} sources ({len(logs)} API log lines, {len(runs)} flow runs)")
    return (f"{total} prompts, one result each ({results['routes']}); peak in flight {peak} <= {BOUND}; "
            f"{len(runs)} flow runs")


if __name__ == "__main__":
    sys.exit(main())
