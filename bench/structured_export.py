"""Parquet export of a large structured job: `python bench/structured_export.py [--rows 1000000]`.

Makes a SQLite database at the newest migration holding one job of ``--rows`` prompts, each with a schema and one
answer (90% valid, parsed; 10% invalid with a violation), written straight with sqlite3 (the bench measures the
export, not sending). Then runs the installed ``llm-dispatch export JOB --format parquet --output FILE`` under
``/usr/bin/time -v``: its wall time and peak RSS, the file's size, and the file read back with pyarrow (rows,
types). The machine's load is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["label", "confidence", "flagged"],
          "properties": {"label": {"type": "string"}, "confidence": {"type": "number"}, "flagged": {"type": "boolean"}}}
PARAMS = json.dumps({"response_format": {"type": "json_schema", "json_schema": {"name": "label", "schema": SCHEMA,
                                                                                "strict": True}}})


async def _migrate(url: str) -> None:
    from llm_dispatch.storage import open_database

    async with open_database(url):
        pass


def make(database: Path, rows: int) -> None:
    asyncio.run(_migrate(f"sqlite+aiosqlite:///{database}"))
    now = "2026-11-26 12:00:00.000000"
    with sqlite3.connect(database) as con:
        con.execute("INSERT INTO jobs (id, name, created_at, updated_at, fingerprint, model, settings, status) "
                    "VALUES ('job-1m', 'labels-1m', ?, ?, 'f', 'gpt-4o-mini', '{}', 'finished')", (now, now))
        step = 50_000
        for start in range(0, rows, step):
            prompts, results = [], []
            for n in range(start, min(rows, start + step)):
                prompts.append((n + 1, "job-1m", f"r{n}", n, "gpt-4o-mini",
                                json.dumps([{"role": "user", "content": f"Label review {n}."}]), PARAMS,
                                f"{n:064x}", "succeeded" if n % 10 else "invalid", 1, now, now))
                valid = n % 10 != 0
                parsed = json.dumps({"label": "positive", "confidence": n / rows, "flagged": bool(n & 1)})
                results.append((n + 1, n + 1, "job-1m", now, "realtime", "succeeded" if valid else "invalid",
                                parsed if valid else "not json", "stop", 40, 12, 0, 1,
                                parsed if valid else None, None if valid else "the answer is not JSON", 0, 4200))
            con.executemany("INSERT INTO prompts (id, job_id, custom_id, position, model, messages, params, "
                            "dedupe_key, status, attempts, created_at, updated_at) VALUES "
                            "(?,?,?,?,?,?,?,?,?,?,?,?)", prompts)
            con.executemany("INSERT INTO results (id, prompt_id, job_id, created_at, route, status, text, "
                            "finish_reason, prompt_tokens, completion_tokens, cached_tokens, attempts, parsed, "
                            "violation, reask, cost_pico_usd) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        database, out = Path(tmp) / "big.db", Path(tmp) / "labels.parquet"
        started = time.monotonic()
        make(database, options.rows)
        print(f"made {options.rows} prompts and answers in {time.monotonic() - started:.0f} s")
        print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
        env = {**os.environ, "LLM_DISPATCH_DATABASE_URL": f"sqlite+aiosqlite:///{database}"}
        command = str(Path(sys.executable).with_name("llm-dispatch"))
        done = subprocess.run(["/usr/bin/time", "-v", command, "export", "job-1m", "--format", "parquet",
                               "--output", str(out)], env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", done.stderr).group(1)
        rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
        import pyarrow.parquet as pq

        table = pq.read_table(out)
        print(f"export --format parquet: {table.num_rows} rows, wall {wall}, peak RSS {rss / 1024:.0f} MiB, "
              f"file {out.stat().st_size / 2**20:.1f} MiB; columns {', '.join(f'{f.name}:{f.type}' for f in table.schema)}")
        print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
