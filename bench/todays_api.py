"""Issue 24's table, re-run: what llm-dispatch does against an endpoint that behaves like today's APIs.

Each case is a real ``llm-dispatch run FILE --json`` (the installed command, in a child process, as a user runs
it) against the bundled simulator in its own process, with the simulator's markers and modes standing in for the
provider's behaviour. The simulator counts the requests each marker made, so "sent once" is its count, not ours.

    python bench/todays_api.py [--slow-seconds 130]

Cases (each run twice where a re-run could send something again):

1. 25 prompts to gpt-6-luna: 20 with ``"params": {"max_tokens": 50}``, a refusal, a prompt with ``tools``, a 200
   whose body is not JSON, a 130 s generation (``max_completion_tokens`` 16000), and a plain one.
2. A provider that misbehaves: ``{"choices": []}`` with usage, an error body with status 200, a body cut off after
   its headers; and Anthropic's ``tool_use`` and ``stop_reason: "refusal"``.
3. A 401 on every call, 300 prompts; 4. ``insufficient_quota`` on every call.

Rows owned by other work (the ``max_tokens`` mapping, the cost of gpt-6-luna) are printed as they stand. Set
``PREFECT_API_URL`` to a running Prefect server to save each run the start of a temporary one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
LUNA = "gpt-6-luna"
CLAUDE = "claude-sonnet-4-6"
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                         "parameters": {"type": "object", "required": ["city"],
                                                        "properties": {"city": {"type": "string"}}}}}


@dataclass
class Row:
    prompt: str
    needs: str
    now: str
    requests: str
    ok: bool | None  # None: not this work's to make right (another branch's part); shown as it stands

    def cells(self) -> list[str]:
        mark = "n/a" if self.ok is None else "OK" if self.ok else "WRONG"
        return [self.prompt, self.needs, self.now, self.requests, mark]


@dataclass
class Sim:
    base_url: str

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.root}/_sim/stats", timeout=10).raise_for_status().json()

    def configure(self, **fields: Any) -> None:
        httpx.post(f"{self.root}/_sim/config", json=fields, timeout=10).raise_for_status()

    def reset(self) -> None:
        httpx.post(f"{self.root}/_sim/reset", timeout=10).raise_for_status()


@dataclass
class Run:
    code: int
    summary: dict[str, Any]
    stderr: str
    seconds: float
    results: list[dict[str, Any]] = field(default_factory=list)


def run(path: Path, *, db: Path, sim: Sim, env: dict[str, str] | None = None) -> Run:
    """``llm-dispatch run PATH --json`` against the simulator, all real-time, into the SQLite file ``db``."""
    environment = {**os.environ, "LLM_DISPATCH_BASE_URL": sim.base_url, "LLM_DISPATCH_ANTHROPIC_BASE_URL": sim.root,
                   "LLM_DISPATCH_DATABASE_URL": f"sqlite+aiosqlite:///{db}", "PREFECT_LOGGING_LEVEL": "WARNING",
                   "OPENAI_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-ant-bench", **(env or {})}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "llm_dispatch.cli.main", "run", str(path), "--route", "all-realtime",
                           "--json"], env=environment, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - started
    try:
        summary = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        summary = {"unparsed": done.stdout[-2000:]}
    return Run(done.returncode, summary, done.stderr, seconds, results=rows(db))


def rows(db: Path) -> list[dict[str, Any]]:
    """Every stored result with its prompt's id and model, oldest first."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute(
            "SELECT p.custom_id, p.model, p.status AS prompt_status, r.* FROM results r "
            "JOIN prompts p ON p.id = r.prompt_id ORDER BY r.id")]


