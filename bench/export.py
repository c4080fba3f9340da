"""Benchmark: the read-only reports on a large job: ``status``, ``cost`` and ``export`` (JSON Lines, CSV, Parquet).

Each tree (``--code LABEL=DIR``, the first the baseline of the ratios) gets a database of ``--prompts`` prompts with
their results, made by ``bench/bigdb.py`` under that tree's interpreter (so at that tree's newest migration): a
SQLite file, or with ``--postgres SERVER_URL`` a database made anew on that server. ``--database LABEL=URL#JOB``
reuses one made before. Then, per repeat, every command runs once per tree, the trees alternating, each as the
installed ``llm-dispatch`` in a process of its own: its wall time, CPU seconds (user + system) and peak RSS from
``wait4``. Medians are printed with each tree's ratio to the first.

    python bench/export.py --prompts 1000000 --repeat 3 --code main=/work/main --code new=.
    python bench/export.py --prompts 1000000 --postgres postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
    python bench/export.py --prompts 1000000 --jobs 2 --commands status cost   # another job of 1M beside it
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from _child import tree_python  # bench/ is the script's folder, first on sys.path

COMMANDS: dict[str, list[str]] = {
    "status": ["status", "{job}"],
    "cost": ["cost", "{job}"],
    "export jsonl": ["export", "{job}", "--format", "jsonl", "--output", "{out}.jsonl"],
    "export csv": ["export", "{job}", "--format", "csv", "--output", "{out}.csv"],
    "export parquet": ["export", "{job}", "--format", "parquet", "--output", "{out}.parquet"],
}
TARGETS = {"status": 1.0, "cost": 1.0, "export jsonl": 30.0, "export csv": 30.0, "export parquet": 30.0}


def make_database(*, label: str, python: str, env: dict[str, str], count: int, workdir: Path,
                  postgres: str | None, jobs: int = 1) -> tuple[str, str]:
    """A database of ``jobs`` jobs of ``count`` prompts each for one tree, made by that tree's interpreter; its URL
    and the first job (the one measured: the others are there to show they do not slow it)."""
    if postgres:
        from sqlalchemy.engine import make_url

        # The label and this process's id: two sessions benchmarking on one server never wipe each other's.
        name = f"bench_export_{label}_{os.getpid()}"
        admin = postgres.replace("postgresql+asyncpg://", "postgresql://")
        subprocess.run(["psql", admin, "-qc", f'DROP DATABASE IF EXISTS "{name}"'], check=True)
        subprocess.run(["psql", admin, "-qc", f'CREATE DATABASE "{name}"'], check=True)
        url = make_url(postgres).set(database=name).render_as_string(hide_password=False)
    else:
        url = f"sqlite+aiosqlite:///{workdir / f'{label}.db'}"
    job = f"bench-{label}"
    started = time.perf_counter()
    for n in range(jobs):
        subprocess.run([python, str(ROOT / "bench" / "bigdb.py"), "--prompts", str(count), "--database-url", url,
                        "--job-id", job if n == 0 else f"{job}-{n + 1}"], env=env, check=True, stdout=subprocess.DEVNULL)
    print(f"  {label}: {jobs} x {count:,} prompts made in {time.perf_counter() - started:.0f} s", flush=True)
    return url, job


def measure(argv: list[str], *, env: dict[str, str]) -> dict[str, float]:
    """Run one command to its end: wall seconds, CPU seconds (user + system), peak RSS in MiB."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    error = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{error[-3000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--code", action="append", metavar="LABEL=DIR", help="a tree to measure (default: this one)")
    parser.add_argument("--postgres", metavar="SERVER_URL", help="databases on this PostgreSQL server, not SQLite")
    parser.add_argument("--database", action="append", metavar="LABEL=URL#JOB", help="reuse a database made before")
    parser.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--jobs", type=int, default=1, help="jobs of --prompts each per database (the first measured)")
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.code) if args.code else {"this": str(ROOT)}
    given = {label: tuple(rest.rsplit("#", 1)) for label, rest in
             (item.split("=", 1) for item in args.database or [])}
    load = lambda: os.getloadavg()[0]  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        workdir = Path(tmp)
        runs: dict[str, dict[str, list[dict[str, float]]]] = {label: {c: [] for c in args.commands} for label in trees}
        setups: dict[str, tuple[list[str], dict[str, str], str]] = {}
        print(f"{args.prompts:,} prompts, {args.repeat} runs, {os.cpu_count()} cores, load {load():.1f}", flush=True)
        for label, directory in trees.items():
            python, extra = tree_python(Path(directory).resolve())
            env = {**os.environ, **extra, "PREFECT_LOGGING_LEVEL": "WARNING"}
            env.pop("PREFECT_API_URL", None)  # the reports start no Prefect
            if label in given:
                url, job = given[label]
            else:
                url, job = make_database(label=label, python=python, env=env, count=args.prompts, workdir=workdir,
                                         postgres=args.postgres, jobs=args.jobs)
            command = str(Path(python).with_name("llm-dispatch"))
            setups[label] = ([command], {**env, "LLM_DISPATCH_DATABASE_URL": url}, job)
        try:
            measure_all(runs, setups, workdir=workdir, repeat=args.repeat, commands=args.commands, load=load)
        finally:
            if args.postgres:  # the databases this run made, not those given with --database
                admin = args.postgres.replace("postgresql+asyncpg://", "postgresql://")
                for label in trees:
                    if label not in given:
                        subprocess.run(["psql", admin, "-qc",
                                        f'DROP DATABASE IF EXISTS "bench_export_{label}_{os.getpid()}"'], check=False)
    print_medians(runs, prompts=args.prompts, repeat=args.repeat, commands=args.commands)


