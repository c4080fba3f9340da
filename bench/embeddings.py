"""Benchmark: texts embedded through `llm-dispatch run --endpoint embeddings` against the simulator (its own
process), real-time and through the Batch API, beside a plain aiohttp + Semaphore baseline in the same run.

    .venv/bin/python bench/embeddings.py --texts 20000 --concurrency 100 --repeat 3 [--batch-texts 100000]

Per variant: requests the simulator answered, wall seconds, texts a second, the child process's peak RSS; for
llm-dispatch also the bytes stored per vector (results.embedding). One text a request (no packing yet).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "text-embedding-3-small"


def stats(base_url: str) -> dict:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_sim/stats") as answer:
        return json.load(answer)


def reset(base_url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(base_url.removesuffix("/v1") + "/_sim/reset", method="POST"))


def baseline_child(base_url: str, texts: int, concurrency: int) -> None:
    import aiohttp

    async def main() -> None:
        gate = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            async def one(i: int) -> bytes:
                async with gate, session.post(f"{base_url}/embeddings", json={
                        "model": MODEL, "input": f"text number {i}", "encoding_format": "base64"}) as response:
                    body = await response.json()
                    return body["data"][0]["embedding"].encode()
            vectors = await asyncio.gather(*(one(i) for i in range(texts)))
        assert len(vectors) == texts
    asyncio.run(main())


def measured(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a child process: its own VmRSS sampled every 0.1 s (not its children's: the
    Prefect server the CLI starts is a process of its own)."""
    started = time.monotonic()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    status = Path(f"/proc/{child.pid}/status")
    while child.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.1)
    wall = time.monotonic() - started
    if child.returncode != 0:
        raise SystemExit(child.stderr.read()[-3000:] if child.stderr else "failed")
    return wall, peak / 1024


def run_dispatch(base_url: str, texts: int, concurrency: int, route: str, workdir: Path) -> dict:
    prompts = workdir / f"e-{route}-{texts}.jsonl"
    with prompts.open("w") as out:
        for i in range(texts):
            out.write(json.dumps({"id": f"t{i}", "input": f"text number {i}"}) + "\n")
    db = workdir / f"e-{route}-{time.time_ns()}.db"
    env = {**os.environ, "LLM_DISPATCH_BASE_URL": base_url, "LLM_DISPATCH_DATABASE_URL": f"sqlite+aiosqlite:///{db}",
           "LLM_DISPATCH_BATCH_DIR": str(workdir / "batches"), "LLM_DISPATCH_BATCH_POLL_INTERVAL": "1",
           "LLM_DISPATCH_API_KEY": "sk-sim"}
    reset(base_url)
    wall, rss = measured([str(Path(sys.executable).with_name("llm-dispatch")), "run", str(prompts), "--endpoint",
                          "embeddings", "--model", MODEL, "--route", route, "--concurrency", str(concurrency),
                          "--new-job"], env)
    counted = stats(base_url)
    with sqlite3.connect(db) as con:
        stored, per_vector = con.execute("SELECT count(*), avg(length(embedding)) FROM results").fetchone()
    return {"wall_s": wall, "texts_per_s": texts / wall, "rss_mib": rss, "stored": stored,
            "bytes_per_vector": per_vector, "requests": counted["requests_total"], "batch_lines": counted.get("batch_lines")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--batch-texts", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--base-url")
    args = parser.parse_args()
    if args.child:
        baseline_child(args.base_url, args.texts, args.concurrency)
        return
    from llm_dispatch.simulator import Simulator, SimulatorConfig

    print(f"load: {os.getloadavg()}", flush=True)
    with Simulator.in_process(SimulatorConfig(latency=0.0, batch_processing_seconds=5.0)) as base_url, \
            tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        flows, plains = [], []
        for _ in range(args.repeat):
            reset(base_url)
            wall, rss = measured([sys.executable, __file__, "--child", "--base-url", base_url, "--texts",
                                  str(args.texts), "--concurrency", str(args.concurrency)], dict(os.environ))
            plains.append({"wall_s": wall, "texts_per_s": args.texts / wall, "rss_mib": rss,
                           "requests": stats(base_url)["requests_total"]})
            flows.append(run_dispatch(base_url, args.texts, args.concurrency, "all-realtime", workdir))
            print("baseline", plains[-1], "\nllm-dispatch", flows[-1], flush=True)
        for name, rows in (("baseline", plains), ("llm-dispatch", flows)):
            print(f"{name:12s} median of {len(rows)}: {statistics.median(r['texts_per_s'] for r in rows):,.0f} texts/s, "
                  f"{statistics.median(r['wall_s'] for r in rows):.1f} s, requests {rows[0]['requests']:,}")
        print(f"llm-dispatch: bytes per stored vector {flows[0]['bytes_per_vector']:.0f}; peak RSS median "
              f"{statistics.median(r['rss_mib'] for r in flows):.0f} MiB, baseline "
              f"{statistics.median(r['rss_mib'] for r in plains):.0f} MiB")
        if args.batch_texts:
            batch = run_dispatch(base_url, args.batch_texts, args.concurrency, "all-batch", workdir)
            print("batch", batch, flush=True)
        print(f"load: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
