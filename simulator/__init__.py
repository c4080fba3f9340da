"""A local OpenAI-compatible server (chat completions, files and the Batch API) with latency, faults and
quotas on demand, so llm-dispatch runs and is tested end to end without an API key.

It is a product beside the core, never imported by it: a flow run does not load it.
"""

from __future__ import annotations

from ._cli import main
from ._config import SimulatorConfig
from ._server import Simulator, serve
from ._tokens import completion_text, count_message_tokens, count_tokens

__all__ = [
    "Simulator",
    "SimulatorConfig",
    "completion_text",
    "count_message_tokens",
    "count_tokens",
    "main",
    "serve",
]
