"""``python -m llm_dispatch.simulator``: the command line that builds a SimulatorConfig and serves until stopped."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from llm_dispatch.core import LLMDispatchError

from ._config import SimulatorConfig
from ._server import DEFAULT_SIMULATOR_CONFIG, serve

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llm_dispatch.simulator",
        description="Simulator of OpenAI's and Anthropic's APIs on one port. Prints the (OpenAI) base URL on one line "
                    "when it is ready, then the Anthropic base URL.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--reuse-port", action="store_true",
                        help="let several simulator processes serve one port (SO_REUSEPORT), each with its own counters")
    parser.add_argument("--config-json", help="a whole SimulatorConfig as JSON; the options below override it")
    parser.add_argument("--latency", type=float)
    parser.add_argument("--latency-dist", choices=["fixed", "uniform", "lognormal"])
    parser.add_argument("--latency-spread", type=float)
    parser.add_argument("--latency-per-token", type=float)
    for fault in ("429", "500", "503", "529", "hang", "drop", "malformed"):
        parser.add_argument(f"--rate-{fault}", type=float, dest=f"rate_{fault}")
    parser.add_argument("--retry-after", type=float)
    parser.add_argument("--hang-seconds", type=float)
    parser.add_argument("--rpm", type=int)
    parser.add_argument("--tpm", type=int)
    parser.add_argument("--models", help="comma-separated model names to accept (default: any)")
    parser.add_argument("--api-key", help="require this key: `Authorization: Bearer KEY` on OpenAI's routes, "
                        "`x-api-key` on Anthropic's (default: accept any)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--batch-processing-seconds", type=float, help="how long one batch takes (default 2)")
    parser.add_argument("--no-batch-api", dest="batch_api", action="store_const", const=False,
                        help="serve no Batch API (404 on /v1/files and /v1/batches), as vLLM or Ollama")
    parser.add_argument("--provider", action="append", default=[], dest="providers", metavar="NAME",
                        help="also serve a named provider at /p/NAME (its OpenAI base URL /p/NAME/v1), with state of "
                             "its own; repeat for several")
    return parser


def _config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    changes: dict[str, Any] = json.loads(args.config_json) if args.config_json else {}
    options = vars(args)
    for name in SimulatorConfig.__dataclass_fields__:
        value = options.get(name)
        if value is not None:
            changes[name] = [m.strip() for m in value.split(",") if m.strip()] if name == "models" else value
    return DEFAULT_SIMULATOR_CONFIG.updated(changes)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        config = _config_from_args(args)
    except LLMDispatchError as exc:
        raise SystemExit(f"error: {exc}") from exc
    serve(host=args.host, port=args.port, config=config, providers=args.providers, reuse_port=args.reuse_port)
