"""Many embeddings texts in one request: which requests may share one, how many fit, and each text's share of the
answer (its vector, and its part of the usage the API reports for the whole request).

A packed request is a ``ChatRequest`` to ``embeddings`` whose messages are its texts, one user message each, in
order; its body's ``input`` is their list (``_embeddings.embeddings_body``). Only requests identical but for their
text share one: same model, same parameters (``dimensions``, ``encoding_format``, ``user``).

OpenAI's limits per request (the API reference's ``input`` field; OpenAI's pages were not in our search index, so the
text is read from OpenAI's own SDK, generated from its API spec: openai-python ``types/embedding_create_params.py``
at e43b422, the same words as Microsoft's Azure copy of the reference): "any array must be 2048 dimensions or less"
and "all embedding models enforce a maximum of 300,000 tokens summed across all inputs in a single request".

Gemini's (``batchEmbedContents``): 100 texts a request. The REST reference names no figure; the API refuses more
with a 400 "BatchEmbedContentsRequest.requests: at most 100 requests can be in one batch" (quoted in
langchain-ai/langchainjs#4491; Vercel's AI SDK, vercel/ai#16575, and Weaviate, weaviate/weaviate#11277, cap their
Gemini requests at 100 for it). No cap on tokens summed over a request is documented, only each text's (2,048 for
gemini-embedding-001, 8,192 for gemini-embedding-2: the catalog's ``context_window``), so the token cap is set where
100 texts of the larger limit fit, and the 100 texts bind first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from .._exceptions import APIResponseValidationError
from .._json import canonical_json
from ..pricing._tokens import estimate_text_tokens
from .._types import ChatRequest, ChatResult

__all__ = [
    "EMBEDDING_PACK_LIMITS",
    "GEMINI_EMBEDDING_PACK_LIMITS",
    "MAX_EMBEDDING_INPUTS",
    "MAX_EMBEDDING_REQUEST_TOKENS",
    "Pack",
    "PackLimits",
    "Packer",
    "PackLimitsFor",
    "embedding_text",
    "member_id",
    "pack_key",
    "packed_request",
    "split_member_id",
    "token_shares",
    "unpack_embeddings",
]

MAX_EMBEDDING_INPUTS: Final = 2048
MAX_EMBEDDING_REQUEST_TOKENS: Final = 300_000
# Our token count is an estimate (``_tokens``: a text's may be tens of percent low, a request's sum a few): a
# request is filled to this share of the cap, so that an estimate that runs low still stays under it.
_TOKEN_HEADROOM: Final = 0.75


@dataclass(frozen=True, slots=True, kw_only=True)
class PackLimits:
    """How much one packed request may hold: texts, and estimated tokens summed over them."""

    max_inputs: int = MAX_EMBEDDING_INPUTS
    max_tokens: int = MAX_EMBEDDING_REQUEST_TOKENS

    def __post_init__(self) -> None:
        if self.max_inputs < 1 or self.max_tokens < 1:
            raise ValueError(f"pack limits must be positive, got max_inputs={self.max_inputs}, "
                             f"max_tokens={self.max_tokens}")

    @property
    def token_budget(self) -> int:
        """The estimated tokens a request is filled to (a text larger than that goes alone)."""
        return max(1, int(self.max_tokens * _TOKEN_HEADROOM))

    def spread(self, total: int) -> PackLimits:
        """Limits whose full requests fill ``total`` inputs evenly (a batch's cap on inputs: 50,000 in 25 lines
        of 2,000, not 24 of 2,048 and a line left over for the next batch)."""
        lines = math.ceil(total / self.max_inputs)
        return PackLimits(max_inputs=max(1, total // lines), max_tokens=self.max_tokens)

    def within(self, other: PackLimits) -> PackLimits:
        """The tighter of two limits, each figure on its own (a caller's cap within a provider's)."""
        return PackLimits(max_inputs=min(self.max_inputs, other.max_inputs),
                          max_tokens=min(self.max_tokens, other.max_tokens))


EMBEDDING_PACK_LIMITS: Final = PackLimits()
GEMINI_EMBEDDING_PACK_LIMITS: Final = PackLimits(max_inputs=100, max_tokens=100 * 8192)
# The limits of the request a text opens a pack with: its provider's (``Wire.pack_limits``), or one figure for all.
PackLimitsFor = Callable[[ChatRequest], PackLimits]

_T = TypeVar("_T")


def embedding_text(messages: list[dict[str, Any]]) -> str | None:
    """The one text an embeddings prompt holds (its single user message's string content), or None."""
    if len(messages) != 1 or messages[0].get("role") != "user":
        return None
    content = messages[0].get("content")
    return content if isinstance(content, str) and content else None


def pack_key(request: ChatRequest) -> str | None:
    """What requests that may share one packed request have in common; None for one that is never packed (any
    endpoint but embeddings)."""
    if request.endpoint != "embeddings" or embedding_text(request.messages) is None:
        return None
    return f"{request.model}\x00{canonical_json(request.params)}"


def packed_request(requests: Sequence[ChatRequest]) -> ChatRequest:
    """One request for the texts of ``requests`` (which share a ``pack_key``), in their order."""
    first = requests[0]
    return ChatRequest(model=first.model, params=first.params, endpoint=first.endpoint,
                       messages=[message for request in requests for message in request.messages])


@dataclass(slots=True)
class Pack(Generic[_T]):
    """Members packed together (a caller's values: work items, batch groups), their requests, estimated tokens."""

    key: str
    limits: PackLimits = EMBEDDING_PACK_LIMITS
    members: list[_T] = field(default_factory=list)
    requests: list[ChatRequest] = field(default_factory=list)
    tokens: int = 0

    def request(self) -> ChatRequest:
        return packed_request(self.requests)


class Packer(Generic[_T]):
    """Fills packs, one open per ``pack_key``: ``add`` returns the pack it closed when the next text would not
    fit, ``close`` the packs still open (in the order they were opened). ``limits``: one for every pack, or each
    pack's from the request that opens it (the requests of one key go to one model, so to one provider)."""

    def __init__(self, *, limits: PackLimits | PackLimitsFor = EMBEDDING_PACK_LIMITS) -> None:
        self._limits_for: PackLimitsFor = (lambda _request: limits) if isinstance(limits, PackLimits) else limits
        self._open: dict[str, Pack[_T]] = {}

    def add(self, key: str, member: _T, request: ChatRequest) -> Pack[_T] | None:
        tokens = estimate_text_tokens(embedding_text(request.messages) or "")
        pack = self._open.get(key)
        closed = None
        if pack is not None and (len(pack.members) >= pack.limits.max_inputs
                                 or pack.tokens + tokens > pack.limits.token_budget):
            closed = self._open.pop(key)
            pack = None
        if pack is None:
            pack = self._open[key] = Pack(key, self._limits_for(request))
        pack.members.append(member)
        pack.requests.append(request)
        pack.tokens += tokens
        return closed

    def close(self) -> list[Pack[_T]]:
        packs, self._open = list(self._open.values()), {}
        return packs


def token_shares(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, in whole tokens that sum to it exactly (the largest remainders
    get the odd tokens; ties to the earlier)."""
    if not weights:
        return []
    whole = sum(weights)
    if whole <= 0:
        weights, whole = [1] * len(weights), len(weights)
    exact = [total * weight for weight in weights]
    shares = [part // whole for part in exact]
    left = total - sum(shares)
    for index in sorted(range(len(weights)), key=lambda i: -(exact[i] % whole))[:left]:
        shares[index] += 1
    return shares


def unpack_embeddings(result: ChatResult, texts: Sequence[str]) -> list[ChatResult]:
    """A packed request's answer as one result per text, in order: the text's vector, and its share of the usage
    the API reports for the whole request, in proportion to each text's estimated tokens (``token_shares``); the
    call's latency, attempts and whether it may have been billed are every text's. An answer with a vector count
    other than the texts' raises ``APIResponseValidationError`` (answered, so billed: never sent again)."""
    vectors = result.embeddings if result.embeddings is not None else (
        (result.embedding,) if result.embedding is not None else ())
    if len(vectors) != len(texts):
        error = APIResponseValidationError(
            f"the answer holds {len(vectors)} vectors for the {len(texts)} texts sent together; it was billed, so "
            "they are not sent again: --retry-failed all would")
        error.usage = result
        raise error
    shares = token_shares(result.prompt_tokens, [estimate_text_tokens(text) for text in texts])
    return [ChatResult(text=None, finish_reason=None, prompt_tokens=share, completion_tokens=0, cached_tokens=0,
                       model=result.model, response_id=result.response_id, latency_s=result.latency_s,
                       attempts=result.attempts, maybe_billed=result.maybe_billed, embedding=vector)
            for share, vector in zip(shares, vectors)]


# A packed batch line's members are named after the line: ``p12.3`` is input 3 of line ``p12``.
_MEMBER_SEPARATOR: Final = "."


def member_id(line: str, index: int) -> str:
    """The name a batch's records give input ``index`` of packed line ``line`` (the line's ``custom_id``)."""
    return f"{line}{_MEMBER_SEPARATOR}{index}"


def split_member_id(member: str) -> tuple[str, int]:
    """(the line's custom_id, the input's index in it) of a member name; a line that was not packed is its own
    member, input 0."""
    line, separator, index = member.rpartition(_MEMBER_SEPARATOR)
    if not separator or not index.isdigit():
        return member, 0
    return line, int(index)

