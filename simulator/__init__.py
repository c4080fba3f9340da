"""A local server for OpenAI's API (chat completions, embeddings, files and the Batch API), Anthropic's (Messages and
Message Batches) and Gemini's (generateContent) with latency, faults and quotas on demand, so llm-dispatch runs and
is tested end to end without an API key.

The APIs share one port: OpenAI's base URL is ``http://HOST:PORT/v1`` (``Simulator.base_url``, what
``in_thread`` and ``in_process`` yield), Anthropic's and Gemini's the host alone (``Simulator.anthropic_base_url``,
``Simulator.gemini_base_url``, or ``anthropic_base_url(url)``), since their paths carry ``/v1`` and ``/v1beta``.
They share the config, the ``/_sim`` admin routes, the fault queues and one account for the RPM/TPM quotas;
``/_sim/stats`` counts each API's answers apart (``completions``, ``batches``; ``messages``, ``message_batches``;
``generate_contents``). Named providers (``Simulator(providers=["groq", ...])``, ``--provider NAME``) are served
beside them at ``/p/NAME`` (``provider_base_url``), each by an app of its own: every API, its own state and counters.

It is a product beside the core, never imported by it: a flow run does not load it.
"""

from __future__ import annotations

from ._cli import main
from ._config import SimulatorConfig
from ._embeddings import embedding_vector
from ._server import Simulator, anthropic_base_url, provider_base_url, serve
from ._tokens import completion_text, count_message_tokens, count_tokens

__all__ = [
    "Simulator",
    "SimulatorConfig",
    "anthropic_base_url",
    "completion_text",
    "embedding_vector",
    "count_message_tokens",
    "count_tokens",
    "main",
    "provider_base_url",
    "serve",
]
