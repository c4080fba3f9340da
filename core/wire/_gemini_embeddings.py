"""Gemini's embeddings: ``models/{model}:batchEmbedContents`` (v1beta), a packed request's texts in one call.

The wire is Google's own SDK's (google-genai ``models.py``: ``embed_content`` on the Developer API always posts to
``{model}:batchEmbedContents``, its body made by ``_EmbedContentParametersPrivate_to_mldev`` and
``_EmbedContentConfig_to_mldev``) and the REST reference's (ai.google.dev/api/embeddings,
``models.batchEmbedContents``): ``{"requests": [{"model": "models/{model}", "content": {"parts": [{"text": ...}]},
"taskType", "title", "outputDimensionality"}]}``, one request per text, each naming the path's model; the answer is
``{"embeddings": [{"values": [...]}]}`` in request order. A vector comes as JSON floats only (no base64 encoding),
stored as float32 bytes as OpenAI's are (``_vectors``).

Usage: the reference's ``BatchEmbedContentsResponse.usageMetadata`` (``EmbeddingUsageMetadata``:
``promptTokenCount``) is read when the answer holds it; an answer without it (the SDK's own types carry no usage for
the Developer API) is counted by our estimate of the texts sent (``estimate_text_tokens``, the same estimate the
budget reserves with), so its cost is an estimate at the model's input price.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from ._packing import embedding_text
from ._responses import Chat, count, parse_answer
from ._vectors import vector_bytes
from .._params import shown
from ..pricing._tokens import estimate_text_tokens
from .._types import ChatRequest, ChatResult

__all__ = ["GEMINI_EMBED_PATH", "GEMINI_EMBEDDING_PARAMS", "GEMINI_TASK_TYPES", "gemini_embed_request",
           "gemini_embedding_param_problem", "gemini_embeddings_body", "parse_batch_embed"]

# The SDK's path for ``embed_content`` on the Developer API (``'{model}:batchEmbedContents'`` under ``models/``),
# after the API version its client puts first.
GEMINI_EMBED_PATH = "/v1beta/models/{model}:batchEmbedContents"
# EmbedContentRequest's own fields (REST reference), and OpenAI's name for the vector's length, sent as
# ``outputDimensionality`` so one file's embeddings prompts read the same for either provider.
_OWN = frozenset({"taskType", "title", "outputDimensionality"})
GEMINI_EMBEDDING_PARAMS = _OWN | {"dimensions"}
# The reference's TaskType values.
GEMINI_TASK_TYPES = frozenset({
    "TASK_TYPE_UNSPECIFIED", "RETRIEVAL_QUERY", "RETRIEVAL_DOCUMENT", "SEMANTIC_SIMILARITY", "CLASSIFICATION",
    "CLUSTERING", "QUESTION_ANSWERING", "FACT_VERIFICATION", "CODE_RETRIEVAL_QUERY",
})
_NO_EQUIVALENT = {"encoding_format": "Gemini answers vectors as floats only (stored as float32 bytes either way): "
                                     "remove encoding_format for gemini models",
                  "user": "'user' has no Gemini equivalent; remove it for gemini models"}


def gemini_embedding_param_problem(name: str, value: Any) -> str | None:
    """Why ``name: value`` cannot go in a Gemini embeddings request (one line), or None."""
    if name in _NO_EQUIVALENT:
        return _NO_EQUIVALENT[name]
    if name not in GEMINI_EMBEDDING_PARAMS:
        return f"Gemini's embeddings take {', '.join(sorted(GEMINI_EMBEDDING_PARAMS))}; remove {shown(name)}"
    if name in ("dimensions", "outputDimensionality") and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1):
        return f"{name} must be a positive integer, not {value!r}"
    if name == "taskType" and value not in GEMINI_TASK_TYPES:
        return f"taskType must be one of {', '.join(sorted(GEMINI_TASK_TYPES))}, not {value!r}"
    if name == "title" and (not isinstance(value, str) or not value):
        return f"title must be a non-empty string, not {value!r}"
    return None


def gemini_embeddings_body(request: ChatRequest) -> dict[str, Any]:
    """The batchEmbedContents body for ``request``: one EmbedContentRequest per text, in order (a packed request's
    texts are its messages, one each)."""
    texts = [embedding_text([message]) for message in request.messages]
    if not texts or None in texts:
        raise ValueError("an embeddings prompt holds one text: give it as 'prompt' or 'input'")
    model = f"models/{request.model}"
    return {"requests": [{"model": model, **gemini_embed_request(str(text), request.params)} for text in texts]}


def gemini_embed_request(text: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """One EmbedContentRequest of ``text`` without its ``model`` (Batch Mode's ``asyncBatchEmbedContent`` names the
    model in its path, and google-genai's ``_EmbedContentBatch_to_mldev`` sends none): ``ValueError`` for a
    parameter Gemini does not take."""
    config: dict[str, Any] = {}
    for name, value in params.items():
        problem = gemini_embedding_param_problem(name, value)
        if problem is not None:
            raise ValueError(f"params.{name}: {problem}")
        config["outputDimensionality" if name == "dimensions" else name] = value
    return {"content": {"parts": [{"text": text}]}, **config}


def parse_batch_embed(response: httpx.Response) -> Chat:
    return parse_answer(response, lambda body: _chat(body, response), what="no readable embeddings[].values")


def _chat(body: Any, response: httpx.Response) -> Chat | None:
    embeddings = body.get("embeddings") if isinstance(body, Mapping) else None
    if not isinstance(embeddings, list) or not embeddings or not all(isinstance(item, Mapping)
                                                                       for item in embeddings):
        return None
    read = [vector_bytes(item.get("values")) for item in embeddings]
    vectors = [vector for vector in read if vector is not None]
    if len(vectors) != len(read):
        return None
    assert isinstance(body, Mapping)
    usage = body.get("usageMetadata")
    reported = count(usage.get("promptTokenCount")) if isinstance(usage, Mapping) else 0
    tokens = reported or _estimated_tokens(response)
    result = ChatResult(text=None, finish_reason=None, prompt_tokens=tokens, completion_tokens=0, cached_tokens=0,
                        model=None, response_id=None, latency_s=0.0,
                        embedding=vectors[0] if len(vectors) == 1 else None,
                        embeddings=tuple(vectors) if len(vectors) > 1 else None)
    return Chat(result, tokens)


def _estimated_tokens(response: httpx.Response) -> int:
    """Our estimate of the texts the answered request sent (an answer with no ``usageMetadata``)."""
    try:
        sent = json.loads(response.request.content)
    except (RuntimeError, ValueError):  # no request kept with the response, or a body that is not JSON
        return 0
    requests = sent.get("requests") if isinstance(sent, Mapping) else None
    total = 0
    for item in requests if isinstance(requests, list) else ():
        parts = ((item.get("content") or {}).get("parts") or ()) if isinstance(item, Mapping) else ()
        total += sum(estimate_text_tokens(part["text"]) for part in parts
                     if isinstance(part, Mapping) and isinstance(part.get("text"), str))
    return total
