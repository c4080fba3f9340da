"""A long generation against the simulator, sent plain and in background mode at once (issue 27's must-show).

    .venv/bin/python bench/background.py --tokens 12000 --rate 20      # 600 s of generation

The plain request holds its connection for the whole generation and gives up at its attempt deadline (which grows
with the cap, ``attempt_deadline``); the background one is created, polled, and answered once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request

from llm_dispatch.core import ChatRequest, LLMClient
from llm_dispatch.core.http._deadlines import attempt_deadline
from llm_dispatch.simulator import Simulator, SimulatorConfig


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=12_000)
    parser.add_argument("--rate", type=float, default=20.0, help="tokens a second the simulator generates at")
    args = parser.parse_args()
    config = SimulatorConfig(latency=0.0, slow_tokens_per_second=args.rate)
    with Simulator.in_thread(config) as base_url:
        def request(background: bool) -> ChatRequest:
            return ChatRequest(model="gpt-6-luna", endpoint="responses",
                               messages=[{"role": "user", "content": "[[sim:slow]] write the whole report"}],
                               params={"max_completion_tokens": args.tokens, "background": background})

        async def send(background: bool) -> str:
            started = time.monotonic()
            async with LLMClient(base_url=base_url, api_key="sk-sim", background_poll=5.0) as client:
                try:
                    result = await client.chat(request(background))
                except Exception as exc:  # noqa: BLE001 - the outcome is the figure
                    return f"{'background' if background else 'plain':10s} failed after {time.monotonic() - started:6.0f} s: {type(exc).__name__}"
            return (f"{'background' if background else 'plain':10s} answered after {time.monotonic() - started:6.0f} s: "
                    f"{result.completion_tokens} tokens, finish {result.finish_reason}")

        print(f"generation: {args.tokens} tokens at {args.rate:g}/s = {args.tokens / args.rate:.0f} s; plain attempt "
              f"deadline {attempt_deadline(max_output=args.tokens, floor=600):.0f} s", flush=True)
        for line in await asyncio.gather(send(False), send(True)):
            print(line, flush=True)
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_sim/stats") as answer:
            stats = json.load(answer)
        print("simulator:", {k: v for k, v in stats["by_status"].items() if k.startswith("background")},
              f"requests_total={stats['requests_total']}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
