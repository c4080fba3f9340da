"""Benchmark: the realtime-dispatch flow at growing job sizes, against the aiohttp baseline in the same run.

Per size and concurrency, one baseline and one flow child process (``bench/realtime.py``'s), each fresh:
peak RSS, the flow's phases (record, plan, send; "other" is flow start and the summary) and CPU seconds, send-phase
and whole-process throughput, and the SQLite database's bytes per prompt. A low simulator latency
(20 ms) keeps a million prompts to minutes and makes the client's CPU what is measured. ``--rss-log DIR``
keeps each child's memory over time (``bench/_rss.py``: anonymous vs file-backed, glibc vs Python objects).

    PREFECT_API_URL=http://127.0.0.1:4299/api python bench/scale.py --prompts 10000 100000 1000000 --concurrency 100 400
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from realtime import ROOT, make_prompts, run_child  # bench/ is the script's folder, first on sys.path


def db_bytes(workdir: Path, *, concurrency: int) -> int:
    base = workdir / f"bench-flow-{concurrency}-0.db"
    return sum(path.stat().st_size for path in (base, Path(f"{base}-wal")) if path.exists())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--rss-log", type=Path, help="folder for the flow children's RSS over time "
                        "(flow-PROMPTS-C.jsonl: VmRSS, anonymous, file-backed kB and threads every 0.5 s)")
    args = parser.parse_args()

    from llm_dispatch.simulator import Simulator, SimulatorConfig

    print(f"simulator latency {args.latency * 1000:.0f} ms, {os.cpu_count()} cores, "
          f"PREFECT_API_URL={os.environ.get('PREFECT_API_URL', '(ephemeral)')}")
    header = ("prompts", "C", "base/s", "flow/s", "flow/base", "send/s", "send/base", "record s", "plan s",
              "send s", "other s", "CPU s", "RSS MB", "base RSS", "DB B/p")
    print(" | ".join(header))
    with Simulator.in_process(SimulatorConfig(latency=args.latency)) as base_url:
        for count in args.prompts:
            with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
                workdir = Path(tmp)
                prompts = workdir / "prompts.jsonl"
                make_prompts(prompts, count)
                for concurrency in args.concurrency:
                    logs = {kind: str(args.rss_log.resolve() / f"{kind}-{count}-{concurrency}.jsonl")
                            if args.rss_log else None for kind in ("baseline", "flow")}
                    runs = {kind: run_child(kind, base_url=base_url, prompts=prompts, concurrency=concurrency,
                                            workdir=workdir, run=0, rss_log=logs[kind],
                                            # slower than 250 prompts a second is taken for a hung child
                                            timeout=max(900.0, count / 250)) for kind in ("baseline", "flow")}
                    base, flow = runs["baseline"], runs["flow"]
                    base_rate, flow_rate = count / base["seconds"], count / flow["seconds"]
                    send_rate = count / flow["send_seconds"]
                    phases = [flow[f"phase_{name}"] for name in ("record", "plan", "send")]
                    row = (f"{count:,}", str(concurrency), f"{base_rate:.0f}", f"{flow_rate:.0f}",
                           f"{flow_rate / base_rate:.3f}x", f"{send_rate:.0f}", f"{send_rate / base_rate:.3f}x",
                           *(f"{p:.2f}" for p in phases), f"{flow['seconds'] - sum(phases):.2f}",
                           f"{flow['cpu_seconds']:.1f}",
                           f"{flow['peak_rss_mb']:.0f}", f"{base['peak_rss_mb']:.0f}",
                           f"{db_bytes(workdir, concurrency=concurrency) / count:.0f}")
                    print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
