"""Benchmark: texts embedded through `llm-dispatch run --endpoint embeddings` against the simulator (its own
process), real-time and through the Batch API, beside a plain aiohttp + Semaphore baseline in the same run.

    .venv/bin/python bench/embeddings.py --texts 1000000 --repeat 1 [--batch-texts 100000]

Both clients pack texts as OpenAI allows (2,048 a request): the baseline slices the texts into requests of 2,048,
sends them at the same concurrency, decodes every vector and keeps none (no storage, no retries, no crash safety);
llm-dispatch records every prompt, packs each chunk's texts, stores a row per text with its float32 vector and cost.
Per variant: requests the simulator answered, texts it embedded, wall seconds, texts a second, the child process's
peak RSS (the CLI's own: the Prefect server it starts is a process of its own); for llm-dispatch also the bytes of
each stored vector (results.embedding) and the database file's bytes per text. The load average is printed before,
during (each minute) and after: the machine is shared.
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
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "text-embedding-3-small"
PER_REQUEST = 2048  # OpenAI's inputs per embeddings request, as llm-dispatch packs them


def stats(base_url: str) -> dict:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_sim/stats") as answer:
        return json.load(answer)


def reset(base_url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(base_url.removesuffix("/v1") + "/_sim/reset", method="POST"))


def baseline_child(base_url: str, texts: int, concurrency: int) -> None:
    import base64

    import aiohttp

    async def main() -> None:
        gate = asyncio.Semaphore(concurrency)
        decoded = 0
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            async def one(start: int) -> None:
                nonlocal decoded
                batch = [f"text number {i}" for i in range(start, min(start + PER_REQUEST, texts))]
                async with gate, session.post(f"{base_url}/embeddings", json={
                        "model": MODEL, "input": batch, "encoding_format": "base64"}) as response:
                    body = await response.json()
                for item in body["data"]:
                    decoded += len(base64.b64decode(item["embedding"])) > 0
            await asyncio.gather(*(one(start) for start in range(0, texts, PER_REQUEST)))
        assert decoded == texts, decoded
    asyncio.run(main())


def measured(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a child process: its own VmRSS sampled every 0.1 s (not its children's: the
    Prefect server the CLI starts is a process of its own)."""
    started = time.monotonic()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    status = Path(f"/proc/{child.pid}/status")
    errors: list[str] = []
    # Drained as it comes: a long run's log would otherwise fill the pipe and stall the child.
    drain = threading.Thread(target=lambda: errors.extend(child.stderr or ()), daemon=True)
    drain.start()
    while child.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.1)
    wall = time.monotonic() - started
    drain.join(timeout=5)
    if child.returncode != 0:
        raise SystemExit("".join(errors)[-3000:] or "failed")
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
    db_bytes = sum(path.stat().st_size for path in workdir.glob(f"{db.name}*"))
    result = {"wall_s": round(wall, 1), "texts_per_s": round(texts / wall), "rss_mib": round(rss), "stored": stored,
              "bytes_per_vector": per_vector, "db_bytes_per_text": round(db_bytes / texts),
              "requests": counted["requests_total"], "embedded": counted["embedding_inputs"],
              "batches": counted["batches"], "batch_lines": counted["batch_lines"]}
    for path in workdir.glob(f"{db.name}*"):
        path.unlink()
    return result


def watch_load(stop: threading.Event) -> None:
    while not stop.wait(60):
        print(f"load: {os.getloadavg()}", flush=True)


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
    stop = threading.Event()
    threading.Thread(target=watch_load, args=(stop,), daemon=True).start()
    with Simulator.in_process(SimulatorConfig(latency=0.0, batch_processing_seconds=5.0)) as base_url, \
            tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        flows, plains = [], []
        for _ in range(args.repeat):
            reset(base_url)
            wall, rss = measured([sys.executable, __file__, "--child", "--base-url", base_url, "--texts",
                                  str(args.texts), "--concurrency", str(args.concurrency)], dict(os.environ))
            counted = stats(base_url)
            plains.append({"wall_s": round(wall, 1), "texts_per_s": round(args.texts / wall), "rss_mib": round(rss),
                           "requests": counted["requests_total"], "embedded": counted["embedding_inputs"]})
            print("baseline", plains[-1], flush=True)
            if args.texts:
                flows.append(run_dispatch(base_url, args.texts, args.concurrency, "all-realtime", workdir))
                print("llm-dispatch", flows[-1], flush=True)
        for name, runs in (("baseline", plains), ("llm-dispatch", flows)):
            if runs:
                print(f"{name:12s} median of {len(runs)}: {statistics.median(r['texts_per_s'] for r in runs):,.0f} "
                      f"texts/s, {statistics.median(r['wall_s'] for r in runs):.1f} s, requests "
                      f"{runs[0]['requests']:,}, peak RSS {statistics.median(r['rss_mib'] for r in runs):.0f} MiB",
                      flush=True)
        if flows and plains:
            print(f"llm-dispatch / baseline throughput: "
                  f"{statistics.median(r['texts_per_s'] for r in flows) / statistics.median(r['texts_per_s'] for r in plains):.2f}; "
                  f"bytes per stored vector {flows[0]['bytes_per_vector']:.0f}, database bytes per text "
                  f"{flows[0]['db_bytes_per_text']:,}", flush=True)
        if args.batch_texts:
            batch = run_dispatch(base_url, args.batch_texts, args.concurrency, "all-batch", workdir)
            print("batch", batch, flush=True)
        stop.set()
        print(f"load: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
