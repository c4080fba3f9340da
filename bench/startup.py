"""Benchmark: where a small job's fixed seconds go, over the whole ``llm-dispatch run`` process, against the
bare aiohttp + Semaphore loop on the same file in the same run.

Each repeat runs two fresh processes, alternating: the bare loop (interpreter, aiohttp, read the file, send) and
``llm-dispatch run FILE --concurrency C`` into a new SQLite file. Both are timed from outside (spawn to reap,
with the child's CPU seconds; and the Prefect server's, given ``--server-pid``). Inside the command, probes put
on the functions of each step as their modules load (no code changed, the import order kept) stamp when each
step begins and ends, so the whole process splits into rows: interpreter start-up, imports (new modules only,
on the main thread), settings, the price table, each pass over the input, the database, flow-run and task-run
creation, the tag limit, the estimate, planning, the send phase (first request to last result stored), the
report queries, artifacts, the flow run's end, the printed summary and the process exit. A row is its steps'
wall time less the imports inside them; "other" is what no row covers. Rows are medians over the repeats.

Needs a running Prefect server (a temporary one would be most of what is measured):

    PREFECT_HOME=/tmp/x PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/x \\
        prefect server start --port 4377 &
    PREFECT_API_URL=http://127.0.0.1:4377/api python bench/startup.py [--prompts 10000] [--concurrency 400] \\
        [--latency 0.2] [--repeat 3] [--server-pid PID] [--profile DIR] [--reports [--reports-prompts 100000]
        [--reports-only]]

``--rate-429 0.2`` has the simulator answer a share of requests 429 (Retry-After ``--retry-after``), and the bare
loop retry as ``bench/ratelimits.py``'s does. ``--profile DIR`` adds one run under pyinstrument (``pip install
pyinstrument``; not a dependency) and one under ``python -X importtime``, and writes the whole-process profile
and the import times by package to DIR. ``--reports`` then times ``llm-dispatch status JOB`` and ``export JOB``
(jsonl, csv, parquet) on the first run's database with no Prefect server configured, and says whether either
started one; ``--reports-prompts N`` times them on a database of N prompts made by one more run instead
(``--reports-only``: that alone, no run comparison). For a closer look
at one step, ``LLMD_STARTUP_PROBES=MODULE:ATTRIBUTE:LABEL:KIND,...`` adds probes (kinds as in ``PROBES``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TIMELINE_ENV = "LLMD_STARTUP_TIMELINE"
PROFILE_ENV = "LLMD_STARTUP_PROFILE"
# More probes for a closer look, as MODULE:ATTRIBUTE.PATH:LABEL:KIND,... (kinds as in PROBES).
EXTRA_PROBES_ENV = "LLMD_STARTUP_PROBES"


# --- the child: probes ------------------------------------------------------------------------------------------
#
# (module, attribute path, label, kind). Kinds: "sync" / "async" functions, "call" (returns a value or a coroutine:
# Flow.__call__, Task.__call__, labelled by the flow's or task's name), "acm" (returns an async context manager),
# "gen" (a generator: one pass over the input), "classmethod". A probe goes on right after its module runs, before
# any importer binds the name.
PROBES: list[tuple[str, str, str, str]] = [
    ("llm_dispatch.cli._common", "_settings", "settings", "sync"),
    ("llm_dispatch.cli.main", "_check_keys", "key check", "sync"),
    ("llm_dispatch.cli.main", "_run_with_progress", "cli flow call", "async"),
    ("llm_dispatch.cli.main", "_print_summary", "summary print", "sync"),
    ("llm_dispatch.core._settings", "Settings.with_overrides", "settings", "classmethod"),
    ("llm_dispatch.core.pricing._pricing", "PriceTable.load", "price table", "classmethod"),
    ("llm_dispatch.core.inputs._input_files", "_jsonl_records", "input pass", "gen"),
    ("llm_dispatch.core.inputs._input_files", "_csv_records", "input pass", "gen"),
    ("llm_dispatch.core.sending._dispatch", "send_all", "send_all", "async"),
    ("llm_dispatch.jobs._record", "PromptInput.check", "input check", "sync"),
    ("llm_dispatch.jobs._plan", "plan_realtime", "planning", "async"),
    ("llm_dispatch.jobs._costs", "estimate_cost", "cost estimate", "async"),
    ("llm_dispatch.jobs._summary", "job_report", "report queries", "async"),
    ("llm_dispatch.storage._engine", "create_engine", "database open", "sync"),
    ("llm_dispatch.storage._migrate", "migrate", "migration check", "async"),
    ("llm_dispatch.storage._writer", "ResultWriter.__aexit__", "writer close", "async"),
    ("llm_dispatch.storage._writer", "ResultWriter.mark_in_flight", "mark in flight", "async"),
    ("llm_dispatch.storage", "find_job", "job rows", "async"),
    ("llm_dispatch.storage", "get_job", "job rows", "async"),
    ("llm_dispatch.storage", "create_job", "job rows", "async"),
    ("llm_dispatch.storage", "set_job_status", "job rows", "async"),
    ("llm_dispatch.storage", "add_prompts", "store", "async"),
    ("llm_dispatch.storage", "job_counts", "report queries", "async"),
    ("llm_dispatch.storage", "result_stats", "report queries", "async"),
    ("llm_dispatch.flows._setup", "with_api_key", "settings", "async"),
    ("llm_dispatch.flows._setup", "ensure_tag_limit", "tag limit (flow)", "async"),
    ("llm_dispatch.flows._setup", "tune_gc", "gc freeze", "sync"),
    ("llm_dispatch.flows._artifacts", "publish_report", "artifacts", "async"),
    ("llm_dispatch.flows._artifacts", "ProgressBoard._create", "artifacts (progress, background)", "async"),
    ("llm_dispatch.flows._artifacts", "ProgressBoard.close", "artifacts", "async"),
    # The flow's and tasks' bodies by what they call first (a wrapped .fn would change how Prefect reads them).
    ("llm_dispatch.flows.dispatch", "run_dispatch", "flow body", "async"),
    ("llm_dispatch.jobs._record", "record_job", "task body record-prompts", "async"),
    ("llm_dispatch.storage", "load_work", "task body send-chunk", "async"),
    ("prefect.flows", "Flow.__call__", "flow call", "call"),
    ("prefect.tasks", "Task.__call__", "task call", "call"),
    ("prefect.task_engine", "_aconcurrency", "tag slots (task)", "acm"),
    ("prefect.client.base", "PrefectHttpxAsyncClient.send", "api", "async"),
    ("prefect.client.base", "PrefectHttpxSyncClient.send", "api", "sync"),
]


def child_cli(argv: list[str]) -> None:
    """Run ``llm-dispatch ARGV`` in this process with the probes on; the timeline goes to $LLMD_STARTUP_TIMELINE."""
    import atexit
    import builtins
    import functools
    import importlib
    import importlib.abc
    import inspect
    import re
    import threading

    born, born_cpu = time.time(), time.thread_time()
    # (wall, main thread's CPU seconds) at every stamp taken on the main thread: rows in CPU seconds too.
    clock: list[tuple[float, float]] = [(born, born_cpu)]
    events: list[tuple[str, float, float]] = []  # (label, start, end), wall clock
    imports: list[tuple[float, float, bool]] = []  # (start, end, main thread) of imports that loaded modules
    main = threading.main_thread()
    local = threading.local()

    def stamp() -> float:
        now = time.time()
        if threading.current_thread() is main:
            clock.append((now, time.thread_time()))
        return now

    uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

    profiler = None
    if os.environ.get(PROFILE_ENV):
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001, async_mode="disabled")
        profiler.start()

    def timed_import(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(local, "depth", 0):
                return original(*args, **kwargs)
            before, start = len(sys.modules), stamp()
            local.depth = 1
            try:
                return original(*args, **kwargs)
            finally:
                local.depth = 0
                if len(sys.modules) != before:
                    imports.append((start, stamp(), threading.current_thread() is main))
        return wrapper

    builtins.__import__ = timed_import(builtins.__import__)
    importlib.import_module = timed_import(importlib.import_module)

    def label_of(label: str, args: tuple[Any, ...]) -> str:
        if label in ("flow call", "task call"):
            return f"{label} {getattr(args[0], 'name', '?')}"
        if label == "api":
            request = args[1]
            return f"api {request.method} {uuid.sub('{id}', request.url.path)}"
        return label

    def probe(function: Any, label: str, kind: str) -> Any:
        if kind == "async":
            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                start = stamp()
                try:
                    return await function(*args, **kwargs)
                finally:
                    events.append((label_of(label, args), start, stamp()))
            return async_wrapper
        if kind == "gen":
            @functools.wraps(function)
            def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
                start, lines = stamp(), 0
                try:
                    for item in function(*args, **kwargs):
                        lines += 1
                        yield item
                finally:
                    events.append((f"{label} {lines}", start, stamp()))
            return gen_wrapper
        if kind == "acm":
            @functools.wraps(function)
            def acm_wrapper(*args: Any, **kwargs: Any) -> Any:
                return _TimedContext(function(*args, **kwargs), label, events, stamp)
            return acm_wrapper

        @functools.wraps(function)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            start = stamp()
            result = function(*args, **kwargs)
            name = label_of(label, args)
            if kind == "call" and inspect.isawaitable(result):
                async def awaited() -> Any:
                    try:
                        return await result
                    finally:
                        events.append((name, start, stamp()))
                return awaited()
            events.append((name, start, stamp()))
            return result
        return sync_wrapper

    def apply(module: Any, path: str, label: str, kind: str) -> None:
        *owners, name = path.split(".")
        owner = module
        for part in owners:
            owner = getattr(owner, part)
        if kind == "classmethod":
            raw = owner.__dict__[name]
            setattr(owner, name, classmethod(probe(raw.__func__, label, "sync")))
        else:
            setattr(owner, name, probe(getattr(owner, name), label, kind))

    extra = [tuple(spec.split(":")) for spec in os.environ.get(EXTRA_PROBES_ENV, "").split(",") if spec]
    wanted: dict[str, list[tuple[str, str, str]]] = {}
    for module_name, path, label, kind in [*PROBES, *extra]:
        wanted.setdefault(module_name, []).append((path, label, kind))

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name not in wanted:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            run_module = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run_module(module)
                for probe_path, label, kind in wanted[name]:
                    apply(module, probe_path, label, kind)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Hook())

    def write() -> None:
        # Registered first, so it runs after every other exit handler (Prefect's included).
        if profiler is not None:
            profiler.stop()
            folder = Path(os.environ[PROFILE_ENV])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "profile.txt").write_text(profiler.output_text(unicode=True, color=False, show_all=False))
            (folder / "profile.html").write_text(profiler.output_html())
        done = stamp()
        Path(os.environ[TIMELINE_ENV]).write_text(json.dumps({
            "born": born, "born_cpu": born_cpu, "done": done, "clock": clock, "events": events, "imports": imports,
            "modules": len(sys.modules), "prefect_imported": "prefect" in sys.modules,
        }))

    atexit.register(write)
    sys.argv = ["llm-dispatch", *argv]
    from llm_dispatch.cli.main import main as cli_main

    cli_main()


class _TimedContext:
    def __init__(self, inner: Any, label: str, events: list[tuple[str, float, float]], stamp: Any) -> None:
        self._inner, self._label, self._events, self._stamp = inner, label, events, stamp

    async def __aenter__(self) -> Any:
        start = self._stamp()
        try:
            return await self._inner.__aenter__()
        finally:
            self._events.append((f"{self._label} acquire", start, self._stamp()))

    async def __aexit__(self, *exc: Any) -> Any:
        start = self._stamp()
        try:
            return await self._inner.__aexit__(*exc)
        finally:
            self._events.append((f"{self._label} release", start, self._stamp()))


def child_baseline(args: argparse.Namespace) -> None:
    """The bare loop as a whole process: interpreter, aiohttp, read the file, send every prompt."""
    import asyncio

    if args.rate_429:
        from ratelimits import Attempts, run_baseline  # bench/ is the script's folder, first on sys.path
        from realtime import MODEL

        items = [{"model": MODEL, "messages": [{"role": "user", "content": json.loads(line)["prompt"]}],
                  "max_tokens": 64} for line in Path(args.prompts_file).read_text().splitlines()]
        result = asyncio.run(run_baseline(base_url=args.base_url, items=items, concurrency=args.concurrency,
                                          attempts=Attempts()))
        # A prompt answered 429 more often than the retries allow is given up, as the command gives it up.
        sys.exit(0 if result["answered"] == len(items) else 1)
    else:
        from realtime import baseline

        asyncio.run(baseline(base_url=args.base_url, prompts=Path(args.prompts_file), concurrency=args.concurrency))


# --- the parent -------------------------------------------------------------------------------------------------

def tree_cpu(pid: int | None, *, database: str | None) -> dict[int, float]:
    """CPU seconds (user + system) of process PID, its children and the PostgreSQL backends serving DATABASE,
    by process (a backend that exits between two readings takes its seconds with it: the sum undercounts)."""
    if pid is None:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        ours = int(entry.name) == pid or fields[1] == str(pid)  # fields[1]: the parent's pid
        backend = database is not None and cmdline.startswith("postgres: ") and f" {database} " in cmdline
        if ours or backend:
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def cpu_since(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def spawn(argv: list[str], *, env: dict[str, str], cwd: Path, server: tuple[int | None, str | None],
          timeout: float) -> dict[str, Any]:
    """Run ARGV as a whole process: wall seconds spawn to reap, its CPU seconds, the server's CPU meanwhile."""
    load = os.getloadavg()[0]
    server_before = tree_cpu(server[0], database=server[1])
    started = time.time()
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise SystemExit(f"{' '.join(argv[:4])} took longer than {timeout:.0f} s")
    ended = time.time()
    # Exit 1: the run ended with failed prompts (a request that met a 429 more times than its retries allow).
    if process.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv[:6])} failed (exit {process.returncode}):\n{err.decode()[-3000:]}")
    return {"started": started, "ended": ended, "wall": ended - started, "load": load, "exit": process.returncode,
            "server_cpu": cpu_since(server_before, tree_cpu(server[0], database=server[1])), "stdout": out.decode()}


