"""llm-dispatch: Prefect 3 flows that send thousands to millions of prompts to LLM APIs, real-time or through
the Batch API, with every result and cost in SQL.

One import root, with the layers as subpackages, each importing only the public names of those below it:

- ``llm_dispatch.core``: settings, inputs, routing, tokens, prices, the HTTP client (no Prefect);
- ``llm_dispatch.storage``: the schema, its migrations and every query (no Prefect);
- ``llm_dispatch.jobs``: a job's steps as plain async code (no Prefect);
- ``llm_dispatch.tasks``: one Prefect task per step;
- ``llm_dispatch.flows``: the flows (``dispatch``, ``realtime-dispatch``, ``collect-batches``...);
- ``llm_dispatch.cli``: the ``llm-dispatch`` command;
- ``llm_dispatch.simulator``: a local OpenAI- and Anthropic-compatible server, beside the core.

Importing ``llm_dispatch`` itself loads none of them.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
