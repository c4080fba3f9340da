"""Benchmark: one job on PostgreSQL as N shards on N Prefect process workers, against one worker at the same total
concurrency.

Starts what production runs (``scripts/e2e.py``'s machinery): a Prefect server on PostgreSQL (a database of its own),
the bundled simulator as an OpenAI-compatible server (``--simulators`` processes sharing one port, SO_REUSEPORT),
the ``llm-dispatch`` process work pool with the ``dispatch`` and ``realtime`` deployments of ``prefect.yaml``. Then,
per entry of ``--workers`` (in order), a fresh results database on PostgreSQL, that many workers, and one
``prefect deployment run dispatch/dispatch`` of P prompts with ``shards=N`` and ``concurrency=C/N`` (each shard's),
watched to its end. Reported per run:

- wall time (deployment run asked for -> run finished, so it includes a worker picking it up and the flow run
  processes starting) and prompts/s; the send window (first to last result row stored) and its prompts/s;
- every prompt answered exactly once: one succeeded result per prompt, no other result rows (SQL);
- the results database's writes: pg_stat_database's tup_inserted and xact_commit per second over the run, and
  result rows stored per second (mean over the send window, and the busiest 10 s);
- CPU seconds by process group (Prefect server, workers with their flow-run processes, simulators, the PostgreSQL
  backends of the results database and of the server's), sampled from /proc every 2 s, and /proc/loadavg before
  and after (the machine is shared: read CPU seconds beside wall).

    .venv/bin/python bench/workers.py --prompts 20000 --concurrency 400 --workers 4 1 --simulators 2

Exits 1 when a run fails its checks. Every process it starts is stopped at the end, and the databases it made are
dropped (``--keep-databases`` keeps the results databases).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from e2e import (  # noqa: E402  (scripts/ is put on sys.path above)
    POOL, TAG, Child, E2EFailure, Harness, _descendants, _pg, check, free_port, http_json, online_workers,
    start_server, wait_until,
)
from realtime import make_prompts  # noqa: E402  (bench/ is the script's folder, first on sys.path)

SECRET_BLOCK = "llm-dispatch-api-key"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/{db}"
SQLA_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/{db}"
_FOREIGN_ENV = ("PREFECT_", "LLM_DISPATCH_", "OPENAI_")
TICK = os.sysconf("SC_CLK_TCK")


# --- CPU by process group ---------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15 of stat)


def _pg_backends(databases: set[str]) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            words = entry.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
        except OSError:
            continue
        # "postgres: 15/main: postgres DBNAME 127.0.0.1(port) idle"
        if words and words[0] == "postgres:" and any(word in databases for word in words[2:4]):
            found.append(int(entry.name))
    return found


@dataclass
class CpuSampler:
    """Each group's processes' CPU seconds since ``start``: the last value read of each process, minus what it had
    used before (a process gone between two samples loses at most one interval's CPU)."""

    groups: dict[str, Callable[[], list[int]]]
    interval: float = 2.0
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, tuple[str, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        for group, pids in self.groups.items():
            for pid in pids():
                cpu = _cpu_seconds(pid)
                if cpu is not None:
                    self.last[pid] = (group, cpu)

    def start(self) -> None:
        for pids in self.groups.values():
            for pid in pids():
                cpu = _cpu_seconds(pid)
                if cpu is not None:
                    self.first[pid] = cpu

        def loop() -> None:
            while not self._stop.wait(self.interval):
                self._sample()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        totals = dict.fromkeys(self.groups, 0.0)
        for pid, (group, cpu) in self.last.items():
            totals[group] += cpu - self.first.get(pid, 0.0)
        return totals


# --- PostgreSQL -------------------------------------------------------------------------------------

async def _pg_rows(db: str, sql: str) -> list[Any]:
    import asyncpg

    connection = await asyncpg.connect(PG_DSN.format(db=db), timeout=10)
    try:
        return list(await connection.fetch(sql))
    finally:
        await connection.close()


def fresh_database(name: str) -> str:
    asyncio.run(_pg(f'drop database if exists "{name}" with (force)'))
    asyncio.run(_pg(f'create database "{name}"'))
    return SQLA_URL.format(db=name)


def pg_counters(db: str) -> dict[str, int]:
    # The statistics collector's view is at most PGSTAT's flush interval (1 s) behind.
    row = asyncio.run(_pg_rows("postgres", "select xact_commit, tup_inserted, tup_updated from pg_stat_database "
                                           f"where datname = '{db}'"))[0]
    return dict(row)


async def flow_runs(api: str, run_id: str) -> tuple[Any, list[Any]]:
    """The dispatch run and every other flow run (its shards) the server knows."""
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.sorting import FlowRunSort

    async with PrefectClient(api=api) as client:
        parent = await client.read_flow_run(run_id)
        runs = await client.read_flow_runs(sort=FlowRunSort.ID_DESC, limit=200, offset=0)
    return parent, [r for r in runs if str(r.id) != run_id and (r.parameters or {}).get("job_id")]


def job_checks(db: str, total: int) -> dict[str, Any]:
    def rows(sql: str) -> list[Any]:
        return asyncio.run(_pg_rows(db, sql))

    per_prompt = {r["n"]: r["prompts"] for r in rows(
        "select n, count(*) as prompts from (select p.id, count(r.id) filter (where r.status = 'succeeded') as n"
        " from prompts p left join results r on r.prompt_id = p.id group by p.id) s group by n")}
    result_status = {r["status"]: r["count"] for r in rows("select status, count(*) from results group by status")}
    prompt_status = {r["status"]: r["count"] for r in rows("select status, count(*) from prompts group by status")}
    size = rows("select pg_database_size(current_database()) as bytes")[0]["bytes"]
    window = rows("select min(created_at) as first, max(created_at) as last, count(*) as n from results")[0]
    busiest = rows("select count(*) as n from results group by floor(extract(epoch from created_at) / 10)"
                   " order by n desc limit 1")
    send_s = (window["last"] - window["first"]).total_seconds() if window["n"] else 0.0
    return {"per_prompt": per_prompt, "result_status": result_status, "prompt_status": prompt_status,
            "send_s": send_s, "busiest_10s": busiest[0]["n"] / 10 if busiest else 0.0,
            "db_bytes": size, "once": per_prompt == {1: total} and result_status == {"succeeded": total}}


# --- the bench --------------------------------------------------------------------------------------

def start_simulators(harness: Harness, *, count: int, latency: float) -> tuple[str, list[Child]]:
    port = free_port()
    config = json.dumps({"latency": latency})
    sims = [harness.start(f"simulator-{i}", [sys.executable, "-m", "llm_dispatch.simulator", "--host", "127.0.0.1",
                                             "--port", str(port), "--reuse-port", "--config-json", config],
                          env=harness.env()) for i in range(count)]
    for sim in sims:
        wait_until(f"{sim.name}'s ready line", lambda s=sim: "http" in s.log.read_text(), timeout=90, child=sim)
    base_url = f"http://127.0.0.1:{port}/v1"
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "ping"}]}
    status, _ = http_json(f"{base_url}/chat/completions", method="POST", body=chat)
    check(status == 200, f"simulator answered {status}")
    return base_url, sims