def measure_all(runs: dict[str, dict[str, list[dict[str, float]]]],
                setups: dict[str, tuple[list[str], dict[str, str], str]], *, workdir: Path, repeat: int,
                commands: list[str], load: Any) -> None:
    """Every command ``repeat`` times, the trees alternating within each."""
    for run in range(repeat):
        for name in commands:
            for label, (command, env, job) in setups.items():
                out = str(workdir / f"out-{label}")
                argv = command + [part.format(job=job, out=out) for part in COMMANDS[name]]
                runs[label][name].append(measure(argv, env=env))
                for suffix in (".jsonl", ".csv", ".parquet"):
                    Path(out + suffix).unlink(missing_ok=True)
            print(f"  run {run + 1} {name:<15} " + ", ".join(
                f"{label} {r[name][-1]['wall']:.2f} s wall, {r[name][-1]['cpu']:.2f} s CPU, "
                f"{r[name][-1]['rss_mb']:.0f} MiB" for label, r in runs.items()) + f" (load {load():.1f})",
                flush=True)


def print_medians(runs: dict[str, dict[str, list[dict[str, float]]]], *, prompts: int, repeat: int,
                  commands: list[str]) -> None:
    first = next(iter(runs))
    print(f"\nmedians of {repeat} runs ({prompts:,} prompts; ratios to {first}, run by run)")
    print(f"  {'command':<16}{'tree':<8}{'wall s':>8}{'CPU s':>8}{'peak MiB':>10}{'wall/first':>12}{'CPU/first':>11}"
          f"{'target':>9}")
    for name in commands:
        for label, by_name in runs.items():
            each = by_name[name]
            base = runs[first][name]
            med = lambda key: statistics.median(r[key] for r in each)  # noqa: E731
            ratio = lambda key: statistics.median(r[key] / b[key] for r, b in zip(each, base))  # noqa: E731
            print(f"  {name:<16}{label:<8}{med('wall'):8.2f}{med('cpu'):8.2f}{max(r['rss_mb'] for r in each):10.0f}"
                  f"{ratio('wall'):11.2f}x{ratio('cpu'):10.2f}x{'< ' + format(TARGETS[name], 'g') + ' s':>9}")


if __name__ == "__main__":
    sys.exit(main())
