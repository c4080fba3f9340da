"""OpenAI's embeddings endpoint: a prompt's text as a request body, and an answer's vector as float32 bytes.

A prompt to ``embeddings`` holds one text (its one user message, given as ``prompt`` or ``input``). Its vector is
kept as the float32 little-endian bytes the API's ``base64`` encoding carries (4 bytes a dimension, never JSON
text of floats); the request asks for ``base64`` unless the prompt names an ``encoding_format`` itself, as
openai-python does. Wire format: openai-python ``types/embedding_create_params.py``, ``create_embedding_response.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from ._responses import Chat, count as _count, parse_answer
from ._types import ChatRequest, ChatResult
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


def embedding_text(messages: list[dict[str, Any]]) -> str | None:
    """The one text an embeddings prompt holds (its single user message's string content), or None."""
    if len(messages) != 1 or messages[0].get("role") != "user":
        return None
    content = messages[0].get("content")
    return content if isinstance(content, str) and content else None


def embeddings_body(request: ChatRequest) -> dict[str, Any]:
    """The ``/embeddings`` body (real-time and batch lines alike)."""
    text = embedding_text(request.messages)
    if text is None:
        raise ValueError("an embeddings prompt holds one text: give it as 'prompt' or 'input'")
    return {"encoding_format": "base64", **request.params, "model": request.model, "input": text}


def _embedding_from_body(body: Any) -> Chat | None:
    """The vector and usage of an embeddings list body, or None when it holds no ``data[0].embedding``."""
    data = body.get("data") if isinstance(body, Mapping) else None
    first = data[0] if isinstance(data, list) and data else None
    vector = vector_bytes(first.get("embedding")) if isinstance(first, Mapping) else None
    usage = body.get("usage") if isinstance(body, Mapping) else None
    usage = usage if isinstance(usage, Mapping) else {}
    prompt_tokens = _count(usage.get("prompt_tokens"))
    if vector is None:
        return None
    assert isinstance(body, Mapping)
    return Chat(_result(vector, body, prompt_tokens), _count(usage.get("total_tokens")) or prompt_tokens)


def _result(vector: bytes | None, body: Mapping[str, Any], prompt_tokens: int) -> ChatResult:
    model = body.get("model")
    return ChatResult(text=None, finish_reason=None, prompt_tokens=prompt_tokens, completion_tokens=0, cached_tokens=0,
                      model=model if isinstance(model, str) else None, response_id=None, latency_s=0.0,
                      embedding=vector)


def parse_embedding(response: httpx.Response) -> Chat:
    return parse_answer(response, _embedding_from_body, what="no data[0].embedding")


def embedding_result_from_body(body: Any) -> ChatResult | None:
    """A batch output line's embeddings body as a result, or None when it holds no vector."""
    chat = _embedding_from_body(body)
    return None if chat is None else chat.result
