"""Benchmark: a Gemini batch submission killed (SIGKILL) during its upload and during its create, then run again: one
batch per file, no prompt paid twice (issue 37).

Against the simulator in its own process and a SQLite file per case. The first run is a child process that records
the prompts and submits them through Batch Mode's file path (``jobs.submit_prompts``, the Files API's resumable
upload); a queued batch fault holds the step to kill in (``hang_upload``: the upload's last chunk; ``create_lost_hang``:
the create, made at the provider, its answer held), and the child gets SIGKILL once the simulator has started it. The
re-run does what a run of the same job does first (``jobs.advance_submission`` on each half-submitted batch: a
``preparing`` one uploaded again, an ``uploaded`` one looked up by its display name before any create), then polls,
ingests, and submits whatever is still pending. Reported per case: the provider batches made, the uploads started,
the requests the simulator answered, and the prompts with more than one paid answer.

    python bench/gemini_batch_kill.py [--prompts 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

MODEL = "gemini-2.5-flash"
FAULTS = {"upload": "hang_upload:120", "create": "create_lost_hang:120"}


def _prompts(count: int) -> Any:
    from llm_dispatch import storage
    from llm_dispatch.core import dedupe_key

    for i in range(count):
        messages = [{"role": "user", "content": f"Question {i}: what is {i} squared?"}]
        params = {"max_tokens": 32}
        yield storage.NewPrompt(custom_id=f"g-{i}", position=i, model=MODEL, messages=messages, params=params,
                                dedupe_key=dedupe_key(model=MODEL, messages=messages, params=params),
                                planned_route="batch", route_reason="bench")


async def _open(db: Path) -> tuple[Any, Any]:
    from llm_dispatch import storage

    engine = storage.create_engine(f"sqlite+aiosqlite:///{db}")
    await storage.migrate(engine)
    return engine, storage.session_factory(engine)


def _clients(client: Any) -> Any:
    from llm_dispatch.core import GeminiBatchApi
    from llm_dispatch.jobs import Clients

    clients = Clients.of(client)
    clients._batch_apis["gemini"] = GeminiBatchApi(client, inline_max_bytes=0)  # the file path at any size
    return clients


async def first_run(*, root: str, db: Path, directory: Path, count: int) -> None:
    """Record the job and submit it: killed inside the submission."""
    from llm_dispatch import storage
    from llm_dispatch.core import LLMClient, PriceTable
    from llm_dispatch.jobs import submit_prompts

    engine, sessions = await _open(db)
    job_id = await storage.create_job(sessions, name="kill", fingerprint="k" * 64, input_path=None, model=MODEL,
                                      settings={})
    await storage.add_prompts(sessions, job_id=job_id, prompts=_prompts(count))
    print("RECORDED", flush=True)
    async with LLMClient(provider="gemini", base_url=root, api_key=None) as client:
        async with storage.ResultWriter(sessions, job_id=job_id, prices=PriceTable.load()) as writer:
            await submit_prompts(sessions=sessions, clients=_clients(client), writer=writer, job_id=job_id,
                                 directory=directory)
    await engine.dispose()


async def rerun(*, root: str, db: Path, directory: Path) -> dict[str, Any]:
    """What a run of the same job does: finish the half-submitted batches, follow every batch to its end, submit what
    is left."""
    from sqlalchemy import text

    from llm_dispatch import storage
    from llm_dispatch.core import HALF_SUBMITTED_BATCH_STATUSES, TERMINAL_BATCH_STATUSES, LLMClient, PriceTable
    from llm_dispatch.jobs import advance_submission, ingest_batch, poll_batch, submit_prompts

    engine, sessions = await _open(db)
    prices = PriceTable.load()
    started = time.perf_counter()
    async with LLMClient(provider="gemini", base_url=root, api_key=None) as client:
        clients = _clients(client)
        async with sessions() as session:
            job_id = (await session.execute(text("SELECT id FROM jobs"))).scalar_one()
        left = [(r.id, r.status) for r in await storage.unfinished_batches(sessions, job_id=job_id)]
        for _round in range(3):
            for record in await storage.unfinished_batches(sessions, job_id=job_id):
                if record.status in HALF_SUBMITTED_BATCH_STATUSES:
                    record = await advance_submission(sessions=sessions, clients=clients, record=record)
                while record.status not in TERMINAL_BATCH_STATUSES:
                    await asyncio.sleep(0.2)
                    record = await poll_batch(sessions=sessions, clients=clients, record=record)
                async with storage.ResultWriter(sessions, job_id=job_id, prices=prices) as writer:
                    await ingest_batch(sessions=sessions, clients=clients, writer=writer, record=record,
                                       directory=directory, max_submissions=3)
            if not await storage.unfinished_prompt_count(sessions, job_id=job_id, planned_route="batch"):
                break
            async with storage.ResultWriter(sessions, job_id=job_id, prices=prices) as writer:
                await submit_prompts(sessions=sessions, clients=clients, writer=writer, job_id=job_id,
                                     directory=directory, retry_failed="none")
        counts = await storage.job_counts(sessions, job_id=job_id)
        async with sessions() as session:
            paid = (await session.execute(text(
                "SELECT COUNT(*) FROM (SELECT prompt_id FROM results WHERE status = 'succeeded' "
                "GROUP BY prompt_id HAVING COUNT(*) > 1)"))).scalar_one()
            batches = (await session.execute(text("SELECT COUNT(*) FROM batches"))).scalar_one()
    await engine.dispose()
    return {"left_by_the_kill": left, "counts": counts, "prompts_paid_twice": paid, "our_batches": batches,
            "rerun_s": round(time.perf_counter() - started, 2)}


def case(step: str, *, root: str, workdir: Path, count: int) -> dict[str, Any]:
    httpx.post(f"{root}/_sim/reset", timeout=10).raise_for_status()
    httpx.post(f"{root}/_sim/batch_faults", json={"faults": [FAULTS[step]]}, timeout=10).raise_for_status()
    db, directory = workdir / f"{step}.db", workdir / f"files-{step}"
    child = subprocess.Popen([sys.executable, __file__, "--child", "--root", root, "--db", str(db),
                              "--directory", str(directory), "--prompts", str(count)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    try:
        while True:
            if child.poll() is not None:
                raise SystemExit(f"the first run ended before its kill: {child.stderr.read() if child.stderr else ''}")
            if time.monotonic() > deadline:
                raise SystemExit(f"the {step} never started")
            stats = httpx.get(f"{root}/_sim/stats", timeout=10).json()
            # Killed once the step to kill in is under way at the provider (the upload's last chunk held, or the
            # batch made and its create's answer held).
            if (step == "upload" and stats["gemini_uploads"] >= 1 and _chunks_done(workdir, db)) or (
                    step == "create" and stats["gemini_batches"] >= 1):
                time.sleep(0.5)
                break
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    before = httpx.get(f"{root}/_sim/stats", timeout=10).json()
    result = asyncio.run(rerun(root=root, db=db, directory=directory))
    after = httpx.get(f"{root}/_sim/stats", timeout=10).json()
    result.update(killed_in=step, prompts=count, provider_batches=after["gemini_batches"],
                  uploads_started=after["gemini_uploads"], uploads_before_kill=before["gemini_uploads"],
                  requests_answered=after["gemini_batch_lines"])
    return result


def _chunks_done(workdir: Path, db: Path) -> bool:
    """The batch row is stored ``preparing`` (its upload under way, its file id unknown)."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM batches WHERE status = 'preparing'").fetchone()[0] >= 1
    except sqlite3.OperationalError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(first_run(root=args.root, db=Path(args.db), directory=Path(args.directory), count=args.prompts))
        return

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    with tempfile.TemporaryDirectory(prefix="bench-gemini-kill-") as tmp, \
            Simulator.in_process(SimulatorConfig(batch_processing_seconds=1.0)) as base_url:
        root = base_url.removesuffix("/v1")
        for step in ("upload", "create"):
            result = case(step, root=root, workdir=Path(tmp), count=args.prompts)
            print(json.dumps(result), flush=True)
            ok = (result["provider_batches"] == 1 and result["prompts_paid_twice"] == 0
                  and result["counts"] == {"succeeded": args.prompts}
                  and result["requests_answered"] == args.prompts)
            print(f"killed in the {step}: {result['provider_batches']} provider batch, "
                  f"{result['uploads_started']} uploads started, {result['requests_answered']:,} requests answered "
                  f"for {args.prompts:,} prompts, {result['prompts_paid_twice']} paid twice: {'OK' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
