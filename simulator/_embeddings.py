"""The simulator's ``/v1/embeddings``: OpenAI's body checks and answers, with the chat route's faults and quotas.

A vector is a function of its text, model and dimensions alone (not the seed), so a test can work out what it
must be (``embedding_vector``): unit length, float32, ``DEFAULT_DIMENSIONS`` unless the request asks for fewer.
Inputs may be a string or a list of strings (one vector each, in order); ``[[sim:FAULT]]`` markers in an input
work as in a chat message. Batch lines to ``/v1/embeddings`` get the same answer (``embeddings_answer``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import struct
from typing import Any

from aiohttp import web

from ._chat import _ChatRoutes
from ._checks import invalid_request, missing_model_or
from ._state import SimState
from ._tokens import count_tokens

__all__ = ["DEFAULT_DIMENSIONS", "EMBEDDINGS_PATH", "embedding_vector", "embeddings_answer", "embeddings_problem",
           "register"]

EMBEDDINGS_PATH = "/v1/embeddings"
# text-embedding-3-small's length; 3-large's is 3072 (asked with dimensions where a test wants it).
DEFAULT_DIMENSIONS = 1536
# OpenAI's per-request limits (its API reference, as openai-python's EmbeddingCreateParams carries it): inputs per
# request, tokens per input, tokens summed over a request's inputs.
MAX_INPUTS = 2048
MAX_INPUT_TOKENS = 8192
MAX_REQUEST_TOKENS = 300_000


def register(app: web.Application, state: SimState) -> None:
    app.router.add_post(EMBEDDINGS_PATH, _EmbeddingRoutes(state).handle)


def embedding_vector(text: str, *, model: str, dimensions: int = DEFAULT_DIMENSIONS) -> list[float]:
    """The vector the simulator answers for ``text``: float32 values of unit length, from its hash."""
    return list(struct.unpack(f"<{dimensions}f", _vector_bytes(text, model=model, dimensions=dimensions)))


def _vector_bytes(text: str, *, model: str, dimensions: int) -> bytes:
    """``embedding_vector`` as float32 little-endian bytes (what a base64 answer carries): every value is
    1/sqrt(dimensions), its sign a bit of the hash of model and text. Made by integer operations over the whole
    vector, no loop per value: a simulator answering millions of texts stays cheaper than the client it serves."""
    magnitudes, signs = _masks(dimensions)
    bits = int.from_bytes(hashlib.shake_256(f"{model}\x00{text}".encode()).digest(4 * dimensions), "little")
    return ((bits & signs) | magnitudes).to_bytes(4 * dimensions, "little")


@functools.lru_cache(maxsize=64)
def _masks(dimensions: int) -> tuple[int, int]:
    """(every float32 of the vector at 1/sqrt(dimensions), every float32's sign bit), as integers."""
    magnitude = struct.pack("<f", 1 / math.sqrt(dimensions))
    return int.from_bytes(magnitude * dimensions, "little"), int.from_bytes(b"\0\0\0\x80" * dimensions, "little")


def _inputs(body: dict[str, Any]) -> list[str]:
    given = body["input"]
    return [given] if isinstance(given, str) else list(given)


def embeddings_problem(body: Any) -> tuple[str, str | None, str | None] | None:
    """(message, param, code) of the first thing OpenAI would refuse in an embeddings body, or None."""
    if not isinstance(body, dict):
        return "Invalid type for body: expected an object.", None, "invalid_type"
    missing = missing_model_or(body, "input")
    if missing is not None:
        return missing
    given = body["input"]
    inputs = [given] if isinstance(given, str) else given
    if not isinstance(inputs, list) or not inputs or not all(isinstance(text, str) for text in inputs):
        return "'input' must be a non-empty string or array of strings.", "input", "invalid_type"
    if len(inputs) > MAX_INPUTS:
        return f"'input' holds {len(inputs)} items; at most {MAX_INPUTS} are allowed.", "input", "invalid_value"
    total = 0
    for text in inputs:
        if not text:
            return "'$.input' is invalid: an input cannot be an empty string.", "input", "invalid_value"
        tokens = count_tokens(text)
        if tokens > MAX_INPUT_TOKENS:
            return (f"This model's maximum context length is {MAX_INPUT_TOKENS} tokens, however you requested "
                    f"{tokens} tokens in the input.", "input", "context_length_exceeded")
        total += tokens
    if total > MAX_REQUEST_TOKENS:
        return (f"Requested {total} tokens, max {MAX_REQUEST_TOKENS} tokens per request.", "input",
                "max_tokens_per_request")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or not 1 <= dimensions <= 3072):
        return f"Invalid 'dimensions': {dimensions!r}.", "dimensions", "invalid_value"
    if body.get("encoding_format", "float") not in ("float", "base64"):
        return "Invalid 'encoding_format': use float or base64.", "encoding_format", "invalid_value"
    extra = sorted(set(body) - {"model", "input", "dimensions", "encoding_format", "user"})
    if extra:
        return f"Unrecognized request argument supplied: {extra[0]}", extra[0], "unknown_parameter"
    return None


def embeddings_answer(body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The list body OpenAI answers for a valid embeddings request, and its prompt tokens."""
    model: str = body["model"]
    dimensions = body.get("dimensions") or DEFAULT_DIMENSIONS
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    tokens = 0
    for index, text in enumerate(_inputs(body)):
        tokens += count_tokens(text)
        raw = _vector_bytes(text, model=model, dimensions=dimensions)
        value: Any = (base64.b64encode(raw).decode() if as_base64
                      else list(struct.unpack(f"<{dimensions}f", raw)))
        data.append({"object": "embedding", "index": index, "embedding": value})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, tokens


class _EmbeddingRoutes(_ChatRoutes):
    """Chat's route with an embeddings body: the same faults, quotas, latency and stats."""

    def _invalid_body(self, body: Any, request: web.Request) -> web.Response | None:
        problem = embeddings_problem(body)
        if problem is None:
            # Markers are looked for in messages: an input is one user message for that purpose.
            body["messages"] = [{"role": "user", "content": text} for text in _inputs(body)]
            return None
        message, param, code = problem
        return invalid_request(message, param=param, code=code)

    async def _answer_valid(
        self, request: web.Request, *, body: dict[str, Any], model: str, digest: bytes, kind: str | None = None
    ) -> web.StreamResponse:
        body = {name: value for name, value in body.items() if name != "messages"}
        answer, tokens = embeddings_answer(body)
        state = self._state

        def render() -> bytes:
            state.stats.count("embeddings")
            state.stats.embedding_inputs += len(answer["data"])
            state.stats.prompt_tokens += tokens
            return json.dumps(answer).encode()

        return await self._answer_admitted(request, model=model, charge=tokens, output_tokens=0, render=render)
