"""Benchmark: instructions per request (the client) or per prompt (the realtime-dispatch flow), counted by callgrind.

Wall and CPU times on a shared 2-core machine scatter by tens of percent from run to run; the number of
instructions a process executes repeats to about 0.1%. Each variant runs twice under
``valgrind --tool=callgrind``, with a small and a large job, and the difference between the two counts,
divided by the difference in size, is its cost per request or per prompt: start-up, imports and warm-up
cancel out. Two variants run at a time (one per core); the simulator answers in its own process.

    python bench/instructions.py client [--code LABEL=DIR ...]      # vs plain aiohttp + Semaphore
    PREFECT_API_URL=http://127.0.0.1:4299/api python bench/instructions.py flow [--code LABEL=DIR ...]

``--code LABEL=DIR`` measures the tree in DIR (say, a ``git worktree`` of an older commit) beside this one.
The flow variant needs a running Prefect server (under callgrind, Prefect's temporary server would take
minutes to start); each size takes a few minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _child import tree_python  # bench/ is the script's folder, first on sys.path
from realtime import ROOT, make_prompts

_COLLECTED = re.compile(r"Collected : (\d+)")


def count(argv: list[str], *, env: dict[str, str], cwd: Path) -> int:
    """Instructions the command executed (every thread), as callgrind counts them; ARGV[0] is the interpreter."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=3600)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{' '.join(argv[:3])} failed under callgrind (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return int(found.group(1))


def per_unit(label: str, sizes: tuple[int, int], argv_for: dict[int, list[str]], *, env: dict[str, str],
             cwd: Path) -> tuple[str, float]:
    small, large = (count(argv_for[size], env=env, cwd=cwd) for size in sizes)
    return label, (large - small) / (sizes[1] - sizes[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["client", "flow"])
    parser.add_argument("--code", action="append", default=[], metavar="LABEL=DIR",
                        help="another tree to measure beside this checkout")
    parser.add_argument("--sizes", type=int, nargs=2, help="the small and the large job (client: requests "
                        "after a 500-request warm-up, default 500 2500; flow: prompts, default 1000 3000)")
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.2)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    sizes = tuple(args.sizes or ((500, 2500) if args.what == "client" else (1000, 3000)))
    trees = {"this checkout": ROOT, **{label: Path(d).resolve() for label, d in (c.split("=", 1) for c in args.code)}}

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    bench = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp, \
            Simulator.in_process(SimulatorConfig(latency=args.latency)) as base_url:
        work = Path(tmp)
        jobs: list[tuple[str, dict[int, list[str]], dict[str, str]]] = []
        if args.what == "client":
            common = ["--base-url", base_url, "--concurrency", str(args.concurrency)]
            jobs.append(("plain aiohttp + Semaphore", {n: [sys.executable, str(bench / "client.py"), "--child",
                                                           "baseline", "--requests", str(n), *common] for n in sizes},
                         dict(os.environ)))
            for label, tree in trees.items():
                # This checkout's child, importing the tree's llm-dispatch (as bench/client.py --code does).
                python, extra = tree_python(tree)
                jobs.append((label, {n: [python, str(bench / "client.py"), "--child", "client", "--requests", str(n),
                                         *common] for n in sizes},
                             {**os.environ, **extra}))
            unit = "request"
        else:
            for n in sizes:
                make_prompts(work / f"p{n}.jsonl", n)
            for i, (label, tree) in enumerate(trees.items()):
                (work / str(i)).mkdir()
                # The tree's own flow child where it has one: it calls that tree's flow as that tree defines it.
                child = tree / "bench" / "realtime.py"
                child = child if child.is_file() else bench / "realtime.py"
                python, extra = tree_python(tree)
                jobs.append((label, {n: [python, str(child), "--child", "flow", "--base-url", base_url,
                                         "--prompts-file", str(work / f"p{n}.jsonl"), "--c", str(args.concurrency),
                                         "--db", f"sqlite+aiosqlite:///{work / str(i) / f'flow-{n}.db'}"]
                                     for n in sizes},
                             {**os.environ, **extra, "PREFECT_LOGGING_LEVEL": "WARNING"}))
            unit = "prompt"
        print(f"{args.what}: instructions per {unit} (callgrind; {sizes[1]} minus {sizes[0]}), concurrency "
              f"{args.concurrency}, simulator latency {args.latency * 1000:.0f} ms", flush=True)
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda job: per_unit(job[0], sizes, job[1], env=job[2], cwd=work), jobs))
    first = results[0][1]
    for label, value in results:
        print(f"  {label:<28} {value:>12,.0f}  {value / first:6.3f}x")


if __name__ == "__main__":
    main()