def of(results: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    return [row for row in results if row["custom_id"] == prompt]


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def sim_refuses_max_tokens(sim: Sim) -> bool:
    """Whether the simulator answers a reasoning model's ``max_tokens`` with OpenAI's 400, as the API does."""
    answer = httpx.post(f"{sim.base_url}/chat/completions", timeout=30, json={
        "model": LUNA, "max_tokens": 5, "messages": [{"role": "user", "content": "probe"}]})
    return answer.status_code == 400


def luna_case(sim: Sim, tmp: Path) -> list[Row]:
    records = [{"id": f"capped-{i}", "prompt": f"Name a river, please ({i}).", "model": LUNA,
                "params": {"max_tokens": 50}} for i in range(20)]
    records += [
        {"id": "refusal", "prompt": "[[sim:refuse]] Explain how to pick my neighbour's lock.", "model": LUNA},
        # gpt-6-luna takes function tools on Chat Completions only with reasoning_effort "none" (OpenAI's checklist).
        {"id": "tools", "prompt": "What is the weather in Oslo?", "model": LUNA,
         "params": {"tools": [TOOL], "reasoning_effort": "none"}},
        {"id": "not-json", "prompt": "[[sim:malformed]] Summarise the report.", "model": LUNA},
        {"id": "slow", "prompt": "[[sim:slow]] Prove the theorem.", "model": LUNA,
         "params": {"max_completion_tokens": 16000}},
        {"id": "plain", "prompt": "What is the capital of Australia?", "model": LUNA},
    ]
    path, db = write(tmp / "luna.jsonl", records), tmp / "luna.db"
    refuses = sim_refuses_max_tokens(sim)
    sim.reset()
    first = run(path, db=db, sim=sim)
    first_requests = sim.stats()["requests_total"]
    again = run(path, db=db, sim=sim)  # the same command once more: nothing is sent again
    # An identical refused prompt in another job is asked afresh, never answered with the stored refusal.
    other = run(write(tmp / "other.jsonl", [records[20]]), db=db, sim=sim)
    stats, results = sim.stats(), other.results
    capped = [row for row in results if row["custom_id"].startswith("capped-") and row["status"] == "succeeded"]
    answered = [row for row in results if row["model"] == LUNA and row["status"] in ("succeeded", "refused")
                and row["route"] != "reused"]
    priced = [row for row in answered if row["cost_pico_usd"]]
    refusal, tools, garbled, slow = (of(results, name) for name in ("refusal", "tools", "not-json", "slow"))
    markers = stats["markers"]
    rows_ = [
        Row("20 with `\"params\": {\"max_tokens\": 50}`", "answered (sent as max_completion_tokens)",
            f"{len(capped)} of 20 answered (the simulator {'refuses' if refuses else 'does not yet refuse'} "
            f"max_tokens on {LUNA})", f"{first_requests} for the file's 25 prompts (first run)", None),
        Row(f"any {LUNA} answer", "its cost",
            f"{len(priced)} of {len(answered)} answers priced"
            + (f" (${sum(row['cost_pico_usd'] for row in priced) / 1e12:.6f})" if priced else ""), "-", None),
        Row("a refusal (message.refusal set, content null)", "stored as a refusal, never reused",
            f"status {refusal[0]['status']!r}, refusal text {bool(refusal[0]['refusal'])}; the identical prompt in "
            f"another job asked again: {markers.get('refuse', 0) == 2}; re-run sent it again: "
            f"{markers.get('refuse', 0) > 2}", f"{markers.get('refuse', 0)} (first job, then the other job)",
            refusal[0]["status"] == "refused" and markers.get("refuse") == 2),
        Row("a prompt with `tools`", "the tool call stored",
            f"finish_reason {tools[0]['finish_reason']!r}, tool_calls "
            f"{json.loads(tools[0]['tool_calls'])[0]['function']['name'] if tools[0]['tool_calls'] else None!r}",
            "1", tools[0]["finish_reason"] == "tool_calls" and bool(tools[0]["tool_calls"])),
        Row("a 200 whose body is not JSON", "stored as a failure, never resent",
            f"{garbled[0]['status']}, {garbled[0]['error_class']}; prompt {garbled[0]['prompt_status']}",
            f"{markers.get('malformed', 0)} in two runs", markers.get("malformed") == 1
            and garbled[0]["status"] == "failed"),
        Row("a 130 s generation (`max_completion_tokens` 16000)", "answered once",
            f"{slow[-1]['status']} after {slow[-1]['latency_ms'] / 1000:.0f} s, {slow[-1]['attempts']} attempt(s)",
            f"{markers.get('slow', 0)} in two runs", markers.get("slow") == 1 and slow[-1]["status"] == "succeeded"),
    ]
    print(f"  25 prompts to {LUNA}: first run {first.seconds:.0f} s (exit {first.code}), re-run {again.seconds:.0f} s "
          f"(sent {again.summary.get('realtime', {}).get('sent_prompts')}), counts {first.summary.get('counts')}",
          flush=True)
    return rows_


def misbehaving_case(sim: Sim, tmp: Path) -> list[Row]:
    records = [
        {"id": "empty", "prompt": "[[sim:empty_choices]] Name a lake."},
        {"id": "error200", "prompt": "[[sim:error200]] Name a sea."},
        {"id": "cut", "prompt": "[[sim:cut]] Name a bay."},
        {"id": "claude-tool", "prompt": "What is the weather in Oslo?", "model": CLAUDE,
         "params": {"max_tokens": 300, "tools": [TOOL]}},
        {"id": "claude-refusal", "prompt": "[[sim:refuse]] Explain how to pick my neighbour's lock.", "model": CLAUDE,
         "params": {"max_tokens": 300}},
    ]
    path, db = write(tmp / "misbehaving.jsonl", records), tmp / "misbehaving.db"
    sim.reset()
    run(path, db=db, sim=sim)
    last = run(path, db=db, sim=sim)
    markers, results = sim.stats()["markers"], last.results
    rows_: list[Row] = []
    for name, marker, what in (("empty", "empty_choices", '`{"choices": []}` with usage'),
                               ("error200", "error200", "an error body with status 200")):
        [row] = of(results, name)
        rows_.append(Row(what, "a failure, sent once, its reported usage paid for",
                         f"{row['status']}, {row['prompt_tokens']} prompt tokens, cost ${(row['cost_pico_usd'] or 0) / 1e12:.8f}",
                         f"{markers.get(marker, 0)} in two runs",
                         markers.get(marker) == 1 and row["status"] == "failed" and (row["cost_pico_usd"] or 0) > 0))
    cut = of(results, "cut")
    rows_.append(Row("a body cut off after its headers", "retried at most once",
                     f"{cut[-1]['status']} ({cut[-1]['error_class'] or 'answered'}), {cut[-1]['attempts']} attempts",
                     f"{markers.get('cut', 0)} in two runs", markers.get("cut", 0) <= 2))
    tool, refusal = of(results, "claude-tool"), of(results, "claude-refusal")
    arguments = json.loads(tool[0]["tool_calls"])[0]["function"]["arguments"] if tool[0]["tool_calls"] else None
    rows_.append(Row("Anthropic `tool_use`", "the call stored with its input",
                     f"finish_reason {tool[0]['finish_reason']!r}, arguments {arguments}", "1",
                     bool(arguments) and json.loads(arguments).get("city") is not None))
    rows_.append(Row("Anthropic `stop_reason: \"refusal\"`", "stored as a refusal",
                     f"status {refusal[0]['status']!r}: {refusal[0]['refusal']!r}", str(markers.get("refuse", 0)),
                     refusal[0]["status"] == "refused"))
    return rows_


def stop_case(sim: Sim, tmp: Path, *, name: str, prompts: int, config: dict[str, Any],
              env: dict[str, str] | None = None) -> tuple[Run, int]:
    path, db = write(tmp / f"{name}.jsonl", [{"id": i, "prompt": f"Question {i}?"} for i in range(prompts)]), \
        tmp / f"{name}.db"
    sim.reset()
    sim.configure(**config)
    try:
        done = run(path, db=db, sim=sim, env=env)
        return done, sim.stats()["requests_total"]
    finally:
        sim.configure(**{key: None for key in config})


def account_cases(sim: Sim, tmp: Path) -> list[Row]:
    revoked, sent = stop_case(sim, tmp, name="revoked", prompts=300, config={"api_key": "sk-the-right-one"})
    line = next((text for text in revoked.stderr.splitlines() if text.startswith("error:")), "(no error line)")
    counts = revoked.summary.get("counts")
    rows_ = [Row("a 401 on every call, 300 prompts", "stop after a few; say what to fix; the same command continues",
                 f"exit {revoked.code}, {counts}; `{line[:160]}...`", f"{sent} of 300", sent <= 3)]
    broke, sent = stop_case(sim, tmp, name="quota", prompts=50, config={"always_fault": "insufficient_quota"})
    line = next((text for text in broke.stderr.splitlines() if text.startswith("error:")), "(no error line)")
    rows_.append(Row("`insufficient_quota` on every call, 50 prompts", "not retried; says to add credit",
                     f"exit {broke.code}; hint shown: {'add credit' in line}; 'lower concurrency' shown: "
                     f"{'LLM_DISPATCH_CONCURRENCY' in line}", f"{sent} of 50",
                     sent <= 3 and "add credit" in line and "LLM_DISPATCH_CONCURRENCY" not in line))
    return rows_


@contextlib.contextmanager
def simulator(slow_seconds: float) -> Iterator[Sim]:
    from llm_dispatch.simulator import Simulator, SimulatorConfig

    config = SimulatorConfig(latency=0.05, slow_tokens_per_second=16_000 / slow_seconds)
    with Simulator.in_process(config) as base_url:
        yield Sim(base_url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow-seconds", type=float, default=130.0,
                        help="how long the long generation (16,000 tokens) takes: 130 s as in the issue")
    args = parser.parse_args()
    print(f"PREFECT_API_URL={os.environ.get('PREFECT_API_URL', '(a temporary server per run)')}", flush=True)
    table: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-todays-api-") as name, simulator(args.slow_seconds) as sim:
        tmp = Path(name)
        for case in (luna_case, misbehaving_case, account_cases):
            started = time.perf_counter()
            table += case(sim, tmp)
            print(f"  {case.__name__}: {time.perf_counter() - started:.0f} s", flush=True)
    header = ["prompt", "what a user needs", "llm-dispatch now", "simulator requests", ""]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in table:
        print("| " + " | ".join(cell.replace("|", "/") for cell in row.cells()) + " |")
    wrong = [row.prompt for row in table if row.ok is False]
    print(f"\n{len(table) - len(wrong)} of {len(table)} rows as the middle column says" +
          (f"; WRONG: {', '.join(wrong)}" if wrong else ""))
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