def prepare_prefect(harness: Harness, *, client_env: dict[str, str], tag_limit: int) -> None:
    prefect = [sys.executable, "-m", "prefect"]
    harness.run("work-pool-create", [*prefect, "work-pool", "create", POOL, "--type", "process", "--overwrite"],
                env=client_env, timeout=180)
    harness.run("secret-block", [sys.executable, "-c", "from prefect.blocks.system import Secret; "
                                 f"Secret(value='sk-bench').save({SECRET_BLOCK!r}, overwrite=True)"],
                env=client_env, timeout=180)
    # High enough never to bind: the runs' own concurrency is what is compared.
    harness.run("tag-limit", [*prefect, "concurrency-limit", "create", TAG, str(tag_limit)], env=client_env,
                timeout=180)
    harness.run("deploy", [*prefect, "--no-prompt", "deploy", "--name", "dispatch", "--name", "realtime"],
                env={**client_env, "PWD": str(REPO)}, timeout=600)


def one_run(harness: Harness, *, n: int, args: argparse.Namespace, api: str, client_env: dict[str, str],
            base_url: str, prompts: Path, sims: list[Child], server: Child, server_db: str) -> dict[str, Any]:
    results_db = f"{args.db_prefix}_results_{n}w_{harness.marker}"
    results_url = fresh_database(results_db)
    prefect = [sys.executable, "-m", "prefect"]
    worker_env = harness.env(
        PREFECT_API_URL=api, PREFECT_HOME=str(harness.tmp / "worker-home"), PREFECT_WORKER_QUERY_SECONDS="2",
        LLM_DISPATCH_BASE_URL=base_url, LLM_DISPATCH_DATABASE_URL=results_url,
        LLM_DISPATCH_BATCH_DIR=str(harness.tmp / "batches"))
    # Limit 2: a worker may run the parent dispatch run beside a shard.
    workers = [harness.start(f"worker-{n}w-{i}", [*prefect, "worker", "start", "--pool", POOL, "--limit", "2",
                                                  "--name", f"bench-{n}w-{i}"], env=worker_env) for i in range(n)]
    names = {f"bench-{n}w-{i}" for i in range(n)}
    wait_until(f"{n} workers online", lambda: names <= set(asyncio.run(online_workers(api))), timeout=180, interval=1)
    time.sleep(3)  # let the workers' start-up CPU settle before the clock starts

    family = lambda roots: lambda: [p for r in roots for p in (r.process.pid, *_descendants(r.process.pid))]  # noqa: E731
    sampler = CpuSampler(groups={
        "prefect server": family([server]), "workers + flow runs": family(workers), "simulators": family(sims),
        "PG results db": lambda: _pg_backends({results_db}), "PG prefect db": lambda: _pg_backends({server_db}),
    })
    load_before = Path("/proc/loadavg").read_text().strip()
    counters_before = pg_counters(results_db)
    sampler.start()
    params = {"prompts": str(prompts), "shards": n, "concurrency": args.concurrency // n, "wait": False}
    started = time.monotonic()
    output = harness.run(f"deployment-run-{n}w", [*prefect, "deployment", "run", "dispatch/dispatch", "--params",
                                                  json.dumps(params), "--watch", "--watch-interval", "2",
                                                  "--watch-timeout", str(int(args.run_timeout))],
                         env=client_env, timeout=args.run_timeout + 120, check_exit=False)
    wall = time.monotonic() - started
    cpu = sampler.stop()
    counters_after = pg_counters(results_db)
    load_after = Path("/proc/loadavg").read_text().strip()
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", output)
    check(match is not None, f"no flow run id in the output of `prefect deployment run`:\n{output[-2000:]}")
    parent, shards = asyncio.run(flow_runs(api, match.group(1) if match else ""))
    state = parent.state_type.value if parent.state_type else "unknown"
    shard_states = sorted((r.name, r.state_type.value if r.state_type else None, round(r.total_run_time.total_seconds(), 1))
                          for r in shards if r.expected_start_time and r.expected_start_time >= parent.expected_start_time)
    checks = job_checks(results_db, args.prompts)
    for worker in workers:
        worker.stop()
    if not args.keep_databases:
        asyncio.run(_pg(f'drop database if exists "{results_db}" with (force)'))
    deltas = {k: counters_after[k] - counters_before[k] for k in counters_before}
    return {"workers": n, "state": state, "wall_s": wall, "prompts_per_s": args.prompts / wall,
            "send_s": checks["send_s"], "send_per_s": args.prompts / checks["send_s"] if checks["send_s"] else 0.0,
            "once": checks["once"], "per_prompt": checks["per_prompt"], "result_status": checks["result_status"],
            "prompt_status": checks["prompt_status"],
            "tup_inserted_per_s": deltas["tup_inserted"] / wall, "commits_per_s": deltas["xact_commit"] / wall,
            "tup_inserted": deltas["tup_inserted"], "commits": deltas["xact_commit"],
            "tup_updated": deltas["tup_updated"], "db_bytes_per_prompt": checks["db_bytes"] / args.prompts,
            "result_rows_per_s": args.prompts / checks["send_s"] if checks["send_s"] else 0.0,
            "busiest_10s_rows_per_s": checks["busiest_10s"],
            "flow_run_s": parent.total_run_time.total_seconds(), "shard_runs": shard_states,
            "cpu_s": cpu, "load_before": load_before, "load_after": load_after, "tail": output[-600:]}


def print_run(run: dict[str, Any]) -> None:
    print(f"\n== {run['workers']} worker(s), shards={run['workers']}: state {run['state']}")
    print(f"   loadavg before {run['load_before']} | after {run['load_after']}")
    print(f"   wall {run['wall_s']:.1f} s ({run['prompts_per_s']:.0f} prompts/s); send window {run['send_s']:.1f} s "
          f"({run['send_per_s']:.0f} prompts/s)")
    print(f"   dispatch flow run {run['flow_run_s']:.1f} s; shard runs (name, state, run seconds): {run['shard_runs']}")
    print(f"   answered exactly once: {run['once']} (successes per prompt {run['per_prompt']}, "
          f"results {run['result_status']}, prompts {run['prompt_status']})")
    print(f"   results db: {run['tup_inserted_per_s']:.0f} rows inserted/s, {run['commits_per_s']:.1f} commits/s over "
          f"the wall ({run['tup_inserted']} rows, {run['commits']} commits, {run['tup_updated']} updates); results "
          f"{run['result_rows_per_s']:.0f} rows/s over the send window, busiest 10 s {run['busiest_10s_rows_per_s']:.0f}/s; "
          f"{run['db_bytes_per_prompt']:.0f} bytes per prompt on disk")
    cpu = run["cpu_s"]
    print("   CPU s: " + ", ".join(f"{group} {seconds:.1f}" for group, seconds in cpu.items())
          + f"; total {sum(cpu.values()):.1f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=400, help="total requests in flight (C/N per shard)")
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 1], help="a run per entry, in order")
    parser.add_argument("--simulators", type=int, default=2, help="simulator processes sharing one port")
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--run-timeout", type=float, default=3600)
    parser.add_argument("--json", type=Path, help="write every run's figures here too")
    parser.add_argument("--keep-databases", action="store_true", help="keep the results databases")
    parser.add_argument("--db-prefix", default="bench_workers",
                        help="names of the databases made: PREFIX_prefect_MARKER and PREFIX_results_Nw_MARKER")
    args = parser.parse_args()
    if any(args.concurrency % n for n in args.workers):
        print(f"error: --concurrency: {args.concurrency} is not a multiple of every --workers entry", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}
    harness = Harness(tmp=tmp, marker=secrets.token_hex(4), base_env=base_env)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    runs: list[dict[str, Any]] = []
    failed = False
    try:
        server_db = f"{args.db_prefix}_prefect_{harness.marker}"
        server_url = fresh_database(server_db)
        harness.cleanups.append(("drop server db", lambda: asyncio.run(
            _pg(f'drop database if exists "{server_db}" with (force)'))))
        api = start_server(harness, database_url=server_url)
        server = next(c for c in harness.children if c.name == "prefect-server")
        for key in [k for k in os.environ if k.startswith("PREFECT_")]:
            del os.environ[key]
        os.environ.update(PREFECT_HOME=str(tmp / "client-home"), PREFECT_API_URL=api)
        client_env = harness.env(PREFECT_API_URL=api, PREFECT_HOME=str(tmp / "client-home"))
        base_url, sims = start_simulators(harness, count=args.simulators, latency=args.latency)
        prepare_prefect(harness, client_env=client_env, tag_limit=64)
        prompts = tmp / "prompts.jsonl"
        make_prompts(prompts, args.prompts)
        print(f"{args.prompts:,} prompts, total concurrency {args.concurrency}, {args.simulators} simulator processes "
              f"at {args.latency * 1000:.0f} ms, {os.cpu_count()} cores; Prefect server and results on PostgreSQL",
              flush=True)
        for n in args.workers:
            run = one_run(harness, n=n, args=args, api=api, client_env=client_env, base_url=base_url,
                          prompts=prompts, sims=sims, server=server, server_db=server_db)
            runs.append(run)
            print_run(run)
            failed = failed or not run["once"] or run["state"].lower() != "completed"
            if args.json:
                args.json.write_text(json.dumps(runs, indent=2, default=str))
    except (E2EFailure, KeyboardInterrupt) as exc:
        print(f"FAILED: {exc}", flush=True)
        harness.dump_logs()
        failed = True
    finally:
        harness.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    if len(runs) > 1:
        base = runs[-1]
        for run in runs[:-1]:
            print(f"\n{run['workers']} workers vs {base['workers']}: wall {run['wall_s'] / base['wall_s']:.2f}x, "
                  f"prompts/s {run['prompts_per_s'] / base['prompts_per_s']:.2f}x, send window "
                  f"{run['send_per_s'] / base['send_per_s']:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
