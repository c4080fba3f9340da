"""Benchmark helper: a whole ``llm-dispatch`` command's CPU seconds by thread (user and system), Linux only.

    PREFECT_API_URL=http://127.0.0.1:4377/api LLM_DISPATCH_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=sk-x \\
        python bench/threads.py [--repeat 3] -- run prompts.jsonl --concurrency 400 --database-url sqlite+aiosqlite:///x.db

Runs the command in a child process whose threads carry their Python names as their kernel names (``prctl``;
CPython 3.11 leaves them unnamed), reads every thread's CPU from ``/proc/PID/task/TID/stat`` five times a second
and prints, per repeat and as medians, the CPU seconds of each named thread group (``_connection_worker_thread``:
aiosqlite's, one per pooled connection; ``GlobalEventLoopThread``, ``APILogWorkerThread``, ``EventsWorkerThread``:
Prefect's client services) next to the whole process's (``getrusage``). "unattributed" is what no poll saw:
threads that ended between two polls and the last fifth of a second of the others. Each repeat runs the same
arguments; a ``--database-url`` file is removed before each (a second run would resume the first job).
``--statements`` also times, in CPU seconds of the connection's thread, each
driver call aiosqlite runs (statements by their first 70 characters, commits, fetches) and prints the top 15.
Start the simulator as its own process (``python -m llm_dispatch.simulator --port 8000 --latency 0.2``) so its CPU
is not counted in the command's.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

POLL_SECONDS = 0.2
PR_SET_NAME = 15
STATEMENTS_ENV = "LLMD_THREADS_STATEMENTS"  # the child writes its driver calls' CPU seconds to this file
# A kernel thread name holds 15 bytes; Prefect's and aiosqlite's thread names are told apart by their first 15.
GROUPS = (
    ("_connection_wor", "aiosqlite connections"),
    ("GlobalEventLoop", "Prefect GlobalEventLoopThread"),
    ("APILogWorkerThr", "Prefect APILogWorkerThread"),
    ("EventsWorkerThr", "Prefect EventsWorkerThread"),
    ("ConcurrencySlot", "Prefect concurrency-slot leases"),
    ("run", "Prefect flow-run heartbeat"),  # "Thread-N (run)"
    ("asyncio_", "asyncio default executor"),
)


def child(argv: list[str]) -> None:
    """Run ``llm-dispatch ARGV`` in this process, each Python thread named in the kernel as in Python."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        # "Thread-3 (_connection_worker_thread)": the target's name is the part worth keeping.
        found = re.search(r"\((\w+)\)", self.name)
        libc.prctl(PR_SET_NAME, (found.group(1) if found else self.name).encode()[:15], 0, 0, 0)
        bootstrap(self)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]
    if os.environ.get(STATEMENTS_ENV):
        _time_statements(Path(os.environ[STATEMENTS_ENV]))
    sys.argv = ["llm-dispatch", *argv]
    from llm_dispatch.cli.main import main

    main()


def _time_statements(out: Path) -> None:
    """Time each call aiosqlite runs in its connection's thread, in that thread's CPU seconds; written at exit."""
    import atexit
    from typing import Any

    import aiosqlite.core

    calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    execute: Any = aiosqlite.core.Connection._execute

    async def timed_execute(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        sql = args[0] if args and isinstance(args[0], str) else ""
        key = f"{getattr(fn, '__name__', fn)} {' '.join(sql.split())[:70]}"

        def timed(*a: Any, **k: Any) -> Any:
            began = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                calls[key][0] += 1
                calls[key][1] += time.thread_time() - began

        return await execute(self, timed, *args, **kwargs)

    aiosqlite.core.Connection._execute = timed_execute  # type: ignore[method-assign]

    @atexit.register
    def write() -> None:
        lines = [f"{seconds:7.2f} {int(n):6d}  {key}" for key, (n, seconds) in
                 sorted(calls.items(), key=lambda kv: -kv[1][1])]
        out.write_text(f"{sum(s for _, s in calls.values()):7.2f} {'calls':>6}  every driver call\n" +
                       "\n".join(lines[:15]) + "\n")


def measure(argv: list[str], *, log: Path, statements: Path | None = None) -> dict[str, float]:
    """One run of the command: CPU seconds by thread group, the whole process's, its wall time."""
    tick = os.sysconf("SC_CLK_TCK")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with log.open("w") as out:
        env = {**os.environ, **({STATEMENTS_ENV: str(statements)} if statements is not None else {})}
        process = subprocess.Popen([sys.executable, __file__, "--child", "--", *argv], stdout=out,
                                   stderr=subprocess.STDOUT, env=env)
        seen: dict[str, tuple[str, float, float]] = {}  # tid: (name, user s, system s), as last polled
        while process.poll() is None:
            for tid in _tids(process.pid):
                try:
                    stat = Path(f"/proc/{process.pid}/task/{tid}/stat").read_text()
                except OSError:
                    continue  # ended since the listing
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                seen[tid] = (name, int(fields[11]) / tick, int(fields[12]) / tick)
            time.sleep(POLL_SECONDS)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode not in (0, 1):
        raise SystemExit(f"llm-dispatch {' '.join(argv[:3])} exited {process.returncode}; see {log}")
    row: dict[str, float] = defaultdict(float)
    row["wall"] = time.monotonic() - started
    row["TOTAL (getrusage)"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    row["  of which system"] = after.ru_stime - before.ru_stime
    main_tid = str(process.pid)
    for tid, (name, user, system) in seen.items():
        group = "main thread" if tid == main_tid else next(
            (label for prefix, label in GROUPS if name.startswith(prefix)), f"other ({name})")
        row[group] += user + system
        row[f"  {group}: system"] += system
    row["unattributed"] = row["TOTAL (getrusage)"] - sum(user + system for _, user, system in seen.values())
    return row


def _tids(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # the process ended since poll()


def _database_file(argv: list[str]) -> Path | None:
    if "--database-url" in argv[:-1]:
        url = argv[argv.index("--database-url") + 1]
        if url.startswith("sqlite") and "///" in url:
            return Path(url.split("///", 1)[1])
    return None


def main() -> None:
    if sys.argv[1:3] == ["--child", "--"]:
        child(sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--log", type=Path, default=Path("threads-run.log"), help="the command's output, last run")
    parser.add_argument("--statements", action="store_true", help="also each driver call's CPU seconds (last run)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then llm-dispatch's arguments")
    args = parser.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        parser.error("give the command's arguments after --")
    database = _database_file(argv)
    rows = []
    for n in range(args.repeat):
        if database is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{database}{suffix}").unlink(missing_ok=True)
        load = os.getloadavg()[0]
        statements = args.log.with_suffix(".statements") if args.statements else None
        rows.append(measure(argv, log=args.log, statements=statements))
        print(f"run {n + 1}: {rows[-1]['wall']:.1f} s wall, {rows[-1]['TOTAL (getrusage)']:.2f} s CPU, "
              f"load {load:.2f} at start", flush=True)
    names = sorted({name for row in rows for name in row if name != "wall"},
                   key=lambda name: (name.startswith("  "), -statistics.median(row.get(name, 0.0) for row in rows)))
    print(f"\nCPU seconds by thread (median of {len(rows)}; each run)")
    for name in names:
        values = [row.get(name, 0.0) for row in rows]
        print(f"  {name:<44} {statistics.median(values):7.2f}   ({', '.join(f'{v:.2f}' for v in values)})")
    if args.statements:
        print("\nthe connections' CPU seconds by driver call (last run: seconds, calls, call)")
        print(args.log.with_suffix(".statements").read_text(), end="")


if __name__ == "__main__":
    main()
