"""Issue 26's must-show jobs: `python bench/structured_jobs.py [--prompts 10000] [--rate 0.1]`.

A job of ``--prompts`` prompts with a schema (``--schema``), sent by the installed ``llm-dispatch run`` to a
simulator (``llm-dispatch simulate``) whose answers break the schema at ``--rate`` (not JSON, a missing field, a
wrong type, cut off: ``invalid_json_rate``, set through its admin API), once all real-time and once all batch,
each on a database of its own. Prints, per lane, from the database: prompts valid at the first answer, valid
after re-asks, still invalid, re-ask requests and what they cost, batches (the follow-up ones among them), the
job's cost and wall time; and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["label", "confidence", "reasons", "flagged"],
          "properties": {"label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
                         "confidence": {"type": "number"}, "flagged": {"type": "boolean"},
                         "reasons": {"type": "array", "items": {"type": "string"}}}}
PORT = 8917


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=0.1)
    options = parser.parse_args()
    command = str(Path(sys.executable).with_name("llm-dispatch"))
    print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "schema.json").write_text(json.dumps(SCHEMA))
        with (folder / "p.jsonl").open("w") as out:
            for n in range(options.prompts):
                out.write(json.dumps({"id": f"r{n}", "prompt": f"Label review {n}: good value, late delivery."})
                          + "\n")
        sim = subprocess.Popen([command, "simulate", "--port", str(PORT), "--latency", "0.05", "--batch-seconds",
                                "3"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            root = f"http://127.0.0.1:{PORT}"
            for _ in range(100):
                try:
                    httpx.post(f"{root}/_sim/config", json={"invalid_json_rate": options.rate}).raise_for_status()
                    break
                except httpx.HTTPError:
                    time.sleep(0.3)
            rows = [lane_run(command, folder, lane=lane, root=root) for lane in ("all-realtime", "all-batch")]
        finally:
            sim.terminate()
            sim.wait()
    print("| lane | prompts | valid at first | valid after re-asks | still invalid | re-asks | re-ask cost | "
          "batches (follow-up) | job cost | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(value) for value in row) + " |")
    print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


def lane_run(command: str, folder: Path, *, lane: str, root: str) -> list[object]:
    database = folder / f"{lane}.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_"))}
    env.update({"LLM_DISPATCH_BASE_URL": f"{root}/v1", "OPENAI_API_KEY": "sk-simulated",
                "LLM_DISPATCH_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
                "LLM_DISPATCH_BATCH_DIR": str(folder / f"{lane}-batches"), "LLM_DISPATCH_BATCH_POLL_INTERVAL": "1",
                "LLM_DISPATCH_CONCURRENCY": "200"})
    started = time.monotonic()
    done = subprocess.run([command, "run", "p.jsonl", "--schema", "schema.json", "--route", lane, "--json",
                           "--model", "gpt-4o-mini"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{lane} run failed ({done.returncode}): {done.stderr[-3000:]}")
    summary = json.loads(done.stdout)
    structured = summary["structured"]
    with sqlite3.connect(database) as con:
        batches = con.execute("SELECT COUNT(*) FROM batches").fetchone()[0]
        # A follow-up batch's lines are named p<prompt id>r<re-ask number>.
        follow_up = con.execute("SELECT COUNT(DISTINCT batch_id) FROM batch_members WHERE custom_id LIKE 'p%r%'"
                                ).fetchone()[0]
        statuses = dict(con.execute("SELECT status, COUNT(*) FROM prompts GROUP BY status").fetchall())
    assert sum(statuses.values()) == structured["prompts"] and set(statuses) <= {"succeeded", "invalid"}, statuses
    return [lane, structured["prompts"], structured["valid_first"], structured["valid_after_reasks"],
            structured["still_invalid"], structured["reasks"], f"${structured['reask_cost']:.6f}",
            f"{batches} ({follow_up})", f"${summary['cost']['total']:.6f}", f"{wall:.0f}"]


if __name__ == "__main__":
    main()
