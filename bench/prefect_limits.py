"""Benchmark: tag-limited Prefect task runs against a Prefect server on SQLite vs on PostgreSQL.

For each backend a real `prefect server start` runs in its own process with its own PREFECT_HOME;
an async flow awaits N async tasks at once (each sleeps `--sleep` s, standing in for a chunk of HTTP
work), tagged with a tag concurrency limit and, as a baseline for Prefect's own per-task overhead,
untagged. Ideal time with the limit is N / limit * sleep. Each run is a fresh child process;
"database is locked" lines in the server log (the server is told to log these retryable errors) and the
client's 503 retries and 423 slot denials are counted per run; medians are reported.

    python bench/prefect_limits.py [--tasks 200] [--limit 8] [--sleep 0.2] [--repeat 3]
                                   [--backends sqlite postgres] [--pg-url postgresql+asyncpg://postgres@127.0.0.1:5432]
                                   [--json]

The postgres backend creates a scratch database (`prefect_bench`) and drops it at the end. With the
defaults a full run takes ~14 min on 2 cores, almost all of it SQLite's limited runs (~3.5 min each);
`--repeat 1` or `--backends postgres` for a quicker look.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

TAG = "bench-limit"
SCRATCH_DB = "prefect_bench"
DEFAULT_PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432"
LOCKED = "database is locked"


# --- child: one measured flow run against an already running server -------------------------------

class BackoffCounter(logging.Handler):
    """Counts the client's waits: 503 retries (the server's answer to a locked SQLite) and 423 slot denials."""

    # Prefect logs both waits at DEBUG: "... retryable status code 503. Another attempt will be made in 2.1s."
    # and "Unable to acquire concurrency slot with lease for [...]. Retrying in 0.4 second(s)."
    PATTERNS = {"503": re.compile(r"status code 503\. Another attempt will be made in ([\d.]+)s"),
                "423": re.compile(r"Unable to acquire concurrency slot.*Retrying in ([\d.]+) second")}

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = dict.fromkeys(self.PATTERNS, 0)
        self.waited = dict.fromkeys(self.PATTERNS, 0.0)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for status, pattern in self.PATTERNS.items():
            if match := pattern.search(message):
                self.count[status] += 1
                self.waited[status] += float(match.group(1))

    def totals(self) -> dict[str, float]:
        return {**{f"retries_{s}": n for s, n in self.count.items()},
                **{f"backoff_s_{s}": round(w, 1) for s, w in self.waited.items()}}


async def measure(*, tasks: int, limit: int, sleep: float, limited: bool) -> dict[str, float]:
    import asyncio

    from prefect import flow, get_client, task

    logging.getLogger("prefect").setLevel(logging.WARNING)
    backoff = BackoffCounter()
    for name in ("prefect.client", "prefect._internal.concurrency"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(backoff)
    if limited:
        async with get_client() as client:
            await client.create_concurrency_limit(tag=TAG, concurrency_limit=limit)

    in_flight = peak = 0

    @task(name="sleep-chunk")
    async def sleep_chunk(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(sleep)
        finally:
            in_flight -= 1
        return i

    tags = [TAG] if limited else []

    @flow(name="bench-prefect-limits")
    async def fan_out() -> list[int]:
        return await asyncio.gather(*(sleep_chunk.with_options(tags=tags)(i) for i in range(tasks)))

    @flow(name="bench-warm-up")
    async def warm_up() -> None:
        return None

    await warm_up()  # API client, event websocket and flow-run bookkeeping are up before the clock
    started = time.perf_counter()
    results = await fan_out()
    elapsed = time.perf_counter() - started
    assert sorted(results) == list(range(tasks)), "some tasks did not return"
    return {"seconds": elapsed, "peak_in_flight": peak, **backoff.totals()}


def child(args: argparse.Namespace) -> None:
    import asyncio

    result = asyncio.run(measure(tasks=args.tasks, limit=args.limit, sleep=args.sleep, limited=args.child == "limited"))
    print("RESULT " + json.dumps(result), flush=True)


# --- parent: servers, databases, runs ---------------------------------------------------------------

def clean_env() -> dict[str, str]:
    # An inherited PREFECT_* (API URL, profile, home) would point a server or a run at the wrong place.
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def psql(pg_url: str, sql: str) -> None:
    # pg_url is the SQLAlchemy form; psql wants plain postgresql:// and a database to connect to.
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://").rstrip("/") + "/postgres"
    subprocess.run(["psql", dsn, "-v", "ON_ERROR_STOP=1", "-qc", sql], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def scratch_database(pg_url: str) -> Iterator[str]:
    psql(pg_url, f"drop database if exists {SCRATCH_DB} with (force)")
    psql(pg_url, f"create database {SCRATCH_DB}")
    try:
        yield f"{pg_url.rstrip('/')}/{SCRATCH_DB}"
    finally:
        psql(pg_url, f"drop database if exists {SCRATCH_DB} with (force)")


@contextlib.contextmanager
def prefect_server(*, home: Path, db_url: str | None, log: Path, timeout: float = 120) -> Iterator[str]:
    port = free_port()
    env = {**clean_env(), "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           # Prefect 3.8 hides SQLite lock errors from the server log unless asked to log retryable errors.
           "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"}
    if db_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = db_url
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"prefect server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"prefect server not healthy after {timeout:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"{base}/api"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_child(kind: str, *, api_url: str, home: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**clean_env(), "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home), "PREFECT_LOGGING_LEVEL": "WARNING",
           # lets BackoffCounter see the slot service's 423 waits (its logger is gated by this setting)
           "PREFECT_LOGGING_INTERNAL_LEVEL": "DEBUG"}
    cmd = [sys.executable, __file__, "--child", kind, "--tasks", str(args.tasks), "--limit", str(args.limit),
           "--sleep", str(args.sleep)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=home, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": float("nan"), "timed_out": True}
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{kind} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def bench_backend(backend: str, *, args: argparse.Namespace, workdir: Path) -> dict:
    home = workdir / backend
    home.mkdir()
    log = home / "server.log"
    with contextlib.ExitStack() as stack:
        db_url = stack.enter_context(scratch_database(args.pg_url)) if backend == "postgres" else None
        api_url = stack.enter_context(prefect_server(home=home / "server-home", db_url=db_url, log=log))
        runs: dict[str, list[dict]] = {"limited": [], "unlimited": []}
        for _ in range(args.repeat):
            for kind in ("limited", "unlimited"):
                before = log.read_text(errors="replace").count(LOCKED)
                result = run_child(kind, api_url=api_url, home=home, args=args)
                time.sleep(1)  # let the server finish logging what the run caused
                result["locked_lines"] = log.read_text(errors="replace").count(LOCKED) - before
                runs[kind].append(result)
                print(f"  {backend:8s} {kind:9s} {result['seconds']:7.2f} s  peak in flight "
                      f"{result.get('peak_in_flight', '-')}  '{LOCKED}' lines {result['locked_lines']}",
                      file=sys.stderr, flush=True)
    ideal = args.tasks / args.limit * args.sleep

    def median(kind: str) -> float:
        done = [r["seconds"] for r in runs[kind] if not r.get("timed_out")]
        return statistics.median(done) if done else float("nan")

    def median_of(kind: str, key: str) -> float:
        done = [r[key] for r in runs[kind] if key in r]
        return statistics.median(done) if done else float("nan")

    limited, unlimited = median("limited"), median("unlimited")
    return {
        "backend": backend,
        "ideal_s": ideal,
        "limited_median_s": limited,
        "efficiency": ideal / limited,
        "limited_peak_in_flight": max((r.get("peak_in_flight", 0) for r in runs["limited"]), default=0),
        "limited_timeouts": sum(bool(r.get("timed_out")) for r in runs["limited"]),
        "locked_lines_limited": [r["locked_lines"] for r in runs["limited"]],
        "locked_lines_unlimited": [r["locked_lines"] for r in runs["unlimited"]],
        "limited_median_retries_503": median_of("limited", "retries_503"),
        "limited_median_backoff_s_503": median_of("limited", "backoff_s_503"),
        "limited_median_retries_423": median_of("limited", "retries_423"),
        "unlimited_median_s": unlimited,
        "unlimited_ideal_s": args.sleep,
        "runs": runs,
    }


def print_table(results: list[dict], args: argparse.Namespace) -> None:
    print(f"{args.tasks} async tasks x {args.sleep * 1000:.0f} ms, tag limit {args.limit} "
          f"(ideal {results[0]['ideal_s']:.2f} s), {args.repeat} runs each, {os.cpu_count()} cores")
    print(f"{'backend':9s} {'limited':>8s} {'effic.':>7s} {'peak':>5s} {'locked lines/run':>17s} "
          f"{'503 retries':>12s} {'503 wait':>9s} {'423s':>5s} {'no limit':>9s} {'locked':>7s}")
    for r in results:
        print(f"{r['backend']:9s} {r['limited_median_s']:7.2f}s {r['efficiency'] * 100:6.1f}% "
              f"{r['limited_peak_in_flight']:5d} {'/'.join(map(str, r['locked_lines_limited'])):>17s} "
              f"{r['limited_median_retries_503']:12.0f} {r['limited_median_backoff_s_503']:8.1f}s "
              f"{r['limited_median_retries_423']:5.0f} {r['unlimited_median_s']:8.2f}s "
              f"{'/'.join(map(str, r['locked_lines_unlimited'])):>7s}"
              + (f"  ({r['limited_timeouts']} limited runs timed out after {args.timeout:.0f} s)"
                 if r["limited_timeouts"] else ""))
    print(f"limited / no limit: median wall time of the flow call; effic. = ideal / limited; peak = most tasks in "
          f"their body at once (<= {args.limit}); locked lines = server-log lines with '{LOCKED}' (one failed request "
          "logs 4); 503 retries / wait / 423s = client-side medians per limited run (Prefect serialises slot "
          f"acquisition per tag, so these waits add up); no-limit ideal is {args.sleep:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", nargs="+", choices=["sqlite", "postgres"], default=["sqlite", "postgres"])
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server URL (no database) for the scratch database")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before a run is abandoned")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=["limited", "unlimited"])
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    with tempfile.TemporaryDirectory(prefix="bench-prefect-limits-") as tmp:
        results = [bench_backend(backend, args=args, workdir=Path(tmp)) for backend in args.backends]
    if args.json:
        print(json.dumps({"tasks": args.tasks, "limit": args.limit, "sleep_s": args.sleep, "repeat": args.repeat,
                          "results": results}, indent=2))
    else:
        print_table(results, args)


if __name__ == "__main__":
    main()