def child_cpu(run: dict[str, Any], before: Any) -> None:
    import resource

    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    run["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def rows_of(run: dict[str, Any], timeline: dict[str, Any]) -> dict[str, Any]:
    """The run's rows in wall seconds and in CPU seconds (each less the main-thread imports inside it), its counts."""
    import bisect

    clock = sorted(timeline["clock"])
    walls = [wall for wall, _ in clock]

    def cpu_at(t: float) -> float:
        """The main thread's CPU seconds at wall time T, between the two stamps around it."""
        i = bisect.bisect_left(walls, t)
        if i <= 0:
            return clock[0][1]
        if i >= len(clock):
            return clock[-1][1]
        (w0, c0), (w1, c1) = clock[i - 1], clock[i]
        return c0 + (c1 - c0) * ((t - w0) / (w1 - w0) if w1 > w0 else 1.0)

    wall_rows, counts, api_before = _rows(run, timeline, length=lambda a, b: b - a)
    cpu_rows, _, _ = _rows(run, timeline, length=lambda a, b: cpu_at(b) - cpu_at(a))
    cpu_rows["interpreter start-up"] = timeline["born_cpu"]  # the main thread's CPU before the script's first line
    cpu_rows["process exit (after the command returned)"] = 0.0  # not seen: in "other", with the other threads
    cpu_rows["TOTAL (whole process)"] = run["cpu"]
    covered = sum(v for k, v in cpu_rows.items() if not k.startswith("  ") and k not in (
        "other (between the rows)", "TOTAL (whole process)"))
    cpu_rows["other (between the rows)"] = run["cpu"] - covered
    cpu_rows = {k: cpu_rows[k] for k in wall_rows}
    return {"rows": wall_rows, "cpu_rows": cpu_rows, "counts": counts, "api_before": api_before}


def _rows(
    run: dict[str, Any], timeline: dict[str, Any], *, length: Any
) -> tuple[dict[str, float], dict[str, Any], dict[str, tuple[int, float]]]:
    events = [(label, a, b) for label, a, b in timeline["events"]]
    main_imports = sorted((a, b) for a, b, on_main in timeline["imports"] if on_main)

    def overlap(start: float, end: float) -> float:
        return sum(length(max(start, a), min(end, b)) for a, b in main_imports if min(end, b) > max(start, a))

    def spans(*prefixes: str, before: float | None = None, after: float | None = None) -> list[tuple[float, float]]:
        """Spans of these labels, clipped to end by ``before`` / begin at ``after``."""
        found = []
        for label, a, b in events:
            if label.startswith(prefixes):
                a, b = max(a, after or a), min(b, before or b)
                if b > a:
                    found.append((a, b))
        return found

    def seconds(found: list[tuple[float, float]]) -> float:
        return sum(length(a, b) - overlap(a, b) for a, b in found)

    send_starts = [a for a, _ in spans("send_all")]
    send_from = min(send_starts)
    send_to = max(b for _, b in spans("writer close"))
    flow_call = spans("flow call dispatch")[0]
    flow_body = spans("flow body")[0]
    chunk_calls = sorted(spans("task call send-chunk"))
    chunk_bodies = sorted(spans("task body send-chunk", "mark in flight"))
    record_call = spans("task call record-prompts")[0]
    record_body = spans("task body record-prompts")[0]
    checks = sorted(spans("input check"))
    passes = sorted((a, b, label) for label, a, b in events if label.startswith("input pass"))
    first_tag = [(a, b) for a, b in spans("tag slots (task) acquire") if a >= chunk_calls[0][0]][:1]
    cli_call = spans("cli flow call")[0]
    row: dict[str, float] = {
        "interpreter start-up": timeline["born"] - run["started"],
        "imports (main thread, new modules)": sum(length(a, b) for a, b in main_imports),
        "settings": seconds(spans("settings")),
        "price table (x{n})".format(n=len(spans("price table"))): seconds(spans("price table")),
        "input check: the CLI's": seconds(checks[:1]),
        "input check: the flow's": seconds(checks[1:2]),
        "input store (before sending)": seconds(spans("store", before=send_from)),
        "database open and migration check": seconds(spans("database open", "migration check")),
        "job rows (find, create, status)": seconds(spans("job rows", before=send_from)),
        "flow-run creation and renaming": seconds([(flow_call[0], flow_body[0])])
        - seconds([(a, b) for a, b in spans("settings") if flow_call[0] <= a < flow_body[0]]),
        "record-prompts task run (Prefect, less its body)": seconds([record_call]) - seconds([record_body]),
        "tag-limit check (flow: read the limit)": seconds(spans("tag limit (flow)")),
        "gc freeze": seconds(spans("gc freeze")),
        "cost estimate (queries)": seconds(spans("cost estimate")),
        "planning before the first chunk": seconds(spans("planning", before=send_from)),
        "first chunk's task run until its body": seconds([(chunk_calls[0][0], chunk_bodies[0][0])]),
        "  of which the tag-limit slot (task)": seconds(first_tag),
        "first chunk's body until its first request": seconds([(chunk_bodies[0][0], send_from)])
        - seconds(spans("store", before=send_from, after=chunk_bodies[0][0])),
        "send phase (first request to last result stored)": length(send_from, send_to),
        "report queries (after sending)": seconds(spans("report queries", after=send_to))
        + seconds(spans("job rows", after=send_to)),
        "artifacts (report, progress close)": seconds(spans("artifacts", after=send_to)),
        "flow-run end (Prefect)": seconds([(flow_body[1], flow_call[1])]),
        "summary print": seconds(spans("summary print")),
        "process exit (after the command returned)": run["ended"] - timeline["done"],
    }
    total = run["wall"]
    covered = sum(v for k, v in row.items() if not k.startswith("  "))
    row["other (between the rows)"] = total - covered
    windows = {
        "imports: the CLI, up to its flow call": (timeline["born"], cli_call[0]),
        "imports: the flow's modules (prefect...)": (cli_call[0], flow_call[0]),
        "imports: Prefect creating the flow run": (flow_call[0], flow_body[0]),
        "imports: in the flow, before the first request": (flow_body[0], send_from),
        "imports: from the first request on": (send_from, timeline["done"]),
    }
    for name, (a, b) in windows.items():
        row["  " + name] = overlap(a, b)
    row["TOTAL (whole process)"] = total
    order = [k for k in row if not k.startswith("  imports:")]
    at = order.index("imports (main thread, new modules)") + 1
    order[at:at] = [k for k in row if k.startswith("  imports:")]
    row = {k: row[k] for k in order}
    api_before = [(label, a, b) for label, a, b in events if label.startswith("api") and a < send_from]
    counts = {
        "input passes (files opened and read)": len(passes),
        "input lines per pass": ",".join(label.rsplit(" ", 1)[1] for _, _, label in passes),
        "Prefect API calls before the first request": len(api_before),
        "  their seconds": sum(b - a for _, a, b in api_before),
        "Prefect API calls in all": len(spans("api")),
        "send-chunk task runs": len(chunk_calls),
        "modules loaded": timeline["modules"],
        "seconds from spawn to the flow run's body": flow_body[0] - run["started"],
        "seconds from spawn to the first request": send_from - run["started"],
        "cli: flow call to its return": cli_call[1] - cli_call[0],
    }
    calls: dict[str, list[float]] = {}
    for label, a, b in api_before:
        calls.setdefault(label, []).append(b - a)
    return row, counts, {k: (len(v), sum(v)) for k, v in calls.items()}


def import_times(argv: list[str], *, env: dict[str, str], cwd: Path, out: Path) -> None:
    """One run under ``python -X importtime``: each import's own seconds, summed by top-level package."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env={**env, PROFILE_ENV: ""}, cwd=cwd,
                          capture_output=True, text=True)
    by_package: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
            top = name.split(".")[0]
            by_package[top] = by_package.get(top, 0.0) + int(own) / 1e6
    total = sum(by_package.values())
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"imports of one run, by top-level package (own time, under -X importtime): {total:.3f} s"]
    lines += [f"  {name:<28} {secs:6.3f}" for name, secs in sorted(by_package.items(), key=lambda kv: -kv[1])[:25]]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:16]))


def make_prompts(path: Path, count: int) -> None:
    from realtime import make_prompts as write  # bench/ is the script's folder, first on sys.path

    write(path, count)


def reports_database(*, workdir: Path, count: int, env: dict[str, str], python: str, concurrency: int) -> Path:
    """A database of COUNT answered prompts, made as a user makes one: ``llm-dispatch run FILE`` (to the simulator)."""
    prompts, database = workdir / f"reports-{count}.jsonl", workdir / f"reports-{count}.db"
    make_prompts(prompts, count)
    started = time.time()
    subprocess.run([str(Path(python).parent / "llm-dispatch"), "run", str(prompts), "--concurrency", str(concurrency),
                    "--database-url", f"sqlite+aiosqlite:///{database}"],
                   env=env, cwd=workdir, capture_output=True, check=True, timeout=max(900, count / 50))
    print(f"\nreports database: {count:,} prompts run in {time.time() - started:.0f} s")
    return database


def reports(*, workdir: Path, database: Path, repeat: int, python: str, timeout: float) -> None:
    """``status JOB`` and ``export JOB`` (jsonl, csv, parquet) on DATABASE with no Prefect server configured, as whole
    processes: wall seconds, and the process's CPU seconds (the machine may be shared)."""
    import resource
    import sqlite3

    with sqlite3.connect(database) as connection:
        job, prompts = connection.execute(
            "SELECT jobs.id, count(prompts.id) FROM jobs JOIN prompts ON prompts.job_id = jobs.id GROUP BY jobs.id"
        ).fetchone()
    home = workdir / "prefect-home-unset"
    home.mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(home)
    url = f"sqlite+aiosqlite:///{database}"
    exported = workdir / "export.out"
    commands = {
        "status JOB": ["status", job, "--database-url", url],
        "export JOB -o FILE": ["export", job, "--database-url", url, "-o", str(exported)],
        "export JOB --format csv": ["export", job, "--database-url", url, "--format", "csv", "-o", str(exported)],
        "export JOB --format parquet": ["export", job, "--database-url", url, "--format", "parquet", "-o",
                                        str(exported)],
    }
    command = str(Path(python).parent / "llm-dispatch")
    print(f"\nreports on a {prompts:,}-prompt SQLite database, PREFECT_API_URL unset, PREFECT_HOME empty "
          f"(median of {repeat}; a temporary Prefect server would leave a database in PREFECT_HOME)")
    for name, argv in commands.items():
        walls, cpus = [], []
        for _ in range(repeat):
            exported.unlink(missing_ok=True)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.time()
            try:
                subprocess.run([command, *argv], env=env, cwd=workdir, capture_output=True, timeout=timeout, check=True)
            except subprocess.TimeoutExpired:
                print(f"  llm-dispatch {name:<28} did not finish in {timeout:.0f} s")
                break
            walls.append(time.time() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        started_server = any(home.rglob("*.db"))
        if walls:
            print(f"  llm-dispatch {name:<28} {statistics.median(walls):6.2f} s wall, {statistics.median(cpus):5.2f} s "
                  f"CPU  (runs {', '.join(f'{w:.2f}' for w in walls)}; load {os.getloadavg()[0]:.2f}; temporary "
                  f"Prefect server: {'yes' if started_server else 'no'})")
    probe = subprocess.run([python, "-c", "import sys; from llm_dispatch.cli import reports, main; "
                            "print('prefect' in sys.modules, len(sys.modules))"],
                           env=env, capture_output=True, text=True, check=True)
    print(f"  after importing the CLI and its reports: prefect imported {probe.stdout.split()[0]}, "
          f"{probe.stdout.split()[1]} modules")


def main() -> None:
    if sys.argv[1:3] == ["--child", "cli"]:
        child_cli(sys.argv[3:])  # the rest is the command's own arguments, untouched
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--rate-429", type=float, default=0.0)
    parser.add_argument("--retry-after", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server-pid", type=int, help="the Prefect server's pid: its CPU seconds per run")
    parser.add_argument("--server-db", help="the server's PostgreSQL database: its backends' CPU counted too")
    parser.add_argument("--profile", type=Path, help="one more run under pyinstrument, its profile written here")
    parser.add_argument("--reports", action="store_true", help="time status and export on the first run's database")
    parser.add_argument("--reports-timeout", type=float, default=300.0, help="seconds before a report run is given up")
    parser.add_argument("--reports-prompts", type=int,
                        help="time the reports on a database of this many prompts (one more run) instead")
    parser.add_argument("--reports-only", action="store_true", help="with --reports: no run comparison, reports alone")
    parser.add_argument("--child", choices=["baseline"])
    parser.add_argument("--base-url")
    parser.add_argument("--prompts-file")
    args = parser.parse_args()
    if args.child == "baseline":
        child_baseline(args)
        return
    if not os.environ.get("PREFECT_API_URL"):
        raise SystemExit("set PREFECT_API_URL to a running Prefect server (see this script's docstring)")

    import resource

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    python = sys.executable
    server = (args.server_pid, args.server_db)
    config = SimulatorConfig(latency=args.latency, rate_429=args.rate_429, retry_after=args.retry_after)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp, Simulator.in_process(config) as base_url:
        workdir = Path(tmp)
        prompts = workdir / "prompts.jsonl"
        make_prompts(prompts, args.prompts)
        env = {**os.environ, "LLM_DISPATCH_BASE_URL": base_url, "OPENAI_API_KEY": "sk-bench"}
        print(f"{args.prompts:,} prompts, concurrency {args.concurrency}, simulator latency {args.latency * 1000:.0f} ms"
              + (f", {args.rate_429:.0%} answered 429 (Retry-After {args.retry_after} s)" if args.rate_429 else "")
              + f"; {args.repeat} runs each, {os.cpu_count()} cores, PREFECT_API_URL={os.environ['PREFECT_API_URL']}")
        if args.reports and args.reports_only:
            database = reports_database(workdir=workdir, count=args.reports_prompts or args.prompts, env=env,
                                        python=python, concurrency=args.concurrency)
            reports(workdir=workdir, database=database, repeat=args.repeat, python=python, timeout=args.reports_timeout)
            return
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "cli": []}
        database = workdir / "cli-0.db"
        for n in range(args.repeat + (1 if args.profile else 0)):
            profiling = n == args.repeat
            for kind in ("baseline", "cli"):
                if profiling and kind == "baseline":
                    continue
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                timeline = workdir / f"timeline-{n}.json"
                database = workdir / f"cli-{n}.db"
                argv = [python, __file__, "--child", kind, "--base-url", base_url, "--prompts-file", str(prompts),
                        "--concurrency", str(args.concurrency), "--rate-429", str(args.rate_429)]
                if kind == "cli":
                    argv = [python, __file__, "--child", "cli", "run", str(prompts), "--concurrency",
                            str(args.concurrency), "--database-url", f"sqlite+aiosqlite:///{database}"]
                child_env = {**env, TIMELINE_ENV: str(timeline)}
                if profiling:
                    child_env[PROFILE_ENV] = str(args.profile.resolve())
                    other_db = f"sqlite+aiosqlite:///{workdir / 'importtime.db'}"
                    import_times([*argv[:-1], other_db], env=child_env, cwd=workdir,
                                 out=args.profile.resolve() / "importtime.txt")
                run = spawn(argv, env=child_env, cwd=workdir, server=server, timeout=max(900, args.prompts / 100))
                child_cpu(run, before)
                if kind == "cli":
                    run.update(rows_of(run, json.loads(timeline.read_text())))
                if profiling:
                    print(f"profiled run: {run['wall']:.2f} s whole process; profile in {args.profile}/profile.txt, .html")
                    continue
                runs[kind].append(run)
                print(f"  run {n + 1} {kind:<8} {run['wall']:6.2f} s wall, {run['cpu']:5.2f} s CPU, "
                      f"server {run['server_cpu']:4.2f} s CPU, load {run['load']:.2f}"
                      + (" (exit 1: some prompts failed)" if run["exit"] else ""), flush=True)
        report(args, runs)
        if args.reports:
            database = workdir / "cli-0.db"
            if args.reports_prompts and args.reports_prompts != args.prompts:
                database = reports_database(workdir=workdir, count=args.reports_prompts, env=env, python=python,
                                            concurrency=args.concurrency)
            reports(workdir=workdir, database=database, repeat=args.repeat, python=python,
                    timeout=args.reports_timeout)


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> None:
    base, cli = runs["baseline"], runs["cli"]
    med = statistics.median
    count = args.prompts
    print(f"\nwhere the seconds go (median of {len(cli)} runs; each row less the imports inside it; CPU: the main "
          "thread's, the total the whole process's)")
    print(f"  {'':<52} {'wall s':>7} {'CPU s':>7}   (wall, each run)")
    for name in cli[0]["rows"]:
        values = [r["rows"].get(name, 0.0) for r in cli]
        cpu = med(r["cpu_rows"].get(name, 0.0) for r in cli)
        print(f"  {name:<52} {med(values):7.3f} {cpu:7.3f}   ({', '.join(f'{v:.3f}' for v in values)})")
    fixed = [r["rows"]["TOTAL (whole process)"] - r["rows"]["send phase (first request to last result stored)"]
             for r in cli]
    # The main thread's CPU in the fixed rows (the total and "other" count every thread).
    fixed_cpu = med(sum(v for k, v in r["cpu_rows"].items() if not k.startswith(("  ", "send phase", "TOTAL", "other")))
                    for r in cli)
    print(f"  {'fixed cost (total less the send phase)':<52} {med(fixed):7.3f} {fixed_cpu:7.3f}   "
          f"({', '.join(f'{v:.3f}' for v in fixed)})")
    print("\ncounts (median)")
    for name in cli[0]["counts"]:
        values = [r["counts"][name] for r in cli]
        shown = values[0] if isinstance(values[0], str) else (
            f"{med(values):.3f}" if isinstance(values[0], float) else f"{med(values):.0f}")
        print(f"  {name:<52} {shown}")
    print("\nPrefect API calls before the first request (first run: count, seconds)")
    for label, (n, secs) in sorted(cli[0]["api_before"].items(), key=lambda kv: -kv[1][1]):
        print(f"  {label:<70} {n:3d}  {secs:6.3f}")
    ratio = [(count / c["wall"]) / (count / b["wall"]) for c, b in zip(cli, base)]
    print(f"\nwhole process, {count:,} prompts (median of {len(cli)}; ratio paired run by run)")
    print(f"  {'':<24} {'wall s':>7} {'prompts/s':>9} {'CPU s':>6} {'server CPU s':>12} {'load':>5}")
    for name, variant in (("bare aiohttp + Semaphore", base), ("llm-dispatch run", cli)):
        print(f"  {name:<24} {med(r['wall'] for r in variant):7.2f} {med(count / r['wall'] for r in variant):9.0f} "
              f"{med(r['cpu'] for r in variant):6.2f} {med(r['server_cpu'] for r in variant):12.2f} "
              f"{med(r['load'] for r in variant):5.2f}")
    print(f"  llm-dispatch / bare loop: {med(ratio):.3f}x (runs {', '.join(f'{r:.3f}' for r in ratio)}); "
          f"CPU {med(c['cpu'] / b['cpu'] for c, b in zip(cli, base)):.2f}x")
    send = [r["rows"]["send phase (first request to last result stored)"] for r in cli]
    print(f"  send phase alone: {med(count / s for s in send):.0f} prompts/s, "
          f"{med((count / s) / (count / b['wall']) for s, b in zip(send, base)):.3f}x the bare loop's whole process")


if __name__ == "__main__":
    main()
