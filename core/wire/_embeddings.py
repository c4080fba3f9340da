"""OpenAI's embeddings endpoint: a prompt's text as a request body, and an answer's vector as float32 bytes.

A prompt to ``embeddings`` holds one text (its one user message, given as ``prompt`` or ``input``); a packed request
(``_packing``) holds several, one user message each, sent as ``input``'s list. A vector is
kept as the float32 little-endian bytes the API's ``base64`` encoding carries (4 bytes a dimension, never JSON
text of floats); the request asks for ``base64`` unless the prompt names an ``encoding_format`` itself, as
openai-python does. Wire format: openai-python ``types/embedding_create_params.py``, ``create_embedding_response.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from ._packing import embedding_text
from ._responses import Chat, count as _count, parse_answer
from .._types import ChatRequest, ChatResult
from ._vectors import vector_bytes

__all__ = [
    "EMBEDDING_PARAMS",
    "embedding_param_problem",
    "embedding_text",
    "embeddings_body",
    "embedding_result_from_body",
    "parse_embedding",
]

# What an embeddings request takes besides model and input (openai-python's EmbeddingCreateParams).
EMBEDDING_PARAMS = frozenset({"dimensions", "encoding_format", "user"})
_ENCODINGS = ("float", "base64")


def embedding_param_problem(name: str, value: Any) -> str | None:
    """Why ``name: value`` cannot go in an embeddings request (one line), or None."""
    if name not in EMBEDDING_PARAMS:
        return f"the embeddings endpoint takes {', '.join(sorted(EMBEDDING_PARAMS))}; remove {name}"
    if name == "dimensions" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        return f"dimensions must be a positive integer, not {value!r}"
    if name == "encoding_format" and value not in _ENCODINGS:
        return f"encoding_format must be float or base64, not {value!r}"
    return None


def embeddings_body(request: ChatRequest) -> dict[str, Any]:
    """The ``/embeddings`` body (real-time and batch lines alike): one text as ``input``, a packed request's texts
    as its list."""
    text = embedding_text(request.messages)
    given: str | list[str] | None = text
    if text is None and len(request.messages) > 1:
        texts = [embedding_text([message]) for message in request.messages]
        known = [text for text in texts if text is not None]
        given = known if len(known) == len(texts) else None
    if given is None:
        raise ValueError("an embeddings prompt holds one text: give it as 'prompt' or 'input'")
    return {"encoding_format": "base64", **request.params, "model": request.model, "input": given}


def _embedding_from_body(body: Any) -> Chat | None:
    """The vectors (in input order) and usage of an embeddings list body, or None when it holds no vector or one
    that cannot be read."""
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list) or not data or not all(isinstance(item, Mapping) for item in data):
        return None
    if len(data) > 1 and all(isinstance(item.get("index"), int) for item in data):
        data = sorted(data, key=lambda item: item["index"])
    vectors = [vector_bytes(item.get("embedding")) for item in data]
    if None in vectors:
        return None
    assert isinstance(body, Mapping)
    usage = body.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    prompt_tokens = _count(usage.get("prompt_tokens"))
    return Chat(_result(vectors, body, prompt_tokens),  # type: ignore[arg-type]
                _count(usage.get("total_tokens")) or prompt_tokens)


def _result(vectors: list[bytes], body: Mapping[str, Any], prompt_tokens: int) -> ChatResult:
    model = body.get("model")
    return ChatResult(text=None, finish_reason=None, prompt_tokens=prompt_tokens, completion_tokens=0, cached_tokens=0,
                      model=model if isinstance(model, str) else None, response_id=None, latency_s=0.0,
                      embedding=vectors[0] if len(vectors) == 1 else None,
                      embeddings=tuple(vectors) if len(vectors) > 1 else None)


def parse_embedding(response: httpx.Response) -> Chat:
    return parse_answer(response, _embedding_from_body, what="no readable data[].embedding")


def embedding_result_from_body(body: Any) -> ChatResult | None:
    """A batch output line's embeddings body as a result (a packed line's vectors in ``embeddings``), or None when it
    holds no vector."""
    chat = _embedding_from_body(body)
    return None if chat is None else chat.result
