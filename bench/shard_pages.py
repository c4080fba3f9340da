"""Benchmark: one page of a shard's open prompts (``storage.unfinished_prompts`` with ``shard`` and a keyset page, as a
real-time shard run plans them), on a large job, for each tree.

Each ``--database URL#JOB`` is a job made by ``bench/bigdb.py --open`` (every prompt pending). The parent puts it in
the state of a run part way through: the prompts before ``--answered`` of the job's input answered, the rest
pending, then ``VACUUM ANALYZE`` (on PostgreSQL; what autovacuum does, so the planner knows the statuses). Then, per
repeat, each tree (``--trees``; the first is the baseline) measures in a process of its own, the trees alternating:
for each of ``--shards`` shards, the page of ``--page`` prompts that starts at the answered mark, timed from the
call to its rows (wall; the database's work is most of it). Medians over the shards and the repeats are printed.

    python bench/bigdb.py --open --prompts 1000000 --job-id big-open \\
        --database-url postgresql+asyncpg://postgres@127.0.0.1:5432/shard
    python bench/shard_pages.py --trees /work/main . \\
        --database 'postgresql+asyncpg://postgres@127.0.0.1:5432/shard#big-open'
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

from _child import report, run_measured, tree_python  # bench/ is the script's folder, first on sys.path

ROOT = Path(__file__).resolve().parent.parent
# A key past every prompt id: ``(position - 1, FAR)`` starts a keyset page at ``position``.
FAR = 2**62


async def set_state(url: str, *, job_id: str, answered: float) -> int:
    """Answer the job's prompts before ``answered`` of its positions, leave the rest pending; the answered mark."""
    from sqlalchemy import text

    from llm_dispatch import storage

    engine = storage.create_engine(url)
    try:
        async with engine.begin() as conn:
            total = (await conn.execute(text("SELECT max(position) + 1 FROM prompts WHERE job_id = :j"),
                                        {"j": job_id})).scalar_one()
            mark = int(total * answered)
            await conn.execute(text("UPDATE prompts SET status = CASE WHEN position < :m THEN 'succeeded' "
                                    "ELSE 'pending' END WHERE job_id = :j AND status <> CASE WHEN position < :m "
                                    "THEN 'succeeded' ELSE 'pending' END"), {"j": job_id, "m": mark})
        if engine.dialect.name == "postgresql":
            async with engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("VACUUM ANALYZE prompts"))
        return mark
    finally:
        await engine.dispose()


async def pages(url: str, *, job_id: str, mark: int, shards: int, page: int) -> dict[str, float]:
    from llm_dispatch import storage

    engine = storage.create_engine(url)
    sessions = storage.session_factory(engine)
    try:
        # One page first, so the connection and the statement's compilation are not in the figures.
        await storage.unfinished_prompts(sessions, job_id=job_id, shard=(0, shards), limit=1)
        seconds = []
        for index in range(shards):
            started = time.perf_counter()
            found = await storage.unfinished_prompts(sessions, job_id=job_id, shard=(index, shards),
                                                     after=(mark - 1, FAR), limit=page)
            seconds.append(time.perf_counter() - started)
            assert len(found) == page, f"shard {index}: {len(found)} prompts, not a full page"
        return {f"shard_{index}": value for index, value in enumerate(seconds)}
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--database", action="append", default=[], help="URL#JOB of a bigdb.py --open job")
    parser.add_argument("--answered", type=float, default=0.6, help="fraction of the job answered (default 0.6)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--page", type=int, default=1250, help="a 1M-prompt job's page on 4 shards")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", help="(child) URL#JOB")
    parser.add_argument("--mark", type=int)
    args = parser.parse_args()
    if args.child:
        url, job_id = args.child.split("#", 1)
        report(asyncio.run(pages(url, job_id=job_id, mark=args.mark, shards=args.shards, page=args.page)))
        return

    print(f"a shard's page of {args.page} prompts ({args.shards} shards), {args.answered:.0%} of the job answered, "
          f"{args.repeat} runs per tree, alternating; load average {os.getloadavg()[0]:.1f}")
    for database in args.database:
        url, job_id = database.split("#", 1)
        mark = asyncio.run(set_state(url, job_id=job_id, answered=args.answered))
        runs: dict[Path, list[float]] = {tree: [] for tree in args.trees}
        for _ in range(args.repeat):
            for tree in args.trees:
                python, extra = tree_python(tree)
                argv = [__file__, "--child", database, "--mark", str(mark), "--shards", str(args.shards),
                        "--page", str(args.page)]
                result = run_measured(argv, env={**os.environ, **extra}, what=f"{tree} pages", python=python)
                runs[tree].extend(result.values())
        print(f"\n{job_id} (answered up to position {mark:,}): seconds a page, median over shards and runs "
              f"[min-max]")
        base = statistics.median(runs[args.trees[0]])
        for tree, seconds in runs.items():
            median = statistics.median(seconds)
            print(f"  {str(tree):30} {median:8.4f}  [{min(seconds):.4f}-{max(seconds):.4f}]  "
                  f"{median / base:.3f}x the first")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
