"""Benchmark: a run killed half-way (SIGKILL) and run again sends only the prompts with no stored answer.

``llm-dispatch run FILE`` as a user runs it (all real-time), against the simulator in its own process and a SQLite
file. When ``--kill-at`` of the prompts have a stored answer the run gets SIGKILL (no chance to flush or clean
up); the same command then runs to the end. Checked and reported:

- the second run's requests (the simulator's counter) = prompts - answers stored before the kill;
- every prompt has exactly one stored success, and one paid row;
- answers lost in the kill: requests the first run made whose answers were not stored (in flight, or received
  in the writer's last interval), each paid twice;
- the second run's wall time, and both runs' peak RSS.

    PREFECT_API_URL=http://127.0.0.1:4299/api python bench/resume.py --prompts 1000000 [--kill-at 0.5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from realtime import ROOT, make_prompts  # bench/ is the script's folder, first on sys.path


def stored_successes(db: Path, *, strict: bool = False) -> int:
    """Answers committed so far; 0 while the file or its tables are not made yet (unless ``strict``)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
            return conn.execute("SELECT COUNT(*) FROM results WHERE status = 'succeeded'").fetchone()[0]
    except sqlite3.OperationalError as exc:
        if strict or not ("no such table" in str(exc) or "unable to open" in str(exc)):
            raise
        return 0


def settled_requests(base_url: str) -> int:
    """The simulator's request count once nothing is in flight and it has stopped moving for 0.5 s: requests a
    killed client wrote before it died may still be on their way into the server."""
    def stats() -> dict[str, int]:
        return httpx.get(base_url.removesuffix("/v1") + "/_sim/stats", timeout=10).raise_for_status().json()

    last = stats()
    while True:
        time.sleep(0.5)
        now = stats()
        if now["in_flight"] == 0 and now["requests_total"] == last["requests_total"]:
            return now["requests_total"]
        last = now


def start(prompts: Path, *, db: Path, base_url: str, concurrency: int, out: Path) -> subprocess.Popen[bytes]:
    """``llm-dispatch run`` in a child, in its own process group (Prefect's temporary server, if it starts
    one, dies with it); its stdout to ``out``, its stderr to ``out`` + ``.err``."""
    env = {**os.environ, "LLM_DISPATCH_BASE_URL": base_url, "LLM_DISPATCH_DATABASE_URL": f"sqlite+aiosqlite:///{db}",
           "LLM_DISPATCH_CONCURRENCY": str(concurrency), "PREFECT_LOGGING_LEVEL": "WARNING"}
    with out.open("wb") as stdout, Path(f"{out}.err").open("wb") as stderr:  # the child keeps its own copies
        return subprocess.Popen([sys.executable, "-m", "llm_dispatch.cli.main", "run", str(prompts), "--route", "all-realtime",
                                 "--json"], env=env, cwd=ROOT, stdout=stdout, stderr=stderr, start_new_session=True)


def reap(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Wait for the child: its exit code and its peak RSS in MB."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait for it again
    return proc.returncode, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--kill-at", type=float, default=0.5, help="fraction of prompts answered before SIGKILL")
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.02)
    args = parser.parse_args()
    if not 0 < args.kill_at < 1:
        raise SystemExit("--kill-at must be between 0 and 1")

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    print(f"{args.prompts:,} prompts, concurrency {args.concurrency}, simulator latency {args.latency * 1000:.0f} ms, "
          f"kill at {args.kill_at:.0%} answered, PREFECT_API_URL={os.environ.get('PREFECT_API_URL', '(ephemeral)')}")
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp, \
            Simulator.in_process(SimulatorConfig(latency=args.latency)) as base_url:
        prompts, db = Path(tmp) / "prompts.jsonl", Path(tmp) / "resume.db"
        make_prompts(prompts, args.prompts)

        started = time.perf_counter()
        first = start(prompts, db=db, base_url=base_url, concurrency=args.concurrency, out=Path(tmp) / "first")
        target = int(args.prompts * args.kill_at)
        while True:
            if first.poll() is not None:
                raise SystemExit(f"the first run ended (exit {first.returncode}) before the kill (lower --kill-at):"
                                 f"\n{(Path(tmp) / 'first.err').read_text()[-3000:]}")
            if stored_successes(db) >= target:
                break
            time.sleep(0.2 if args.prompts <= 100_000 else 1.0)  # a COUNT over the results each time
        os.killpg(first.pid, signal.SIGKILL)
        _, first_rss = reap(first)
        killed_after = time.perf_counter() - started
        kept = stored_successes(db, strict=True)
        sent_first = settled_requests(base_url)
        if kept == args.prompts:
            raise SystemExit("every prompt was answered before the kill: lower --kill-at or give more --prompts")

        started = time.perf_counter()
        second = start(prompts, db=db, base_url=base_url, concurrency=args.concurrency, out=Path(tmp) / "second")
        code, second_rss = reap(second)
        again_s = time.perf_counter() - started
        if code != 0:
            raise SystemExit(f"the second run failed (exit {code}):\n"
                             f"{(Path(tmp) / 'second.err').read_text()[-3000:]}")
        summary = json.loads((Path(tmp) / "second").read_text())
        sent_second = settled_requests(base_url) - sent_first

        with contextlib.closing(sqlite3.connect(db)) as conn:
            per_prompt = dict(conn.execute(
                "SELECT n, COUNT(*) FROM (SELECT COUNT(*) AS n FROM results WHERE status = 'succeeded' "
                "GROUP BY prompt_id) GROUP BY n").fetchall())
            paid = conn.execute("SELECT COUNT(*) FROM results WHERE status = 'succeeded' AND route = 'realtime'"
                                ).fetchone()[0]
            prompt_rows = conn.execute("SELECT COUNT(*) FROM prompts").fetchone()[0]

    unfinished = args.prompts - kept
    print(f"first run: killed after {killed_after:.1f} s with {kept:,} answers stored; it had made {sent_first:,} "
          f"requests, so {sent_first - kept:,} answers were lost in the kill (sent again, paid twice)")
    print(f"second run: {again_s:.1f} s (the whole command), resumed={summary.get('resumed')}, "
          f"counts {summary.get('counts')}")
    print(f"second run's requests {sent_second:,}; prompts without a stored answer at the kill {unfinished:,}: "
          f"{'EQUAL' if sent_second == unfinished else 'DIFFERENT'}")
    print(f"stored successes per prompt {{count: prompts}} {per_prompt}; paid rows {paid:,}; prompt rows "
          f"{prompt_rows:,}")
    print(f"peak RSS: first run {first_rss:.0f} MB, second run {second_rss:.0f} MB")
    ok = (sent_second == unfinished and per_prompt == {1: args.prompts} and paid == args.prompts
          and prompt_rows == args.prompts and summary.get("counts") == {"succeeded": args.prompts})
    print("RESUME OK" if ok else "RESUME WRONG")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
