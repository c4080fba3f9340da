"""The simulator's ``POST /v1beta/models/{model}:batchEmbedContents``: Gemini's embeddings, with generateContent's
key check, faults and quotas (``_gemini``).

The body is Google's (REST reference, ``models.batchEmbedContents``): ``requests``, each an EmbedContentRequest
naming the path's model (``models/{model}``), one text part at least, and ``taskType`` / ``title`` /
``outputDimensionality``; at most ``MAX_REQUESTS`` of them, as the API answers 400 "at most 100 requests can be in
one batch". The answer is ``{"embeddings": [{"values": [...]}], "usageMetadata": {"promptTokenCount"}}``, the
vectors the OpenAI route answers for the same text and model (``embedding_vector``), 3,072 long unless asked for
fewer. The request is one against the quotas, charged its texts' tokens; ``[[sim:FAULT]]`` markers in a text work
as in a chat message.
"""

from __future__ import annotations

import struct
from typing import Any

from aiohttp import web

from ._embeddings import _vector_bytes
from ._gemini import GEMINI_PATH, _GeminiRoutes, _target, gemini_error, routes
from aiohttp.typedefs import Handler
from ._state import SimState
from ._http import json_dumps
from ._tokens import count_tokens

__all__ = ["GEMINI_DEFAULT_DIMENSIONS", "MAX_REQUESTS", "EmbedRoutes", "batch_embed_answer", "batch_embed_problem",
           "models_handler"]

# gemini-embedding-001's and gemini-embedding-2's default length.
GEMINI_DEFAULT_DIMENSIONS = 3072
MAX_REQUESTS = 100
_REQUEST_FIELDS = frozenset({"model", "content", "taskType", "title", "outputDimensionality"})
_TASK_TYPES = frozenset({"TASK_TYPE_UNSPECIFIED", "RETRIEVAL_QUERY", "RETRIEVAL_DOCUMENT", "SEMANTIC_SIMILARITY",
                         "CLASSIFICATION", "CLUSTERING", "QUESTION_ANSWERING", "FACT_VERIFICATION",
                         "CODE_RETRIEVAL_QUERY"})


def models_handler(state: SimState) -> Handler:
    """The real-time handler of ``POST /v1beta/models/{model}:{method}``: generateContent (``_gemini``) and
    batchEmbedContents, bound to ``state``; any other method answers generateContent's 404. (``_gemini_batches``
    registers the path, which ``:batchGenerateContent`` shares.)"""
    by_method = {route.method: route for route in (*routes(state), EmbedRoutes(state))}
    generate = by_method[_GeminiRoutes.method]

    async def handle(request: web.Request) -> web.StreamResponse:
        return await by_method.get(_target(request)[1], generate).handle(request)

    return handle


def _texts(body: dict[str, Any]) -> list[str]:
    return ["".join(part["text"] for part in item["content"]["parts"]) for item in body["requests"]]


def batch_embed_problem(body: Any, *, model: str) -> str | None:
    """Google's 400 message for a batchEmbedContents body it refuses, or None."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received. Expected an object."
    for name in body:
        if name != "requests":
            return f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.'
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        return "* BatchEmbedContentsRequest.requests: requests is not specified"
    if len(requests) > MAX_REQUESTS:
        return f"* BatchEmbedContentsRequest.requests: at most {MAX_REQUESTS} requests can be in one batch"
    for index, item in enumerate(requests):
        where = f"BatchEmbedContentsRequest.requests[{index}]"
        if not isinstance(item, dict):
            return f"Invalid value at 'requests[{index}]': expected an object."
        unknown = sorted(set(item) - _REQUEST_FIELDS)
        if unknown:
            return f'Invalid JSON payload received. Unknown name "{unknown[0]}" at \'requests[{index}]\': ' \
                   "Cannot find field."
        if item.get("model") != f"models/{model}":
            return (f"* {where}.model: the model in each request must match the model of the batch "
                    f"(models/{model}), got {item.get('model')!r}")
        content = item.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        if not isinstance(parts, list) or not parts or not all(
                isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"] for part in parts):
            return f"* {where}.content.parts: content must hold text parts"
        dimensions = item.get("outputDimensionality")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or not 1 <= dimensions <= GEMINI_DEFAULT_DIMENSIONS):
            return f"* {where}.output_dimensionality: must be between 1 and {GEMINI_DEFAULT_DIMENSIONS}"
        if "taskType" in item and item["taskType"] not in _TASK_TYPES:
            return f"Invalid value at 'requests[{index}].task_type': {item['taskType']!r}"
    return None


def batch_embed_answer(body: dict[str, Any], *, model: str) -> tuple[dict[str, Any], int]:
    """The BatchEmbedContentsResponse for a valid body, and its prompt tokens."""
    embeddings = []
    tokens = 0
    for item, text in zip(body["requests"], _texts(body)):
        dimensions = item.get("outputDimensionality") or GEMINI_DEFAULT_DIMENSIONS
        tokens += count_tokens(text)
        raw = _vector_bytes(text, model=model, dimensions=dimensions)
        embeddings.append({"values": list(struct.unpack(f"<{dimensions}f", raw))})
    return {"embeddings": embeddings, "usageMetadata": {"promptTokenCount": tokens}}, tokens


class EmbedRoutes(_GeminiRoutes):
    """generateContent's route with an embeddings body: the same key check, faults, quotas, latency and stats."""

    method = "batchEmbedContents"

    def _invalid_body(self, body: Any, request: web.Request) -> web.Response | None:
        problem = batch_embed_problem(body, model=self._model_of(request, body))
        return None if problem is None else gemini_error(400, problem)

    def _turns(self, body: dict[str, Any]) -> Any:
        # Markers are looked for in turns: each text is one user turn for that purpose.
        return [{"role": "user", "content": text} for text in _texts(body)]

    async def _answer_valid(
        self, request: web.Request, *, body: dict[str, Any], model: str, digest: bytes, kind: str | None = None
    ) -> web.StreamResponse:
        answer, tokens = batch_embed_answer(body, model=model)
        state = self._state

        def render() -> bytes:
            state.stats.count("embeddings")
            state.stats.embedding_inputs += len(answer["embeddings"])
            state.stats.prompt_tokens += tokens
            return json_dumps(answer).encode()

        return await self._answer_admitted(request, model=model, charge=tokens, output_tokens=0, render=render)
