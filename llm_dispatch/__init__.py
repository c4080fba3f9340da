"""llm-dispatch: Prefect 3 flows that send thousands to millions of prompts to LLM APIs, real-time or through
the Batch API, with every result and cost in SQL.

From Python, ``run_prompts`` (a script) or ``await arun_prompts`` (a notebook) runs a list of prompts or a file as
``llm-dispatch run`` does and returns a ``Row`` per prompt, its answer parsed into a Pydantic model.

One import root, with the layers as subpackages, each importing only the public names of those below it:

- ``llm_dispatch.core``: settings, inputs, routing, tokens, prices, the HTTP client (no Prefect);
- ``llm_dispatch.storage``: the schema, its migrations and every query (no Prefect);
- ``llm_dispatch.jobs``: a job's steps as plain async code (no Prefect);
- ``llm_dispatch.tasks``: one Prefect task per step;
- ``llm_dispatch.flows``: the flows (``dispatch``, ``realtime-dispatch``, ``collect-batches``...);
- ``llm_dispatch.cli``: the ``llm-dispatch`` command, and ``run_prompts``;
- ``llm_dispatch.simulator``: a local OpenAI- and Anthropic-compatible server, beside the core.

Importing ``llm_dispatch`` itself loads none of them but the core's error tree; ``run_prompts`` and its kin load
the command's package when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_dispatch.core import lazy_names

if TYPE_CHECKING:
    from .cli import Row, Rows, arun_prompts, run_prompts

__version__ = "0.1.0"

__all__ = ["Row", "Rows", "__version__", "arun_prompts", "run_prompts"]

__getattr__, __dir__ = lazy_names(__name__)
