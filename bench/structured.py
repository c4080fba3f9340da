"""Structured answers, what checking them costs: `python bench/structured.py [--answers 100000] [--prompts 2000]`.

1. Parsing and validating one answer (``core.check_answer``: json.loads, then jsonschema's Draft 2020-12 validator,
   built once per schema), over ``--answers`` simulator answers of a small extraction schema, 10% of them broken
   (not JSON, a missing field, a wrong type, cut off): microseconds per answer, against json.loads alone in the same
   run. Medians of 3.
2. The flow's CPU per prompt: ``llm-dispatch run --simulate --route all-realtime`` over ``--prompts`` prompts, with
   and without ``--schema`` (and --max-reasks 0, so both send as many requests), user+system CPU seconds of the
   whole command over its prompts. Medians of 3.

Prints the machine's load (``uptime``) with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llm_dispatch.core import check_answer
from llm_dispatch.simulator._completions import json_answer

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["label", "confidence", "reasons", "flagged"],
          "properties": {"label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
                         "confidence": {"type": "number"}, "flagged": {"type": "boolean"},
                         "reasons": {"type": "array", "items": {"type": "string"}}}}
FAULTS = (None,) * 36 + ("not_json", "missing_field", "wrong_type", "truncated_json")  # 10% broken


def answers(count: int) -> list[tuple[str, str]]:
    made = []
    for n in range(count):
        kind = FAULTS[n % len(FAULTS)]
        text, cut = json_answer(SCHEMA, value=n * 2654435761, kind=kind)
        made.append((text[: len(text) // 2] if cut else text, "length" if cut else "stop"))
    return made


def per_answer_us(made: list[tuple[str, str]]) -> tuple[float, float, int]:
    started = time.perf_counter()
    for text, _ in made:
        try:
            json.loads(text)
        except ValueError:
            pass
    loads = time.perf_counter() - started
    started = time.perf_counter()
    invalid = sum(not check_answer(SCHEMA, text=text, finish_reason=finish).valid for text, finish in made)
    checked = time.perf_counter() - started
    return loads / len(made) * 1e6, checked / len(made) * 1e6, invalid


def flow_cpu(prompts: int, *, schema: bool) -> float:
    command = str(Path(sys.executable).with_name("llm-dispatch"))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "schema.json").write_text(json.dumps(SCHEMA))
        with (folder / "p.jsonl").open("w") as out:
            for n in range(prompts):
                out.write(json.dumps({"id": n, "prompt": f"Label review {n}: fine product, slow delivery."}) + "\n")
        args = [command, "run", "p.jsonl", "--simulate", "--sim-latency", "0", "--route", "all-realtime",
                "--json", "--max-reasks", "0"] + (["--schema", "schema.json"] if schema else [])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_DISPATCH_", "OPENAI_", "ANTHROPIC_"))}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"llm-dispatch run failed: {done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=100_000)
    parser.add_argument("--prompts", type=int, default=2_000)
    options = parser.parse_args()
    print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    made = answers(options.answers)
    runs = [per_answer_us(made) for _ in range(3)]
    loads, checked = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    print(f"{options.answers} answers, {runs[0][2]} invalid: json.loads alone {loads:.2f} us/answer; "
          f"check_answer (parse + Draft 2020-12 validation) {checked:.2f} us/answer (medians of 3)")
    plain = statistics.median(flow_cpu(options.prompts, schema=False) for _ in range(3))
    with_schema = statistics.median(flow_cpu(options.prompts, schema=True) for _ in range(3))
    print(f"llm-dispatch run --simulate, {options.prompts} prompts, CPU per prompt (command and its simulator): "
          f"{plain * 1e6:.0f} us without a schema, {with_schema * 1e6:.0f} us with one (medians of 3); "
          f"checking is {checked / (with_schema * 1e6) * 100:.1f}% of the flow's CPU per prompt")
    print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
