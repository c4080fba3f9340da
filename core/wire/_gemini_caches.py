"""Gemini's explicit context caches (``cachedContents``) on the wire, as google-genai's ``caches.py`` sends them to
the Gemini Developer API (``_CreateCachedContentParameters_to_mldev``, ``_CreateCachedContentConfig_to_mldev``,
``_UpdateCachedContentConfig_to_mldev``, ``_ListCachedContentsResponse_from_mldev``; ``t_caches_model``,
``t_cached_content_name``):

    POST   /v1beta/cachedContents          {"model": "models/M", "contents", "systemInstruction", "tools",
                                            "toolConfig", "ttl": "3600s", "displayName"}   -> a CachedContent
    GET    /v1beta/{name}                  a CachedContent (name is ``cachedContents/ID``)
    PATCH  /v1beta/{name}                  {"ttl": "...s"} (or "expireTime")               -> a CachedContent
    DELETE /v1beta/{name}                  an empty answer
    GET    /v1beta/cachedContents?pageSize=&pageToken=   {"cachedContents", "nextPageToken"}

A CachedContent answers ``name``, ``displayName``, ``model``, ``createTime``, ``updateTime``, ``expireTime`` and
``usageMetadata.totalTokenCount``. A request reads one by ``cachedContent`` (``_GenerateContentConfig_to_mldev``:
``cachedContent`` beside ``contents``), and then carries only what follows the cached part: the cached contents,
``systemInstruction``, ``tools`` and ``toolConfig`` are the cache's, and a request repeating them is refused. A Batch
Mode request is a generateContent body (``batches.py``'s ``_InlinedRequest_to_mldev`` writes the same config), so a
batch line names a cache the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from .._batch_types import int_field, rfc3339_field
from .._exceptions import APIResponseValidationError
from .._types import ChatRequest
from ._gemini import GEMINI_API_VERSION, gemini_body

__all__ = ["CACHE_PARAMS", "GEMINI_CACHES_PATH", "CachedContent", "cache_display_name", "cached_content_body",
           "can_reference",
           "parse_cached_content", "parse_cached_content_page", "referencing_cache", "ttl_text"]

GEMINI_CACHES_PATH: Final = f"/{GEMINI_API_VERSION}/cachedContents"
# The request parameters whose translation the cache holds (tools -> tools, tool_choice -> toolConfig).
CACHE_PARAMS: Final = ("tools", "tool_choice")
# The parts of a generateContent body a cached content holds.
_CACHED_FIELDS: Final = ("contents", "systemInstruction", "tools", "toolConfig")


@dataclass(frozen=True, slots=True)
class CachedContent:
    """A CachedContent as the API answers it; ``tokens`` is its ``usageMetadata.totalTokenCount``."""

    name: str
    display_name: str | None = None
    model: str | None = None
    expire_time: datetime | None = None
    tokens: int = 0


def cache_display_name(*, job_id: str, group_key: str) -> str:
    """The displayName a cache of ours carries: how a create whose answer was lost is found again."""
    return f"llm-dispatch:{job_id}:{group_key}"


def ttl_text(seconds: float) -> str:
    """A TTL as the API's Duration text (whole seconds, ``"3900s"``)."""
    return f"{max(1, round(seconds))}s"


def cached_content_body(prefix: ChatRequest, *, ttl_s: float, display_name: str) -> dict[str, Any]:
    """The create's body for the shared prefix ``prefix`` (a group's leading messages and its tools): what its
    generateContent body would hold, under the model's resource name."""
    body = gemini_body(replace(prefix, params={name: prefix.params[name] for name in CACHE_PARAMS
                                               if prefix.params.get(name) is not None}))
    model = prefix.model.rpartition("/")[2]
    created: dict[str, Any] = {"model": f"models/{model}"}
    created.update({name: body[name] for name in _CACHED_FIELDS if body.get(name)})
    created["ttl"] = ttl_text(ttl_s)
    created["displayName"] = display_name
    return created


def can_reference(request: ChatRequest, *, prefix_messages: int) -> bool:
    """Whether ``request`` can go naming a cache of its first ``prefix_messages`` messages: what follows them is user
    turns alone (a tool result names its function from a call the cache would hold, which the translation could not
    see)."""
    rest = request.messages[prefix_messages:]
    return bool(rest) and all(message.get("role") == "user" for message in rest)


def referencing_cache(request: ChatRequest, *, name: str, prefix_messages: int) -> ChatRequest:
    """``request`` as it goes with the cache ``name`` holding its first ``prefix_messages`` messages and its tools:
    only the rest of its messages, no tools, and ``cachedContent``."""
    params = {key: value for key, value in request.params.items() if key not in CACHE_PARAMS}
    params["cachedContent"] = name
    return replace(request, messages=request.messages[prefix_messages:], params=params)


def parse_cached_content(data: Any) -> CachedContent:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise APIResponseValidationError(f"a cachedContents answer without a name: {str(data)[:200]}")
    usage = data.get("usageMetadata")
    usage = usage if isinstance(usage, dict) else {}
    return CachedContent(name=data["name"], display_name=data.get("displayName"), model=data.get("model"),
                         expire_time=rfc3339_field(data, "expireTime", "cachedContent"),
                         tokens=int_field(usage, "totalTokenCount", "cachedContent usageMetadata"))


def parse_cached_content_page(data: Any) -> tuple[list[CachedContent], str | None]:
    """A page of the list: its caches and the next page's token (None: the last page)."""
    items = data.get("cachedContents") if isinstance(data, dict) else None
    token = data.get("nextPageToken") if isinstance(data, dict) else None
    return [parse_cached_content(item) for item in items or ()], token or None
