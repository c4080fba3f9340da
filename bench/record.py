"""Benchmark: what recording a large job costs, the check pass and the head stored as ``dispatch`` records it
(``jobs.record_job(estimate=True, head=...)``: check, estimate, and the shared prefixes it finds), tree against tree.

Each tree's recording is a fresh child process (``bench/_child.py``), the trees alternating, repeated; each records
the same file into a new SQLite database. The child reports the call's wall seconds and the process's CPU seconds
spent in it. Two files: ``plain`` (one user message a prompt: no prefix to share, the common case) and ``shared``
(a ~3,000-token system message shared by every prompt, then one user message).

    python bench/record.py [--prompts 100000] [--repeat 3] [--files plain shared] --trees /tmp/base /work/wt-x
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _child import report, run_measured, tree_python  # bench/ is the script's folder, first on sys.path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "gpt-6.2-sol"


def make_file(path: Path, *, count: int, shared: bool) -> None:
    system = "Grade the answer below. " + " ".join(f"criterion{i % 97}" for i in range(1900)) if shared else None
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            question = f"Benchmark question number {i}: what is {i} squared?"
            line = ({"id": i, "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
                    if system else {"id": i, "prompt": question})
            handle.write(json.dumps({**line, "model": MODEL, "params": {"max_tokens": 64}}) + "\n")


async def child_run(*, prompts: str, db: str) -> dict[str, float]:
    import logging

    logging.disable(logging.INFO)
    from llm_dispatch import storage
    from llm_dispatch.core import Settings
    from llm_dispatch.jobs import record_job, routing_rules

    settings = Settings(database_url=f"sqlite+aiosqlite:///{db}", model=MODEL)
    async with storage.open_database(settings.database_url) as sessions:
        cpu, wall = time.process_time(), time.perf_counter()
        job = await record_job(source=prompts, job_id=None, settings=settings, sessions=sessions,
                               rules=routing_rules(settings), estimate=True, head=settings.chunk_size * 4)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    groups = getattr(job, "cache", None)
    return {"wall_s": wall, "cpu_s": cpu, "groups": groups.total if groups is not None else -1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--files", nargs="+", default=["plain", "shared"], choices=("plain", "shared"))
    parser.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--prompts-file")
    parser.add_argument("--db")
    args = parser.parse_args()
    if args.child:
        report(asyncio.run(child_run(prompts=args.prompts_file, db=args.db)))
        return
    print(json.dumps({"load_average": os.getloadavg(), "prompts": args.prompts}), flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for kind in args.files:
            path = Path(scratch) / f"{kind}.jsonl"
            make_file(path, count=args.prompts, shared=kind == "shared")
            runs: dict[Path, list[dict[str, float]]] = {tree: [] for tree in args.trees}
            for number in range(args.repeat):
                for tree in args.trees:
                    python, extra = tree_python(tree)
                    db = Path(scratch) / f"{kind}-{number}-{len(runs[tree])}-{tree.name}.db"
                    env = {**os.environ, **extra}
                    runs[tree].append(run_measured(
                        [str(Path(__file__).resolve()), "--child", "--prompts-file", str(path), "--db", str(db)],
                        env=env, what=f"{tree} {kind}", python=python, cwd=tree))
                    db.unlink(missing_ok=True)
            for tree, results in runs.items():
                print(json.dumps({"file": kind, "tree": str(tree), "runs": len(results),
                                  "cpu_s_median": round(statistics.median(r["cpu_s"] for r in results), 2),
                                  "wall_s_median": round(statistics.median(r["wall_s"] for r in results), 2),
                                  "cpu_s": [round(r["cpu_s"], 2) for r in results],
                                  "groups": results[0]["groups"]}), flush=True)
    print(json.dumps({"load_average_after": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
