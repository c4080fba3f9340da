"""Sending one request and reading its answer: ``LLMClient`` over an aiohttp-backed httpx transport, the gates
(rate limits from headers, concurrency), every attempt's deadline, failures and what a run stops for.

Modules here import ``wire`` (what to send and how to read it), ``pricing`` and the vocabulary; the face is
``llm_dispatch.core``."""
